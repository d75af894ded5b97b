//! The equal-attempts table that `report` adds when its runs hold one refinement and one sampling run
//! (the quick view; `krefine compare` is the full comparison).

use crate::metrics::equal_attempts;
use crate::types::MethodKind;

use super::{Format, RunReport};

/// Refinement against repeated sampling at equal attempts, when the runs hold one of each.
pub fn equal_attempts_table(reports: &[RunReport], format: Format) -> Option<String> {
    let refine = reports.iter().find(|r| r.method == MethodKind::Refine)?;
    let sampling = reports.iter().find(|r| r.method == MethodKind::Sampling)?;
    let rows = equal_attempts(&refine.metrics, &sampling.metrics).ok()?;
    let md = format == Format::Md;
    let mut s = format!(
        "\n{}equal attempts: {} (refine) vs {} (sampling), fast_1 and geomean speedup\n",
        if md { "### " } else { "" },
        refine.run,
        sampling.run
    );
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let geo = |g: Option<f64>| g.map(|g| format!("{g:.3}")).unwrap_or_else(|| "-".into());
    if md {
        s.push_str("\n| attempts | refine fast_1 | sampling fast_1 | refine geomean | sampling geomean |\n|---|---|---|---|---|\n");
    } else {
        s.push_str("attempts  refine_fast_1  sampling_fast_1  refine_geomean  sampling_geomean\n");
    }
    for r in rows {
        let (a, b) = (r.refine.fast_p.0[3], r.sampling.fast_p.0[3]);
        if md {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                r.attempts,
                pct(a),
                pct(b),
                geo(r.refine.geomean_speedup),
                geo(r.sampling.geomean_speedup)
            ));
        } else {
            s.push_str(&format!(
                "{:>8}  {:>13}  {:>15}  {:>14}  {:>16}\n",
                r.attempts,
                pct(a),
                pct(b),
                geo(r.refine.geomean_speedup),
                geo(r.sampling.geomean_speedup)
            ));
        }
    }
    Some(s)
}
