//! One task: its turns on the left, and everything of the chosen turn on the right — prompt, answer
//! (streaming while it arrives), extracted code, compile result and log, correctness and timing,
//! profile, and the exact feedback the next turn's prompt got.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};

use super::verdict_style;
use crate::machine::turn_feedback;
use crate::tui::app::{App, Detail};
use crate::types::{
    ChatMessage, CompileOutcome, CompileStatus, ExecOutcome, ProfileOutcome, TurnRecord,
};
use crate::view::TaskView;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, d: &Detail) {
    let Some(t) = app.view.tasks.get(&d.task) else {
        frame.render_widget(
            Paragraph::new(format!("task {} is not in this run", d.task)).block(Block::bordered()),
            area,
        );
        return;
    };
    let [list, body] = Layout::horizontal([Constraint::Length(24), Constraint::Min(0)]).areas(area);
    draw_turns(frame, list, t, d);
    let lines = turn_lines(app, t, d.turn, d.full_prompt);
    let name = app
        .view
        .problem_name(t.id.problem)
        .unwrap_or("")
        .to_string();
    let title = format!(
        " {} {} · turn {}/{} · {} ",
        t.id,
        name,
        d.turn,
        t.max_turns,
        if d.turn == t.turn {
            t.stage.as_str()
        } else {
            "finished"
        }
    );
    let para = Paragraph::new(lines)
        .block(Block::bordered().title(title))
        .wrap(Wrap { trim: false });
    // Rows of wrapped text below the view when scrolled to the end (borders count in both).
    let max = para
        .line_count(body.width)
        .saturating_sub(body.height as usize);
    let max = u16::try_from(max).unwrap_or(u16::MAX);
    app.detail_max_scroll.set(max);
    frame.render_widget(para.scroll((d.scroll.min(max), 0)), body);
}

fn draw_turns(frame: &mut Frame, area: Rect, t: &TaskView, d: &Detail) {
    let mut lines = Vec::new();
    for n in 1..=t.turn.max(1) {
        let rec = t.turns().get(n as usize - 1);
        let verdict = rec.and_then(|r| r.verdict);
        let label = match verdict {
            Some(v) => v.as_str().to_string(),
            None => t.stage.as_str().to_string(),
        };
        let speed = rec
            .and_then(TurnRecord::correct_speedup)
            .map(|s| format!(" {s:.2}x"))
            .unwrap_or_default();
        let marker = if n == d.turn { "▶" } else { " " };
        let style = if n == d.turn {
            verdict_style(verdict).add_modifier(Modifier::REVERSED)
        } else {
            verdict_style(verdict)
        };
        lines.push(Line::styled(
            format!("{marker}{n:>2} {label}{speed}"),
            style,
        ));
    }
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Turns ")),
        area,
    );
}

fn section(lines: &mut Vec<Line<'static>>, title: String) {
    if !lines.is_empty() {
        lines.push(Line::raw(""));
    }
    lines.push(Line::styled(
        format!("── {title} "),
        Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD),
    ));
}

fn text(lines: &mut Vec<Line<'static>>, s: &str) {
    for l in s.lines() {
        lines.push(Line::raw(l.to_string()));
    }
}

fn note(lines: &mut Vec<Line<'static>>, s: impl Into<String>) {
    lines.push(Line::styled(s.into(), Style::new().fg(Color::DarkGray)));
}

/// Lines of each prompt message shown while the prompt is folded.
const PROMPT_PREVIEW: usize = 3;

/// Every section of turn `n` of task `t`, as lines.
pub(crate) fn turn_lines(app: &App, t: &TaskView, n: u32, full_prompt: bool) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let rec = t.turns().get((n as usize).saturating_sub(1));
    let empty = TurnRecord::default();
    let r = rec.unwrap_or(&empty);
    prompt_lines(&mut lines, app, t, r, n, full_prompt);
    answer_lines(&mut lines, t, r, n);
    if r.answer.is_some() {
        code_lines(&mut lines, r);
    }
    if let Some(c) = &r.compile {
        compile_lines(&mut lines, app, c);
    }
    if let Some(e) = &r.exec {
        exec_lines(&mut lines, e);
    }
    if let Some(p) = &r.profile {
        profile_lines(&mut lines, p);
    }
    if r.verdict.is_some() {
        feedback_lines(&mut lines, t, r, n);
    }
    lines
}

