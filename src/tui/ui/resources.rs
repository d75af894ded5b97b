//! Resources: devices with the task holding each, the device queue, the compile pool and the LLM.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use crate::tui::app::App;
use crate::view::Stage;

/// Lines the panel wants (borders included).
pub fn height(app: &App) -> u16 {
    let extra = u16::from(app.view.budget_exhausted.is_some());
    app.view.devices.len().max(1) as u16 + 4 + extra + 2
}

pub fn draw(frame: &mut Frame, area: Rect, app: &App, now_ms: u64) {
    let v = &app.view;
    let dim = Style::new().fg(Color::DarkGray);
    let mut lines = Vec::new();
    if v.devices.is_empty() {
        lines.push(Line::styled("no device lease yet", dim));
    }
    for (name, d) in &v.devices {
        let mut spans = vec![Span::raw(format!("{name:<8} "))];
        match d.holder {
            Some((task, turn)) => {
                let stage = v.tasks.get(&task).map_or(Stage::Execute, |t| t.stage);
                spans.push(Span::styled(
                    format!("{task} t{turn} {}", stage.as_str()),
                    Style::new().fg(Color::Cyan),
                ));
            }
            None => spans.push(Span::styled("idle", dim)),
        }
        if let Some(g) = app.gpus.iter().find(|g| &g.device == name) {
            spans.push(Span::raw(format!(
                "  util {}% · mem {:.1}/{:.1} GiB",
                g.util_pct,
                g.mem_used as f64 / (1u64 << 30) as f64,
                g.mem_total as f64 / (1u64 << 30) as f64
            )));
        }
        if d.held_ms > 0 {
            // Measured device work next to lease-held time: a held lease is not a busy GPU.
            spans.push(Span::styled(
                format!(
                    "  held {:.0}s · busy {:.0}s {:.0}%",
                    d.held_ms as f64 / 1000.0,
                    d.busy_ms as f64 / 1000.0,
                    100.0 * d.busy_ms as f64 / d.held_ms as f64,
                ),
                dim,
            ));
        }
        lines.push(Line::from(spans));
    }
    lines.push(Line::from(format!(
        "queue    {} task(s) waiting for a device",
        v.device_queue()
    )));
    let compiling = v.stage_counts().get(&Stage::Compile).copied().unwrap_or(0);
    let compiling = if v.ended.is_some() { 0 } else { compiling };
    lines.push(Line::from(match app.meta.compile_workers {
        Some(w) => {
            let busy = compiling.min(w as usize);
            format!(
                "compile  {busy}/{w} busy, {} queued",
                compiling.saturating_sub(busy)
            )
        }
        None => format!("compile  {compiling} task(s) in precompile"),
    }));
    let limit = app
        .meta
        .llm_concurrency
        .map(|c| format!("/{c}"))
        .unwrap_or_default();
    lines.push(Line::from(format!(
        "LLM      {}{limit} in flight · {} waiting to retry",
        v.llm_in_flight.len(),
        v.waiting_at(now_ms),
    )));
    lines.push(Line::from(format!(
        "retries  {} ({} after a 429 rate limit)",
        v.retry_waits, v.rate_limited
    )));
    if let Some(what) = &v.budget_exhausted {
        lines.push(Line::styled(
            format!("budget   exhausted: {what}"),
            Style::new().fg(Color::Red),
        ));
    }
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Resources ")),
        area,
    );
}
