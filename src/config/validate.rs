//! Semantic validation of a deserialised configuration: the checks serde's types cannot state (at
//! least one turn, probabilities in range, a timer the devices can run, keys that only apply
//! together). Each error names the key.

use std::path::Path;

use super::error::ConfigError;
use super::report::check_fast_p;
use super::sections::Config;
use crate::llm::config::Provider;
use crate::settings::DeviceSelection;
use crate::types::EvalMode;

/// Check what serde cannot: ranges, and settings that contradict each other. The first key found
/// wrong is the error.
pub(super) fn validate(c: &Config, path: &Path) -> Result<(), ConfigError> {
    method_and_run(c)
        .and_then(|()| model(c))
        .and_then(|()| resources(c))
        .and_then(|()| eval_devices(c))
        .and_then(|()| eval_reference(c))
        .and_then(|()| eval_numbers(c))
        .and_then(|()| budget_and_report(c))
        .map_err(|Invalid { key, message }| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        })
}

/// A key found wrong, and what was expected of it.
struct Invalid {
    key: String,
    message: String,
}

fn invalid(key: &str, message: &str) -> Invalid {
    Invalid {
        key: key.to_string(),
        message: message.to_string(),
    }
}

/// `[method]` and `[run]`: at least one turn and one sample; a run name that is a plain folder.
fn method_and_run(c: &Config) -> Result<(), Invalid> {
    if c.method.turns == 0 {
        return Err(invalid("method.turns", "expected at least 1 turn"));
    }
    if c.method.k == 0 {
        return Err(invalid("method.k", "expected at least 1 sample"));
    }
    if let Some(name) = &c.run.name
        && (name.is_empty() || name.contains('/') || name.contains('\\') || name == "..")
    {
        return Err(invalid("run.name", "expected a plain folder name"));
    }
    Ok(())
}

/// `[model]`: what the provider needs, and sampling settings in range.
fn model(c: &Config) -> Result<(), Invalid> {
    match c.model.provider {
        Provider::Scripted if c.model.answers.is_none() => {
            return Err(invalid(
                "model.answers",
                "the scripted provider needs a JSONL file of answers",
            ));
        }
        Provider::Openai if c.model.name.is_empty() => {
            return Err(invalid(
                "model.name",
                "the openai provider needs a model name",
            ));
        }
        _ => {}
    }
    if let Some(t) = c.model.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(invalid(
            "model.temperature",
            "expected a number from 0 to 2",
        ));
    }
    if let Some(p) = c.model.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(invalid("model.top_p", "expected a number in (0, 1]"));
    }
    if c.model.request_timeout_s.is_nan() || c.model.request_timeout_s <= 0.0 {
        return Err(invalid(
            "model.request_timeout_s",
            "expected a positive number",
        ));
    }
    Ok(())
}

/// `[resources]`: sizes, counts and the launcher's own settings.
fn resources(c: &Config) -> Result<(), Invalid> {
    if c.resources.llm_concurrency == 0 {
        return Err(invalid("resources.llm_concurrency", "expected at least 1"));
    }
    if let Some(gb) = c.resources.reference_cache_gb
        && !(gb.is_finite() && gb >= 0.0)
    {
        return Err(invalid(
            "resources.reference_cache_gb",
            &format!(
                "expected a size in GB, 0 or more (0 turns the reference input store off), got {gb}"
            ),
        ));
    }
    if let Some(gb) = c.resources.reference_ram_gb
        && !(gb.is_finite() && gb >= 0.0)
    {
        return Err(invalid(
            "resources.reference_ram_gb",
            &format!("expected a size in GB, 0 or more (0 turns the in-memory tier off), got {gb}"),
        ));
    }
    if c.resources.prepare_ahead > crate::refprep::MAX_AHEAD {
        return Err(invalid(
            "resources.prepare_ahead",
            &format!(
                "expected 0 to {} (a worker keeps the reference data of {} problems; more prepared \
                 ahead would evict each other before their candidates arrive), got {}",
                crate::refprep::MAX_AHEAD,
                crate::refprep::MAX_AHEAD + 1,
                c.resources.prepare_ahead
            ),
        ));
    }
    if c.resources.compile_workers == Some(0) {
        return Err(invalid("resources.compile_workers", "expected at least 1"));
    }
    if c.resources.cpu_budget == Some(0) {
        return Err(invalid(
            "resources.cpu_budget",
            "expected at least 1 (cores shared by builds, input preparation and CPU timing)",
        ));
    }
    if c.resources.drain_after == 0 {
        return Err(invalid("resources.drain_after", "expected at least 1"));
    }
    let r = &c.resources;
    crate::launcher::config::validate(
        r.launcher,
        &r.slurm,
        &r.ssh,
        r.devices == DeviceSelection::Cpu,
    )
    .map_err(|(key, message)| invalid(&key, &message))?;
    Ok(())
}

