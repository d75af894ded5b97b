//! Drawing: one function per panel, each a pure function of [`App`] and the clock it is given.
//! Nothing here reads a clock, a file or the terminal size on its own.

mod chart;
mod detail;
mod footer;
mod header;
mod resources;
mod tasks;

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use super::app::{App, Screen};

/// The smallest terminal the screens are laid out for.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 15;

/// Draw the whole screen at time `now_ms` (unix ms; the replay's recorded time during a replay).
pub fn draw(frame: &mut Frame, app: &App, now_ms: u64) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        too_small(frame, area);
        return;
    }
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    header::draw(frame, head, app, now_ms);
    match &app.screen {
        Screen::Tasks => {
            // Wide terminals put resources and chart beside the table, narrow ones below it.
            let wide = body.width >= 110;
            let (table, side) = if wide {
                let [a, b] =
                    Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
                        .areas(body);
                (a, b)
            } else {
                let [a, b] =
                    Layout::vertical([Constraint::Percentage(55), Constraint::Percentage(45)])
                        .areas(body);
                (a, b)
            };
            tasks::draw(frame, table, app);
            let res_height = resources::height(app).min(side.height / 2 + 1);
            let [res, chart] =
                Layout::vertical([Constraint::Length(res_height), Constraint::Min(0)]).areas(side);
            resources::draw(frame, res, app, now_ms);
            chart::draw(frame, chart, app);
        }
        Screen::Detail(d) => detail::draw(frame, body, app, d),
    }
    footer::draw(frame, foot, app);
    if app.help {
        footer::draw_help(frame, area, app);
    }
}

fn too_small(frame: &mut Frame, area: Rect) {
    let text = vec![
        Line::from(format!(
            "terminal too small: {}x{}",
            area.width, area.height
        )),
        Line::from(format!("krefine needs at least {MIN_WIDTH}x{MIN_HEIGHT}")),
        Line::from("q quits"),
    ];
    let [mid] = Layout::vertical([Constraint::Length(3)])
        .flex(Flex::Center)
        .areas(area);
    frame.render_widget(
        Paragraph::new(text)
            .style(Style::new().fg(Color::Yellow))
            .centered(),
        mid,
    );
}

/// `1:02:03` or `02:03`.
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m:02}:{s:02}")
    }
}

/// `12,345,678`.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

pub(crate) fn verdict_style(v: Option<crate::types::Verdict>) -> Style {
    match v {
        Some(crate::types::Verdict::Correct) => Style::new().fg(Color::Green),
        Some(_) => Style::new().fg(Color::Red),
        None => Style::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn number_formats() {
        assert_eq!(super::duration(3_723_000), "1:02:03");
        assert_eq!(super::duration(59_999), "00:59");
        assert_eq!(super::thousands(1_234_567), "1,234,567");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::percent(0.5), "50.0%");
    }
}
