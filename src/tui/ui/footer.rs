//! The key line at the bottom, and the `?` help over everything.

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use crate::tui::app::{App, Mode, Screen};

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let key = |k: &str| {
        Span::styled(
            format!(" {k} "),
            Style::new().fg(Color::Black).bg(Color::Gray),
        )
    };
    let label = |l: &str| Span::raw(format!(" {l}  "));
    let mut spans = Vec::new();
    if let Some(w) = &app.warning {
        spans.push(Span::styled(format!(" {w} "), Style::new().fg(Color::Red)));
        frame.render_widget(Paragraph::new(Line::from(spans)), area);
        return;
    }
    if app.mode == Mode::Replay {
        let paused = app.replay.is_some_and(|r| r.paused);
        spans.extend([key("␣"), label(if paused { "play" } else { "pause" })]);
        spans.extend([key("n"), label("step"), key("t"), label("next turn")]);
        spans.extend([key("E"), label("end"), key("+/-"), label("speed")]);
    }
    match &app.screen {
        Screen::Tasks => {
            spans.extend([key("↑↓"), label("move"), key("⏎"), label("open")]);
            spans.extend([key("s"), label("sort"), key("f"), label("filter")]);
        }
        Screen::Detail(_) => {
            spans.extend([key("↑↓"), label("scroll"), key("←→"), label("turn")]);
            spans.extend([key("q"), label("back")]);
        }
    }
    spans.extend([key("?"), label("help")]);
    if matches!(app.screen, Screen::Tasks) {
        let quit = if app.mode == Mode::Live && !app.run_over() {
            if app.stopping {
                "force quit"
            } else {
                "stop run"
            }
        } else {
            "quit"
        };
        spans.extend([key("q"), label(quit)]);
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Every key, by screen.
pub fn help_lines(app: &App) -> Vec<Line<'static>> {
    let mut l: Vec<(&str, &str)> = vec![
        ("Task table", ""),
        ("↑ ↓ j k", "move the selection (PgUp PgDn, Home End g G)"),
        ("Enter", "open the task's detail"),
        ("s / r", "cycle the sort key / reverse the order"),
        ("f", "cycle the filter: all, failing, running, done"),
        ("v", "cycle the verdict filter (latest verdict)"),
        ("L", "cycle the level filter"),
        ("", ""),
        ("Task detail", ""),
        ("↑ ↓ PgUp PgDn", "scroll (Space pages down)"),
        ("← → h l Tab", "previous / next turn; 1-9 a turn"),
        ("p", "show the whole prompt / only its start"),
        ("End G", "scroll to the end"),
        ("q Esc", "back to the table"),
    ];
    if app.mode == Mode::Replay {
        l.extend([
            ("", ""),
            ("Replay", ""),
            ("Space", "play / pause"),
            ("n .", "step to the next event"),
            ("t", "jump to the end of the next turn (any task)"),
            ("T", "jump to the end of the selected task's next turn"),
            ("1-9", "jump until the selected task finished turn N"),
            ("E", "jump to the end"),
            ("+ -", "double / halve the speed"),
        ]);
    }
    let quit = match app.mode {
        Mode::Live => "stop the run (it logs run_ended); again: leave at once",
        Mode::Watch | Mode::Replay => "quit",
    };
    l.extend([
        ("", ""),
        ("q Ctrl-C", quit),
        ("?", "this help (any key closes it)"),
    ]);
    l.into_iter()
        .map(|(k, d)| {
            if d.is_empty() {
                Line::styled(k.to_string(), Style::new().fg(Color::Cyan))
            } else {
                Line::from(vec![
                    Span::styled(format!("  {k:<15}"), Style::new().fg(Color::Yellow)),
                    Span::raw(d.to_string()),
                ])
            }
        })
        .collect()
}

pub fn draw_help(frame: &mut Frame, area: Rect, app: &App) {
    let lines = help_lines(app);
    let h = (lines.len() as u16 + 2).min(area.height);
    let w = 80.min(area.width);
    let [v] = Layout::vertical([Constraint::Length(h)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(w)])
        .flex(Flex::Center)
        .areas(v);
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Keys ")),
        popup,
    );
}