/// The evaluation against the devices it runs on: trials, the prompt's backend, the timer.
fn eval_devices(c: &Config) -> Result<(), Invalid> {
    let r = &c.resources;
    if c.eval.correct_trials == 0 {
        return Err(invalid("eval.correct_trials", "expected at least 1"));
    }
    if let Some(message) =
        crate::prompt::config::backend_device(c.prompt.backend, r.devices == DeviceSelection::Cpu)
    {
        return Err(invalid("prompt.backend", &message));
    }
    let method = c.eval.timing_method;
    if method.needs_gpu() && r.devices == DeviceSelection::Cpu {
        return Err(invalid(
            "eval.timing_method",
            &format!(
                "\"{}\" times with Triton on a CUDA device, but resources.devices = \"cpu\" \
                 (on a CPU use \"cuda_event\" or \"host_time\", which time with perf_counter)",
                method.as_str()
            ),
        ));
    }
    if !method.is_default() && c.eval.mode == EvalMode::Strict {
        return Err(invalid(
            "eval.timing_method",
            &format!(
                "\"{}\" is a faithful-mode timer; strict mode times with its own loop (fresh \
                 inputs per call, device-wide fence), so leave timing_method unset there",
                method.as_str()
            ),
        ));
    }
    Ok(())
}

/// The reference's compile settings, which apply with `eval.reference = "compile"` only.
fn eval_reference(c: &Config) -> Result<(), Invalid> {
    if let Some(m) = &c.eval.compile_mode
        && !crate::worker::config::COMPILE_MODES.contains(&m.as_str())
    {
        return Err(invalid(
            "eval.compile_mode",
            &format!(
                "expected one of {}, got {m:?}",
                crate::worker::config::COMPILE_MODES.join(", ")
            ),
        ));
    }
    if c.eval.reference != crate::worker::config::ReferenceMode::Compile
        && (c.eval.compile_backend.is_some() || c.eval.compile_mode.is_some())
    {
        return Err(invalid(
            "eval.compile_backend",
            "compile_backend and compile_mode apply with eval.reference = \"compile\" only",
        ));
    }
    Ok(())
}

/// The evaluation's numbers: tolerances, trials, the speedup bound, timeouts, simulated times.
fn eval_numbers(c: &Config) -> Result<(), Invalid> {
    for (key, value) in [("eval.atol", c.eval.atol), ("eval.rtol", c.eval.rtol)] {
        if let Some(v) = value
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(invalid(
                key,
                &format!("expected a finite number >= 0, got {v}"),
            ));
        }
    }
    if c.eval.timing_trials == 0 {
        return Err(invalid("eval.timing_trials", "expected at least 1"));
    }
    if let Some(bound) = c.eval.max_speedup
        && !(bound.is_finite() && bound > 0.0)
    {
        return Err(invalid("eval.max_speedup", "expected a positive number"));
    }
    let t = &c.eval.timeouts;
    for (key, v) in [
        ("eval.timeouts.compile_s", t.compile_s),
        ("eval.timeouts.load_s", t.load_s),
        ("eval.timeouts.reference_s", t.reference_s),
        ("eval.timeouts.execute_s", t.execute_s),
        ("eval.timeouts.profile_s", t.profile_s),
    ] {
        if v.is_nan() || v <= 0.0 {
            return Err(invalid(key, "expected a positive number of seconds"));
        }
    }
    let s = &c.eval.simulated;
    if s.time_scale.is_nan() || s.time_scale <= 0.0 {
        return Err(invalid(
            "eval.simulated.time_scale",
            "expected a positive number",
        ));
    }
    if s.execute_min_s > s.execute_max_s {
        return Err(invalid(
            "eval.simulated.execute_min_s",
            "must not be larger than eval.simulated.execute_max_s",
        ));
    }
    Ok(())
}

