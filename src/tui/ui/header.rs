//! The two header lines: what the run is, how far it got, what it spent, where fast_p stands.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{duration, percent, thousands};
use crate::tui::app::{App, Mode};

pub fn draw(frame: &mut Frame, area: Rect, app: &App, now_ms: u64) {
    let v = &app.view;
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let dim = Style::new().fg(Color::DarkGray);
    let sep = || Span::styled(" │ ", dim);
    // What matters most comes first: narrow terminals cut the end of the line.
    let mut first = vec![Span::styled(" krefine ", bold.fg(Color::Cyan))];
    match &v.info {
        Some(i) => first.push(Span::styled(i.run.clone(), bold)),
        None => first.push(Span::styled("waiting for the run to start…", dim)),
    }
    first.push(sep());
    first.push(state_span(app));
    first.push(sep());
    first.push(Span::raw(format!(
        "elapsed {}",
        duration(v.elapsed_ms(now_ms))
    )));
    if let Some(i) = &v.info {
        first.push(sep());
        let shape = match i.method {
            crate::types::MethodKind::Refine => {
                format!("refine {} · {} turns", i.feedback, i.turns)
            }
            crate::types::MethodKind::Sampling => format!("sampling k={}", i.samples),
            crate::types::MethodKind::OneShot => "one_shot".to_string(),
        };
        first.push(Span::raw(shape));
        if i.simulated {
            first.push(Span::styled(" SIMULATED", Style::new().fg(Color::Magenta)));
        }
        first.push(sep());
        let model = app
            .meta
            .model
            .clone()
            .or_else(|| v.model.clone())
            .unwrap_or_else(|| "?".into());
        first.push(Span::raw(format!("model {model}")));
    }

    let mut second = vec![Span::raw(" ")];
    second.push(Span::raw(format!("tokens {}", thousands(v.spend.tokens()))));
    second.push(sep());
    second.push(Span::raw(if v.spend.priced() {
        format!("USD {:.4}", v.spend.cost_usd)
    } else {
        "USD -".to_string()
    }));
    second.push(sep());
    let cur = v.current().unwrap_or_default();
    second.push(Span::raw("fast_p"));
    for (label, p) in [("0", 0.0), ("1", 1.0), ("1.5", 1.5), ("2", 2.0)] {
        second.push(Span::raw(format!(
            " {label}:{}",
            percent(cur.fast_p.get(p).unwrap_or(0.0))
        )));
    }
    second.push(sep());
    let (ok, bad) = v.verdict_tally();
    second.push(Span::raw(format!(
        "turns {}/{} ({ok} correct, {bad} failed)",
        v.finished_turns(),
        v.planned_turns()
    )));
    frame.render_widget(
        Paragraph::new(vec![Line::from(first), Line::from(second)]),
        area,
    );
}

fn state_span(app: &App) -> Span<'static> {
    let v = &app.view;
    if let Some(r) = &app.replay {
        let icon = if r.paused { "paused" } else { "playing" };
        return Span::styled(
            format!(
                "replay {icon} {}x · {}/{} events",
                speed(r.speed),
                r.played,
                r.total
            ),
            Style::new().fg(Color::Yellow),
        );
    }
    match (&v.ended, app.mode) {
        (Some(reason), _) if reason.is_finished() => {
            Span::styled("finished", Style::new().fg(Color::Green))
        }
        (Some(reason), _) => Span::styled(format!("ended: {reason}"), Style::new().fg(Color::Red)),
        (None, Mode::Live) if app.stopping => {
            Span::styled("stopping…", Style::new().fg(Color::Yellow))
        }
        (None, Mode::Live) if app.closed => Span::styled("stopped", Style::new().fg(Color::Red)),
        (None, Mode::Watch) => Span::styled("watching", Style::new().fg(Color::Cyan)),
        (None, _) => Span::styled("running", Style::new().fg(Color::Cyan)),
    }
}

/// `2`, `0.5`, `1000`.
pub(crate) fn speed(s: f64) -> String {
    if s.fract() == 0.0 && s < 1e9 {
        format!("{}", s as u64)
    } else {
        format!("{s:.2}")
    }
}
