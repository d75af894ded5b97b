//! Where a recheck reads from and writes to, and the settings it evaluates with: the recheck run's
//! directory (never inside the run it rechecks), the run's problems (found where the run took them,
//! and checked against the hash it recorded), and the config sections it starts from (the run's
//! frozen `[eval]`, `[resources]`, `[prompt]` and `[report]`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::config::LoadedConfig;
use crate::provenance::RunProvenance;

/// Config sections a recheck takes from the run; `--set` may change keys in these only.
pub const SECTIONS: [&str; 4] = ["eval", "resources", "prompt", "report"];

/// Refuse `--set` assignments outside [`SECTIONS`]: the recheck fixes the rest (the problems, the
/// method, the served generations, where it writes).
pub fn check_sets(sets: &[String]) -> anyhow::Result<()> {
    for s in sets {
        let key = s.split_once('=').map_or(s.as_str(), |(k, _)| k).trim();
        let section = key.split('.').next().unwrap_or("").trim_matches('"');
        if !SECTIONS.contains(&section) {
            bail!(
                "--set {s}: a recheck takes the run's own problems, method and candidates; it changes keys of [{}] only (--dataset says where the problems are, --out where the recheck goes)",
                SECTIONS.join("], [")
            );
        }
    }
    Ok(())
}

/// The run directory, absolute and with links resolved: what "inside the run" is measured against.
pub fn canonical_run(run: &Path) -> anyhow::Result<PathBuf> {
    run.canonicalize()
        .with_context(|| format!("cannot resolve the run directory {}", run.display()))
}

/// Whether `p` (which need not exist) lies in `dir` (canonical), links resolved as far as `p` exists.
pub fn inside(dir: &Path, p: &Path) -> bool {
    let Ok(abs) = std::path::absolute(p) else {
        return false;
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            return abs.starts_with(dir);
        };
        rest.push(name.to_os_string());
        existing = parent;
    }
    let mut resolved = existing
        .canonicalize()
        .unwrap_or_else(|_| existing.to_path_buf());
    for name in rest.iter().rev() {
        if name == ".." {
            resolved.pop();
        } else if name != "." {
            resolved.push(name);
        }
    }
    resolved.starts_with(dir)
}

/// The recheck run's directory: `out`, or `<run>-recheck-<UTC time>` next to the run (`-2`, `-3`, ...
/// when that exists). Refuses a directory inside the run, or one that already holds a run.
pub fn out_dir(run: &Path, out: Option<&Path>, now_s: u64) -> anyhow::Result<PathBuf> {
    let out = match out {
        Some(o) => o.to_path_buf(),
        None => {
            let (Some(parent), Some(name)) = (run.parent(), run.file_name()) else {
                bail!(
                    "{}: no folder beside it for the recheck; choose one with --out",
                    run.display()
                );
            };
            let stem = format!("{}-recheck-{}", name.to_string_lossy(), utc_stamp(now_s));
            let mut candidate = parent.join(&stem);
            let mut n = 2;
            while candidate.exists() {
                candidate = parent.join(format!("{stem}-{n}"));
                n += 1;
            }
            candidate
        }
    };
    if inside(run, &out) {
        bail!(
            "--out {}: lies inside the run directory {}, and a recheck never writes there; choose a folder outside it",
            out.display(),
            run.display()
        );
    }
    if out.join(crate::store::EVENTS_FILE).exists() || out.join(crate::store::CONFIG_FILE).exists()
    {
        bail!(
            "--out {}: already holds a run; choose another folder",
            out.display()
        );
    }
    Ok(out)
}

/// `YYYYMMDD-HHMMSS` of `secs` since the Unix epoch, in UTC.
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Where the run's problems are: `given` (`--dataset`), else the path its `provenance.json`
/// recorded, else its config's `dataset.path` (from the working directory when relative).
pub fn dataset_path(
    given: Option<&Path>,
    recorded: Option<&RunProvenance>,
    configured: &Path,
) -> anyhow::Result<PathBuf> {
    if let Some(d) = given {
        if !d.exists() {
            bail!("--dataset {}: no such file or directory", d.display());
        }
        return Ok(std::path::absolute(d)?);
    }
    let mut tried = Vec::new();
    if let Some(p) = recorded {
        if p.dataset.path.exists() {
            return Ok(p.dataset.path.clone());
        }
        tried.push(format!("{} (provenance.json)", p.dataset.path.display()));
    }
    if configured.exists() {
        return Ok(std::path::absolute(configured)?);
    }
    tried.push(format!(
        "{} (config.toml's dataset.path{})",
        configured.display(),
        if configured.is_absolute() {
            ""
        } else {
            ", from the working directory"
        }
    ));
    bail!(
        "cannot find the run's problems: tried {}; say where they are with --dataset",
        tried.join(" and ")
    )
}