/// `[budget]` and `[report]`.
fn budget_and_report(c: &Config) -> Result<(), Invalid> {
    if let Some(u) = c.budget.usd
        && (u.is_nan() || u < 0.0)
    {
        return Err(invalid("budget.usd", "expected a non-negative number"));
    }
    check_fast_p(&c.report.fast_p).map_err(|m| invalid("report.fast_p", &m))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::InputsMode;
    use crate::config::tests::{MIN, p};

    #[test]
    fn reference_store_and_inputs_keys() {
        let c = p(MIN, &[]).unwrap().config;
        // Unset: the file system's free space bounds the store; the in-memory tier is kept.
        assert_eq!(c.resources.reference_cache_gb, None);
        assert!(c.resources.reference_ram_keep);
        assert_eq!(c.eval.inputs, InputsMode::Kernelbench);
        assert!(c.eval.reference_cache.is_none());
        let c = p(
            MIN,
            &[
                "eval.inputs=\"device\"",
                "resources.reference_cache_gb=0",
                "eval.reference_cache=\"/tmp/refs\"",
            ],
        )
        .unwrap()
        .config;
        assert_eq!(c.eval.inputs, InputsMode::Device);
        assert_eq!(c.resources.reference_cache_gb, Some(0.0));
        assert_eq!(
            c.eval.reference_cache.as_deref(),
            Some(Path::new("/tmp/refs"))
        );
        let e = p(MIN, &["resources.reference_cache_gb=-1"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.reference_cache_gb") && e.contains("got -1"),
            "{e}"
        );
        let e = p(MIN, &["eval.inputs=\"gpu\""]).unwrap_err().to_string();
        assert!(e.contains("inputs"), "{e}");
        // The in-memory tier: unset (the machine's share), a size, 0 (off); never negative.
        assert_eq!(p(MIN, &[]).unwrap().config.resources.reference_ram_gb, None);
        let c = p(MIN, &["resources.reference_ram_gb=0"]).unwrap().config;
        assert_eq!(c.resources.reference_ram_gb, Some(0.0));
        let e = p(MIN, &["resources.reference_ram_gb=-2"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.reference_ram_gb") && e.contains("got -2"),
            "{e}"
        );
    }

    #[test]
    fn semantic_validation_names_key() {
        let e = p(MIN, &["method.turns=0"]).unwrap_err().to_string();
        assert!(e.contains("method.turns"), "{e}");
        let e = p(MIN, &["model.temperature=5"]).unwrap_err().to_string();
        assert!(e.contains("model.temperature"), "{e}");
        let text = "[dataset]\npath = \"x\"\n[model]\nprovider = \"scripted\"\n";
        let e = p(text, &[]).unwrap_err().to_string();
        assert!(e.contains("model.answers"), "{e}");
        let e = p(MIN, &["resources.prepare_ahead=4"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.prepare_ahead")
                && e.contains("expected 0 to 3")
                && e.contains("got 4"),
            "{e}"
        );
        let c = p(MIN, &[]).unwrap().config;
        assert_eq!(c.resources.prepare_ahead, 2);
        // Compile workers follow the CPU budget unless set.
        let r = p(MIN, &["resources.cpu_budget=6"])
            .unwrap()
            .config
            .resources;
        assert_eq!((r.cpu_cores(), r.compile_workers()), (6, 6));
        // A 4-GPU host's 64 cores get 64 workers, not 16; past that the budget still decides.
        for (cores, workers) in [(64, 64), (128, 64)] {
            let r = p(MIN, &[&format!("resources.cpu_budget={cores}")])
                .unwrap()
                .config
                .resources;
            assert_eq!((r.cpu_cores(), r.compile_workers()), (cores, workers));
        }
        let r = p(
            MIN,
            &["resources.cpu_budget=64", "resources.compile_workers=3"],
        )
        .unwrap()
        .config
        .resources;
        assert_eq!((r.cpu_cores(), r.compile_workers()), (64, 3));
        let e = p(MIN, &["resources.cpu_budget=0"]).unwrap_err().to_string();
        assert!(e.contains("resources.cpu_budget"), "{e}");
        assert_eq!(
            p(MIN, &["resources.prepare_ahead=0"])
                .unwrap()
                .config
                .resources
                .prepare_ahead,
            0
        );
    }

    #[test]
    fn timing_method_and_tolerance_keys() {
        use crate::types::{TimingMethod, TolerancePreset};
        let c = p(
            MIN,
            &[
                "eval.timing_method=\"do_bench\"",
                "eval.tolerance=\"kernelbench-v0\"",
            ],
        );
        let c = c.unwrap().config;
        assert_eq!(c.eval.timing_method, TimingMethod::DoBench);
        assert_eq!(c.eval.tolerance, Some(TolerancePreset::KernelBenchV0));
        let t = c.eval.tolerance_in_effect();
        assert_eq!(
            (t.name.as_str(), t.atol, t.rtol),
            ("kernelbench-v0", 1e-2, 1e-2)
        );
        let t = p(MIN, &["eval.rtol=0.5"])
            .unwrap()
            .config
            .eval
            .tolerance_in_effect();
        assert_eq!((t.name.as_str(), t.atol, t.rtol), ("explicit", 1e-4, 0.5));
        assert_eq!(p(MIN, &[]).unwrap().config.eval.tolerance_request(), None);
        for (sets, key, says) in [
            (
                &[
                    "eval.timing_method=\"do_bench_impl\"",
                    "resources.devices=\"cpu\"",
                ][..],
                "eval.timing_method",
                "CUDA",
            ),
            (
                &["eval.timing_method=\"host_time\"", "eval.mode=\"strict\""][..],
                "eval.timing_method",
                "strict",
            ),
            (&["eval.atol=-1.0"][..], "eval.atol", ">= 0"),
        ] {
            let e = p(MIN, sets).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(says), "{sets:?}: {e}");
        }
        assert!(p(MIN, &["eval.tolerance=\"v0\""]).is_err());
        let c = p(
            MIN,
            &[
                "eval.reference=\"compile\"",
                "eval.compile_mode=\"max-autotune\"",
            ],
        );
        let rc = c.unwrap().config.eval.reference_compile().unwrap();
        assert_eq!(
            (rc.backend.as_str(), rc.mode.as_str()),
            ("inductor", "max-autotune")
        );
        assert_eq!(p(MIN, &[]).unwrap().config.eval.reference_compile(), None);
        let e = p(MIN, &["eval.compile_mode=\"default\""])
            .unwrap_err()
            .to_string();
        assert!(e.contains("eval.reference = \"compile\" only"), "{e}");
        let e = p(
            MIN,
            &["eval.reference=\"compile\"", "eval.compile_mode=\"fast\""],
        );
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("max-autotune-no-cudagraphs")
        );
        let c = p(MIN, &["eval.profiler=\"ncu\""]).unwrap().config;
        assert_eq!(
            c.eval.profiler,
            Some(crate::worker::config::ProfilerKind::Ncu)
        );
        assert!(p(MIN, &["eval.profiler=\"nsight\""]).is_err());
        // host_time runs on a CPU (perf_counter, nothing to synchronise).
        assert!(
            p(
                MIN,
                &[
                    "eval.timing_method=\"host_time\"",
                    "resources.devices=\"cpu\""
                ]
            )
            .is_ok()
        );
    }
}
