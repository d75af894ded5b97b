//! fast_p@N by turn (or by sample count), for p = 0, 1, 1.5 and 2.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::Line;
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph};

use crate::tui::app::App;
use crate::types::MethodKind;

const SERIES: [(f64, &str, Color); 4] = [
    (0.0, "fast_0", Color::Green),
    (1.0, "fast_1", Color::Cyan),
    (1.5, "fast_1.5", Color::Yellow),
    (2.0, "fast_2", Color::Magenta),
];

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let v = &app.view;
    let axis_name = match v.info.as_ref().map(|i| i.method) {
        Some(MethodKind::Sampling) => "samples",
        _ => "turn",
    };
    let block = Block::bordered().title(format!(" fast_p@N by {axis_name} "));
    if v.curve.is_empty() || area.height < 6 {
        frame.render_widget(
            Paragraph::new("no finished turn yet")
                .style(Style::new().fg(Color::DarkGray))
                .block(block),
            area,
        );
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
        .map(|((_, name, color), data)| {
            let last = data.last().map_or(0.0, |d| d.1);
            Dataset::default()
                .name(format!("{name} {last:.0}%"))
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
                .labels(vec![Line::from("0%"), Line::from("50%"), Line::from("100%")])
                .style(Style::new().fg(Color::DarkGray)),
        )
        .legend_position(Some(ratatui::widgets::LegendPosition::TopLeft))
        .hidden_legend_constraints((
            ratatui::layout::Constraint::Percentage(60),
            ratatui::layout::Constraint::Percentage(60),
        ));
    frame.render_widget(chart, area);
}