/// The sections of the run's frozen config a recheck starts from ([`SECTIONS`]), without what
/// would not mean the same outside the run: `prompt.templates` (no prompt is sent). A relative
/// `eval.baseline` is replaced by the absolute path `provenance.json` recorded for it.
pub fn base_sections(frozen: &toml::Table, recorded: Option<&RunProvenance>) -> toml::Table {
    let mut out = toml::Table::new();
    for name in SECTIONS {
        if let Some(v) = frozen.get(name) {
            out.insert(name.to_string(), v.clone());
        }
    }
    if let Some(toml::Value::Table(prompt)) = out.get_mut("prompt") {
        prompt.remove("templates");
    }
    let baseline = recorded.and_then(|p| p.baseline.as_ref());
    if let (Some(toml::Value::Table(eval)), Some(b)) = (out.get_mut("eval"), baseline) {
        let relative = eval
            .get("baseline")
            .and_then(|v| v.as_str())
            .is_some_and(|s| Path::new(s).is_relative());
        if relative && b.path.exists() {
            eval.insert(
                "baseline".into(),
                toml::Value::String(b.path.to_string_lossy().into_owned()),
            );
        }
    }
    out
}

/// Refuse an evaluation whose writes would land inside the run (`run`, canonical): its output
/// folder, build cache, reference cache or Hugging Face cache.
pub fn check_writes(run: &Path, loaded: &LoadedConfig) -> anyhow::Result<()> {
    let eval = &loaded.config.eval;
    let paths = [
        ("output.dir", Some(loaded.config.output.dir.clone())),
        ("eval.build_cache", eval.build_cache.clone()),
        ("eval.reference_cache", eval.reference_cache.clone()),
        ("eval.hf.cache", eval.hf.cache.clone()),
    ];
    for (key, path) in paths {
        let Some(p) = path else { continue };
        let resolved = loaded.resolve(&p);
        if inside(run, &resolved) {
            bail!(
                "{key} = {}: lies inside the run directory {}, and a recheck never writes there; pass --set {key}=<a folder outside it>",
                resolved.display(),
                run.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_calendar_times() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        // 2024-02-29 23:59:59 UTC (a leap day).
        assert_eq!(utc_stamp(1_709_251_199), "20240229-235959");
        assert_eq!(utc_stamp(1_709_251_200), "20240301-000000");
    }

    #[test]
    fn sets_outside_the_evaluation_are_refused() {
        let ok: Vec<String> = [
            "eval.mode=strict",
            "resources.devices=cpu",
            "report.fast_p=[]",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        check_sets(&ok).unwrap();
        for bad in [
            "method.turns=3",
            "dataset.path=x",
            "model.name=y",
            "output.dir=z",
            "x",
        ] {
            let e = check_sets(&[bad.to_string()]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--set {bad}: ")), "{e}");
        }
    }

    #[test]
    fn out_dirs_stay_outside_the_run() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("runs/exp");
        std::fs::create_dir_all(&run).unwrap();
        let run = canonical_run(&run).unwrap();
        let t = 1_709_251_199;
        let first = out_dir(&run, None, t).unwrap();
        assert_eq!(first, run.with_file_name("exp-recheck-20240229-235959"));
        std::fs::create_dir_all(&first).unwrap();
        assert_eq!(
            out_dir(&run, None, t).unwrap(),
            run.with_file_name("exp-recheck-20240229-235959-2")
        );
        for bad in [run.join("x"), run.join("a/../b"), run.clone()] {
            let e = out_dir(&run, Some(&bad), t).unwrap_err().to_string();
            assert!(e.contains("lies inside the run directory"), "{e}");
        }
        // Through a link to the run.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&run, &link).unwrap();
        assert!(inside(&run, &link.join("new")));
        assert!(!inside(&run, &tmp.path().join("runs/exp2")));
        // A folder holding a run is refused.
        let other = tmp.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("events.jsonl"), "").unwrap();
        let e = out_dir(&run, Some(&other), t).unwrap_err().to_string();
        assert!(e.contains("already holds a run"), "{e}");
    }
}