/// The prompt of turn `n`: its messages as stored (folded to a few lines each unless
/// `full_prompt`), or why there is none.
fn prompt_lines(
    lines: &mut Vec<Line<'static>>,
    app: &App,
    t: &TaskView,
    r: &TurnRecord,
    n: u32,
    full_prompt: bool,
) {
    let Some(path) = t.prompt_files.get(&n) else {
        section(lines, "Prompt".into());
        note(
            lines,
            if t.turn < n || (t.turn == n && r.answer.is_none() && r.llm_error.is_none()) {
                "(not sent yet)"
            } else {
                "(not recorded: the run predates stored prompts)"
            },
        );
        return;
    };
    section(lines, format!("Prompt ({path})"));
    let Some(raw) = app.file(path) else {
        note(lines, "(not read)");
        return;
    };
    let Ok(messages) = serde_json::from_str::<Vec<ChatMessage>>(raw) else {
        text(lines, raw);
        return;
    };
    for m in messages {
        lines.push(Line::styled(
            format!("[{}]", role(&m)),
            Style::new().fg(Color::Yellow),
        ));
        let total = m.content.lines().count();
        if full_prompt || total <= PROMPT_PREVIEW + 1 {
            text(lines, &m.content);
        } else {
            for l in m.content.lines().take(PROMPT_PREVIEW) {
                lines.push(Line::raw(l.to_string()));
            }
            note(
                lines,
                format!(
                    "… {} more lines (p shows the whole prompt)",
                    total - PROMPT_PREVIEW
                ),
            );
        }
    }
}

/// The answer: as logged, as streamed so far, or the request's error.
fn answer_lines(lines: &mut Vec<Line<'static>>, t: &TaskView, r: &TurnRecord, n: u32) {
    match (&r.answer, t.streaming.get(&n), &r.llm_error) {
        (Some(a), _, _) => {
            let usage = a
                .usage
                .map(|u| {
                    format!(
                        "{} prompt + {} completion tokens",
                        u.prompt_tokens, u.completion_tokens
                    )
                })
                .unwrap_or_else(|| "no usage reported".into());
            section(
                lines,
                format!(
                    "Answer ({}, {usage}, {:.1} s, {} attempt(s))",
                    if a.model.is_empty() { "?" } else { &a.model },
                    a.latency_ms as f64 / 1000.0,
                    a.attempts
                ),
            );
            text(lines, &a.content);
        }
        (None, Some(partial), _) => {
            section(lines, "Answer (streaming…)".into());
            text(lines, partial);
        }
        (None, None, Some(err)) => {
            section(lines, "Answer".into());
            lines.push(Line::styled(
                format!("LLM request failed: {err}"),
                Style::new().fg(Color::Red),
            ));
        }
        (None, None, None) => {
            section(lines, "Answer".into());
            note(lines, "(no answer yet)");
        }
    }
}

/// The code extracted from an answer, or that there was none.
fn code_lines(lines: &mut Vec<Line<'static>>, r: &TurnRecord) {
    section(lines, "Extracted code".into());
    match &r.code {
        Some(c) => text(lines, c),
        None => lines.push(Line::styled(
            "no usable code block with a ModelNew class",
            Style::new().fg(Color::Red),
        )),
    }
}

/// The build: status, error, static-check findings and the compiler's log.
fn compile_lines(lines: &mut Vec<Line<'static>>, app: &App, c: &CompileOutcome) {
    let status = match c.status {
        CompileStatus::Ok => "ok",
        CompileStatus::Error => "error",
        CompileStatus::Timeout => "timeout",
        CompileStatus::Crashed => "crashed",
        CompileStatus::Rejected => "rejected by static checks",
    };
    section(
        lines,
        format!(
            "Compile: {status}{} · {:.1} s{}",
            if c.cached { " (cached)" } else { "" },
            c.duration_ms as f64 / 1000.0,
            c.build_path
                .as_deref()
                .map(|p| format!(" · build {p}"))
                .unwrap_or_default()
        ),
    );
    if let Some(e) = &c.error {
        lines.push(Line::styled(
            format!("{}: {e}", c.error_name.as_deref().unwrap_or("error")),
            Style::new().fg(Color::Red),
        ));
    }
    for f in &c.findings {
        lines.push(Line::styled(
            format!(
                "finding {} ({:?}){}: {}",
                f.category,
                f.severity,
                f.line.map(|l| format!(" line {l}")).unwrap_or_default(),
                f.message
            ),
            Style::new().fg(Color::Yellow),
        ));
    }
    match &c.log_path {
        Some(p) => {
            note(lines, format!("log {p}"));
            match app.file(p) {
                Some(log) if !log.trim().is_empty() => text(lines, log),
                Some(_) => note(lines, "(empty log)"),
                None if !c.feedback.trim().is_empty() => text(lines, &c.feedback),
                None => {}
            }
        }
        None if !c.feedback.trim().is_empty() => text(lines, &c.feedback),
        None => {}
    }
}

