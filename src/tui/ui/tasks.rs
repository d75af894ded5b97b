//! The task table: one row a task, with its problem, stage, turn, latest verdict and best speedup.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Row, Table, TableState};

use super::verdict_style;
use crate::tui::app::App;
use crate::view::Stage;

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let v = &app.view;
    let rows_ids = app.rows();
    let rows: Vec<Row> = rows_ids
        .iter()
        .filter_map(|id| v.tasks.get(id))
        .map(|t| {
            let name = v
                .problem_name(t.id.problem)
                .map(|n| n.trim_end_matches(".py").to_string())
                .unwrap_or_default();
            let waiting = v.llm_waiting.keys().any(|(task, _)| *task == t.id);
            let in_flight = v.llm_in_flight.iter().any(|(task, _)| *task == t.id);
            let (state, style) = match (&t.error, t.stage) {
                (Some(_), _) => ("log error".to_string(), Style::new().fg(Color::Red)),
                (None, s) if s != Stage::Done && t.deferred.is_some() => {
                    let on = match t.deferred {
                        Some(crate::types::WaitingOn::Workers) => "waits: workers",
                        _ => "waits: LLM",
                    };
                    (on.to_string(), Style::new().fg(Color::Red))
                }
                (None, Stage::Done) => ("done".to_string(), Style::new().fg(Color::DarkGray)),
                (None, Stage::Generate) if waiting => {
                    ("retry wait".to_string(), Style::new().fg(Color::Yellow))
                }
                (None, Stage::Generate) if in_flight => {
                    ("generate".to_string(), Style::new().fg(Color::Cyan))
                }
                (None, Stage::Generate) => ("generate".to_string(), Style::new()),
                (None, s) => (s.as_str().to_string(), Style::new().fg(Color::Cyan)),
            };
            let verdict = t.last_verdict();
            let best = t
                .best_speedup()
                .map(|s| format!("{s:.2}x"))
                .unwrap_or_else(|| "-".into());
            Row::new(vec![
                Cell::from(t.id.to_string()),
                Cell::from(name),
                Cell::from(Span::styled(state, style)),
                Cell::from(format!("{}/{}", t.turn, t.max_turns)),
                Cell::from(Span::styled(
                    verdict.map(|v| v.as_str()).unwrap_or("-"),
                    verdict_style(verdict),
                )),
                Cell::from(Line::from(best).right_aligned()),
            ])
        })
        .collect();
    let header = Row::new(["task", "problem", "state", "turn", "last verdict", "best"])
        .style(Style::new().add_modifier(Modifier::BOLD));
    let f = app.filter;
    let mut title = format!(
        " Tasks {}/{} · sort {}{} · {}",
        rows_ids.len(),
        v.tasks.len(),
        app.sort.label(),
        if app.reverse { " (rev)" } else { "" },
        f.state.label()
    );
    if let Some(l) = f.level {
        title.push_str(&format!(" · level {l}"));
    }
    if let Some(verdict) = f.verdict {
        title.push_str(&format!(" · {verdict}"));
    }
    title.push(' ');
    let table = Table::new(
        rows,
        [
            Constraint::Length(9),
            Constraint::Fill(1),
            Constraint::Length(11),
            Constraint::Length(6),
            Constraint::Length(15),
            Constraint::Length(8),
        ],
    )
    .header(header)
    .block(Block::bordered().title(title))
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .highlight_symbol("▶ ");
    let selected = app.selected.min(rows_ids.len().saturating_sub(1));
    let mut state = TableState::default().with_selected((!rows_ids.is_empty()).then_some(selected));
    frame.render_stateful_widget(table, area, &mut state);
}
