//! fast_p@N by turn (or by sample count), for p = 0, 1, 1.5 and 2.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph};

use crate::tui::app::App;
use crate::types::MethodKind;

const SERIES: [(f64, &str, Color); 4] = [
    (0.0, "p=0", Color::Green),
    (1.0, "p=1", Color::Cyan),
    (1.5, "p=1.5", Color::Yellow),
    (2.0, "p=2", Color::Magenta),
];

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let v = &app.view;
    let axis_name = match v.info.as_ref().map(|i| i.method) {
        Some(MethodKind::Sampling) => "samples",
        _ => "turn",
    };
    // The legend is the title: drawn inside the plot it would hide the lines at 0% and 100%.
    let mut title = vec![Span::raw(format!(" fast_p@N by {axis_name}: "))];
    let last = v.current().unwrap_or_default();
    for (p, name, color) in SERIES {
        title.push(Span::styled(
            format!("{name} {:.0}% ", 100.0 * last.fast_p.get(p).unwrap_or(0.0)),
            Style::new().fg(color),
        ));
    }
    let block = Block::bordered().title(Line::from(title));
    if v.curve.is_empty() {
        frame.render_widget(
            Paragraph::new("no finished turn yet")
                .style(Style::new().fg(Color::DarkGray))
                .block(block),
            area,
        );
        return;
    }
    if area.height < 8 {
        // Too low for a plot: the numbers, one line a step, the latest last.
        let rows = area.height.saturating_sub(2) as usize;
        let lines: Vec<Line> = v
            .curve
            .iter()
            .skip(v.curve.len().saturating_sub(rows))
            .map(|c| {
                let mut spans = vec![Span::raw(format!("{axis_name} {:>2} ", c.n))];
                for (p, name, color) in SERIES {
                    spans.push(Span::styled(
                        format!(" {name} {:>5.1}%", 100.0 * c.fast_p.get(p).unwrap_or(0.0)),
                        Style::new().fg(color),
                    ));
                }
                Line::from(spans)
            })
            .collect();
        frame.render_widget(Paragraph::new(lines).block(block), area);
        return;
    }
    let points: Vec<Vec<(f64, f64)>> = SERIES
        .iter()
        .map(|(p, _, _)| {
            v.curve
                .iter()
                .map(|c| (c.n as f64, 100.0 * c.fast_p.get(*p).unwrap_or(0.0)))
                .collect()
        })
        .collect();
    let datasets: Vec<Dataset> = SERIES
        .iter()
        .zip(&points)
        .map(|((_, _, color), data)| {
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(*color))
                .data(data)
        })
        .collect();
    let n = v.curve.len() as f64;
    let x_labels: Vec<Line> = if n <= 1.0 {
        vec![Line::from("1")]
    } else {
        vec![Line::from("1"), Line::from(format!("{}", n as u32))]
    };
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([1.0, n.max(2.0)])
                .labels(x_labels)
                .style(Style::new().fg(Color::DarkGray)),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, 100.0])
                .labels(vec![
                    Line::from("0%"),
                    Line::from("50%"),
                    Line::from("100%"),
                ])
                .style(Style::new().fg(Color::DarkGray)),
        )
        .legend_position(None);
    frame.render_widget(chart, area);
}