/// Correctness and timing: verdict, runtimes, the timing's statistics, a flagged speedup and
/// findings, and the evaluation's own feedback.
fn exec_lines(lines: &mut Vec<Line<'static>>, e: &ExecOutcome) {
    section(lines, format!("Correctness and timing on {}", e.device));
    let mut head = vec![Span::styled(
        e.verdict.as_str().to_string(),
        verdict_style(Some(e.verdict)),
    )];
    head.push(Span::raw(format!(
        " · compiled {} · correct {}",
        e.compiled, e.correctness
    )));
    if let Some(s) = e.speedup {
        head.push(Span::raw(format!(" · speedup {s:.3}x")));
    }
    lines.push(Line::from(head));
    if e.runtime_ms >= 0.0 {
        lines.push(Line::raw(format!(
            "candidate {:.4} ms · reference {} ({})",
            e.runtime_ms,
            if e.ref_runtime_ms >= 0.0 {
                format!("{:.4} ms", e.ref_runtime_ms)
            } else {
                "-".into()
            },
            e.ref_source.as_deref().unwrap_or("?")
        )));
    }
    if let Some(s) = &e.runtime_stats {
        lines.push(Line::raw(format!(
            "stats: mean {:.4} · median {:.4} · std {:.4} · min {:.4} · max {:.4} ms over {} trials",
            s.mean, s.median, s.std, s.min, s.max, s.num_trials
        )));
    }
    if let Some(sc) = &e.speedup_check
        && sc.flagged
    {
        lines.push(Line::styled(
            format!(
                "speedup above the {} bound {:.1}x{}",
                sc.bound_source,
                sc.bound,
                match sc.verified {
                    Some(true) => " (confirmed by re-timing)",
                    Some(false) => " (NOT confirmed: does not count)",
                    None => "",
                }
            ),
            Style::new().fg(Color::Yellow),
        ));
    }
    for f in &e.findings {
        lines.push(Line::styled(
            format!("finding {} ({:?}): {}", f.category, f.severity, f.message),
            Style::new().fg(Color::Yellow),
        ));
    }
    if !e.feedback.trim().is_empty() {
        text(lines, &e.feedback);
    }
}

/// The profiler's table, or its error.
fn profile_lines(lines: &mut Vec<Line<'static>>, p: &ProfileOutcome) {
    section(
        lines,
        format!("Profile ({:.1} s)", p.duration_ms as f64 / 1000.0),
    );
    if let Some(e) = &p.error {
        lines.push(Line::styled(e.clone(), Style::new().fg(Color::Red)));
    }
    text(lines, &p.table);
}

/// What the next turn's prompt got of this one, by the task's feedback mode.
fn feedback_lines(lines: &mut Vec<Line<'static>>, t: &TaskView, r: &TurnRecord, n: u32) {
    let fb = turn_feedback(t.feedback(), r);
    let next = if n < t.max_turns {
        format!("turn {}", n + 1)
    } else {
        "no next turn (the task's last turn)".into()
    };
    section(lines, format!("Feedback for {next}, mode {}", t.feedback()));
    note(lines, "code: the extracted candidate above");
    match &fb.execution {
        Some(x) => {
            lines.push(Line::styled("[execution]", Style::new().fg(Color::Yellow)));
            text(lines, x);
        }
        None if t.feedback().includes_execution() => note(lines, "execution: none"),
        None => note(lines, "execution: not sent in this mode"),
    }
    match &fb.profile {
        Some(p) => {
            lines.push(Line::styled("[profile]", Style::new().fg(Color::Yellow)));
            text(lines, p);
        }
        None if t.feedback().includes_profile() => note(
            lines,
            "profile: none (only correct candidates are profiled)",
        ),
        None => note(lines, "profile: not sent in this mode"),
    }
}

fn role(m: &ChatMessage) -> &'static str {
    match m.role {
        crate::types::Role::System => "system",
        crate::types::Role::User => "user",
        crate::types::Role::Assistant => "assistant",
    }
}
