//! The provenance every report carries: what a score was measured on and how, so a number can be
//! reproduced or rightly refused a comparison (KernelBench's level-4 guide asks for level, hardware,
//! model and server, temperature, samples per task, KernelBench commit and baseline file).
//!
//! A pure function of three things read from the run directory: the frozen `config.toml` (model,
//! method, evaluation settings), `provenance.json` (dataset revision, baseline hash, GPUs and
//! driver, krefine build; see [`crate::provenance`]) and the measured results' env (torch, CUDA,
//! Python, transformers, timing method, what was really used). Never an API key: the endpoint is
//! reduced to its host.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::config::{Config, Provider};
use crate::provenance::{Build, DatasetRevision, FileHash, RunProvenance};
use crate::types::{ExecOutcome, FeedbackMode, MethodKind};

use super::feedback_key;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Provenance {
    pub levels: Vec<u32>,
    pub hardware: Hardware,
    pub software: Software,
    pub model: ModelInfo,
    pub method: MethodInfo,
    pub dataset: Option<DatasetRevision>,
    /// The baseline file the reference times came from, or `None`: timed live.
    pub baseline: Option<FileHash>,
    pub eval: EvalInfo,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hardware {
    /// Devices the results were measured on (names the workers reported).
    pub measured_on: Vec<String>,
    /// The devices the run was given, with GPU UUIDs (from `provenance.json`).
    pub devices: Vec<crate::provenance::Device>,
    /// NVIDIA kernel driver.
    pub driver: Option<String>,
    pub cuda_driver_api: Option<String>,
    pub cpu: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Software {
    /// The build that ran the experiment.
    pub krefine: Option<Build>,
    /// Values of the workers' env; several are joined with ", " (a run that spans machines).
    pub torch: Option<String>,
    pub cuda: Option<String>,
    pub python: Option<String>,
    pub transformers: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    pub provider: Option<String>,
    pub name: Option<String>,
    /// Host (and port) of the endpoint; never a path, query or key.
    pub endpoint_host: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodInfo {
    pub kind: MethodKind,
    pub turns: u32,
    pub samples_per_task: u32,
    pub feedback: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalInfo {
    /// `faithful` or `strict`.
    pub mode: Option<String>,
    pub precision: Option<String>,
    /// `cuda_event`, `do_bench`, `do_bench_impl`, `host_time` or `cpu_perf_counter`.
    pub timing_method: Option<String>,
    /// The correctness tolerance (`kernelbench (atol = rtol = 1e-4)`); absent where the results
    /// did not record one and the config set none (KernelBench's per-precision table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<String>,
    /// `eager` or `compile (backend, mode)` (`eval.reference`); absent where unrecorded (eager).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_mode: Option<String>,
    /// Where reference times came from: `measured`, `cached`, `baseline:<file>`.
    pub reference_timing: Vec<String>,
    /// `kept` or `cast` (KernelBench's cast of integer inputs).
    pub integer_inputs: Option<String>,
    /// `kernelbench` (made on the CPU, KernelBench's bits) or `device` (drawn on the GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
    pub tf32_matmul: Option<bool>,
    pub tf32_cudnn: Option<bool>,
    pub correct_trials: Option<u32>,
    pub timing_trials: Option<u32>,
}

/// What the run's start record says about its method.
pub struct Started {
    pub method: MethodKind,
    pub turns: u32,
    pub samples: u32,
    pub feedback: Option<FeedbackMode>,
}

/// Assemble the provenance of one run.
pub fn provenance<'a>(
    started: &Started,
    config: Option<&Config>,
    recorded: Option<&RunProvenance>,
    results: impl Iterator<Item = &'a ExecOutcome>,
) -> Provenance {
    let mut seen = Seen::default();
    for e in results {
        seen.add(e);
    }
    let levels = recorded
        .map(|r| vec![r.dataset.level])
        .or_else(|| config.map(|c| vec![c.dataset.level]))
        .unwrap_or_default();
    let model = config.map(|c| &c.model);
    Provenance {
        levels,
        hardware: Hardware {
            measured_on: seen.devices.iter().cloned().collect(),
            devices: recorded.map(|r| r.host.devices.clone()).unwrap_or_default(),
            driver: recorded.and_then(|r| r.host.driver.clone()),
            cuda_driver_api: recorded.and_then(|r| r.host.cuda_driver_api.clone()),
            cpu: recorded.and_then(|r| r.host.cpu.clone()),
        },
        software: Software {
            krefine: recorded.map(|r| r.krefine.clone()),
            torch: joined(&seen.torch),
            cuda: joined(&seen.cuda),
            python: joined(&seen.python),
            transformers: joined(&seen.transformers),
        },
        model: ModelInfo {
            provider: model.map(|m| provider_name(m.provider).to_string()),
            name: model.map(|m| m.name.clone()).filter(|n| !n.is_empty()),
            endpoint_host: model.and_then(|m| endpoint_host(m.provider, m.base_url.as_deref())),
            temperature: model.and_then(|m| m.temperature),
            top_p: model.and_then(|m| m.top_p),
            max_tokens: model.and_then(|m| m.max_tokens),
        },
        method: MethodInfo {
            kind: started.method,
            turns: started.turns,
            samples_per_task: started.samples,
            feedback: (started.method == MethodKind::Refine)
                .then_some(started.feedback)
                .flatten()
                .map(feedback_key),
        },
        dataset: recorded.map(|r| r.dataset.clone()),
        baseline: recorded.and_then(|r| r.baseline.clone()),
        eval: EvalInfo {
            mode: joined(&seen.mode).or_else(|| config.map(|c| c.eval.mode.as_str().into())),
            precision: joined(&seen.precision)
                .or_else(|| config.map(|c| c.eval.precision.as_str().into())),
            timing_method: joined(&seen.timing),
            tolerance: joined(&seen.tolerance).or_else(|| {
                config
                    .and_then(|c| c.eval.tolerance_request())
                    .map(|t| t.to_string())
            }),
            reference_timing: seen.reference.iter().cloned().collect(),
            reference_mode: joined(&seen.reference_mode),
            integer_inputs: joined(&seen.integer_inputs).or_else(|| {
                config.map(|c| {
                    if c.eval.cast_integer_inputs {
                        "cast".into()
                    } else {
                        "kept".into()
                    }
                })
            }),
            inputs: joined(&seen.inputs).or_else(|| config.map(|c| c.eval.inputs.as_str().into())),
            tf32_matmul: single_bool(&seen.tf32_matmul),
            tf32_cudnn: single_bool(&seen.tf32_cudnn),
            correct_trials: config.map(|c| c.eval.correct_trials),
            timing_trials: config.map(|c| c.eval.timing_trials),
        },
    }
}

/// Every value the results' environments recorded, field by field: a run's provenance names what
/// it measured with, and says so when its results disagree (several values joined).
#[derive(Default)]
struct Seen {
    devices: BTreeSet<String>,
    torch: BTreeSet<String>,
    cuda: BTreeSet<String>,
    python: BTreeSet<String>,
    transformers: BTreeSet<String>,
    mode: BTreeSet<String>,
    precision: BTreeSet<String>,
    timing: BTreeSet<String>,
    tolerance: BTreeSet<String>,
    reference_mode: BTreeSet<String>,
    reference: BTreeSet<String>,
    integer_inputs: BTreeSet<String>,
    inputs: BTreeSet<String>,
    tf32_matmul: BTreeSet<bool>,
    tf32_cudnn: BTreeSet<bool>,
}

impl Seen {
    fn add(&mut self, e: &ExecOutcome) {
        let env = &e.env;
        if !env.device_name.is_empty() {
            self.devices.insert(env.device_name.clone());
        }
        let put = |set: &mut BTreeSet<String>, v: &Option<String>| {
            if let Some(v) = v {
                set.insert(v.clone());
            }
        };
        put(&mut self.torch, &env.torch);
        put(&mut self.cuda, &env.cuda);
        put(&mut self.python, &env.python);
        put(&mut self.transformers, &env.transformers);
        put(&mut self.mode, &env.mode);
        put(&mut self.precision, &env.precision);
        put(&mut self.timing, &env.timing_method);
        put(&mut self.reference_mode, &env.reference_mode);
        if let Some(t) = &env.tolerance {
            self.tolerance.insert(t.to_string());
        }
        put(&mut self.integer_inputs, &env.integer_inputs);
        put(&mut self.inputs, &env.inputs);
        // Cached means "measured earlier in this run"; the distinction is the worker's, not the
        // run's.
        if let Some(s) = &e.ref_source {
            let s = if s == "cached" {
                "measured"
            } else {
                s.as_str()
            };
            self.reference.insert(s.to_string());
        }
        self.tf32_matmul.extend(env.tf32_matmul);
        self.tf32_cudnn.extend(env.tf32_cudnn);
    }
}

fn joined(set: &BTreeSet<String>) -> Option<String> {
    (!set.is_empty()).then(|| set.iter().cloned().collect::<Vec<_>>().join(", "))
}

/// One value, or `None` when there is none or the results disagree.
fn single_bool(set: &BTreeSet<bool>) -> Option<bool> {
    match set.len() {
        1 => set.iter().next().copied(),
        _ => None,
    }
}

fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Openai => "openai",
        Provider::Scripted => "scripted",
        Provider::Replay => "replay",
    }
}

/// `host[:port]` of the endpoint an OpenAI-compatible provider talks to (OpenAI's by default).
/// User info, path and query are dropped: a key put into a URL never reaches a report.
pub fn endpoint_host(provider: Provider, base_url: Option<&str>) -> Option<String> {
    if provider != Provider::Openai {
        return None;
    }
    let Some(url) = base_url else {
        return Some("api.openai.com".into());
    };
    let parsed = reqwest::Url::parse(url).ok()?;
    let host = parsed.host_str()?;
    Some(match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    })
}

/// The header lines of a text or Markdown report (`key: value`).
pub fn lines(p: &Provenance) -> Vec<(&'static str, String)> {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut out = Vec::new();
    let levels: Vec<String> = p.levels.iter().map(u32::to_string).collect();
    out.push((
        "levels",
        or_dash((!levels.is_empty()).then(|| levels.join(", "))),
    ));
    let mut hw: Vec<String> = p.hardware.measured_on.clone();
    for d in &p.hardware.devices {
        if let Some(u) = &d.uuid {
            hw.push(format!("{} {u}", d.id));
        }
    }
    out.push(("hardware", or_dash((!hw.is_empty()).then(|| hw.join("; ")))));
    let versions = [
        ("driver", p.hardware.driver.clone()),
        ("cuda", p.software.cuda.clone()),
        ("torch", p.software.torch.clone()),
        ("python", p.software.python.clone()),
        ("transformers", p.software.transformers.clone()),
    ];
    let v: Vec<String> = versions
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
        .collect();
    out.push(("software", or_dash((!v.is_empty()).then(|| v.join(", ")))));
    if let Some(b) = &p.software.krefine {
        out.push(("krefine", format!("{} ({})", b.version, short(&b.commit))));
    }
    let m = &p.model;
    let mut model = vec![or_dash(m.provider.clone()), or_dash(m.name.clone())];
    if let Some(h) = &m.endpoint_host {
        model.push(format!("at {h}"));
    }
    let opt = |k: &str, v: Option<String>| v.map(|v| format!("{k} {v}"));
    let sampling: Vec<String> = [
        opt("temperature", m.temperature.map(|t| t.to_string())),
        opt("top_p", m.top_p.map(|t| t.to_string())),
        opt("max_tokens", m.max_tokens.map(|t| t.to_string())),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !sampling.is_empty() {
        model.push(format!("({})", sampling.join(", ")));
    }
    out.push(("model", model.join(" ")));
    let me = &p.method;
    out.push((
        "method",
        format!(
            "{}, {} turn(s), {} sample(s) per task{}",
            me.kind,
            me.turns,
            me.samples_per_task,
            me.feedback
                .map(|f| format!(", feedback {f}"))
                .unwrap_or_default()
        ),
    ));
    if let Some(d) = &p.dataset {
        let rev = match &d.git_commit {
            Some(c) => format!("commit {}, {}", short(c), short_hash(&d.content_hash)),
            None => short_hash(&d.content_hash),
        };
        out.push((
            "dataset",
            format!(
                "{} ({}, {rev}), problems {}",
                d.path.display(),
                d.kind,
                d.problems
            ),
        ));
    }
    out.push((
        "baseline",
        match &p.baseline {
            Some(b) => format!("{} ({})", b.path.display(), short_hash(&b.hash)),
            None => "timed live".into(),
        },
    ));
    let e = &p.eval;
    out.push((
        "evaluation",
        format!(
            "{} mode, {}, {} timing, reference {}, integer inputs {}, inputs {}",
            or_dash(e.mode.clone()),
            or_dash(e.precision.clone()),
            or_dash(e.timing_method.clone()),
            if e.reference_timing.is_empty() {
                "-".to_string()
            } else {
                e.reference_timing.join(" + ")
            } + &e
                .reference_mode
                .as_ref()
                .filter(|m| m.as_str() != "eager")
                .map_or(String::new(), |m| format!(" {m}")),
            or_dash(e.integer_inputs.clone()),
            or_dash(e.inputs.clone()),
        ) + &e
            .tolerance
            .as_ref()
            .map_or(String::new(), |t| format!(", tolerance {t}")),
    ));
    out
}

/// A tolerance as compared across runs: a preset by its name (its numbers follow from the precision,
/// compared separately), where unrecorded KernelBench's table; an explicit one in full.
fn tolerance_key(p: &Provenance) -> String {
    tolerance_label(p.eval.tolerance.as_deref())
}

/// [`tolerance_key`] of a recorded tolerance text.
pub fn tolerance_label(recorded: Option<&str>) -> String {
    match recorded {
        None => "kernelbench".into(),
        Some(t) => ["kernelbench-v0", "kernelbench"]
            .into_iter()
            .find(|name| t.starts_with(&format!("{name} (")))
            .map_or(t.to_string(), str::to_string),
    }
}

/// What makes runs' scores incomparable: a different level, hardware, baseline file (or one timed
/// live and one against a file), problem set, precision, evaluation mode, timing method or
/// correctness tolerance. One line per differing
/// field, naming each run's value; empty when the runs agree (or there are fewer than two).
pub fn mismatches(runs: &[(&str, &Provenance)]) -> Vec<String> {
    type Field = (&'static str, fn(&Provenance) -> String);
    let fields: [Field; 10] = [
        ("level", |p| format!("{:?}", p.levels)),
        ("hardware", |p| p.hardware.measured_on.join(", ")),
        ("baseline", |p| {
            p.baseline
                .as_ref()
                .map_or("timed live".to_string(), |b| short_hash(&b.hash))
        }),
        ("problems", |p| {
            p.dataset
                .as_ref()
                .map_or("-".to_string(), |d| short_hash(&d.content_hash))
        }),
        ("precision", |p| {
            p.eval.precision.clone().unwrap_or_default()
        }),
        ("eval mode", |p| p.eval.mode.clone().unwrap_or_default()),
        // Device-drawn inputs are other bits than KernelBench's: scores are not comparable as-is.
        ("inputs", |p| {
            p.eval
                .inputs
                .clone()
                .unwrap_or_else(|| "kernelbench".into())
        }),
        ("timing method", |p| {
            p.eval.timing_method.clone().unwrap_or_default()
        }),
        ("tolerance", tolerance_key),
        ("reference timing", |p| {
            p.eval
                .reference_mode
                .clone()
                .unwrap_or_else(|| "eager".into())
        }),
    ];
    let mut out = Vec::new();
    for (name, value) in fields {
        let values: Vec<String> = runs.iter().map(|(_, p)| value(p)).collect();
        if values.windows(2).any(|w| w[0] != w[1]) {
            let each: Vec<String> = runs
                .iter()
                .zip(&values)
                .map(|((run, _), v)| format!("{run}: {v}"))
                .collect();
            out.push(format!("the runs differ in {name} ({})", each.join("; ")));
        }
    }
    out
}

fn short(commit: &str) -> String {
    let (c, dirty) = match commit.strip_suffix("-dirty") {
        Some(c) => (c, "-dirty"),
        None => (commit, ""),
    };
    format!("{}{dirty}", &c[..c.len().min(12)])
}

fn short_hash(h: &str) -> String {
    h[..h.len().min("blake3:".len() + 16)].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provenance::{Device, Host};
    use serde_json::json;

    fn exec(v: serde_json::Value) -> ExecOutcome {
        serde_json::from_value(v).unwrap()
    }

    /// One refinement run on an H100 against a baseline file, with a secret in its endpoint.
    fn golden_run() -> Provenance {
        let config = crate::config::parse(
            r#"
[dataset]
path = "KernelBench"
level = 4
problems = "1-3"
[method]
kind = "refine"
turns = 5
feedback = "GE"
[model]
provider = "openai"
name = "gpt-test"
base_url = "https://user:sk-secret@llm.example.com:8443/v1?key=sk-x"
api_key_env = "TEST_KEY"
temperature = 0.7
top_p = 0.95
max_tokens = 8192
[eval]
precision = "bf16"
"#,
            std::path::Path::new("exp.toml"),
            &[],
        )
        .unwrap()
        .config;
        let recorded = RunProvenance {
            krefine: Build {
                version: "0.1.0".into(),
                commit: "0123456789abcdef0123456789abcdef01234567".into(),
            },
            dataset: DatasetRevision {
                path: "/data/KernelBench".into(),
                kind: "kernelbench_checkout".into(),
                git_commit: Some("fedcba9876543210fedcba9876543210fedcba98".into()),
                content_hash: "blake3:00112233445566778899aabbccddeeff".into(),
                level: 4,
                problems: "1-3".into(),
            },
            baseline: Some(FileHash {
                path: "/data/baselines/H100/baseline_time_torch.json".into(),
                hash: "blake3:ffeeddccbbaa99887766554433221100".into(),
            }),
            host: Host {
                devices: vec![Device {
                    id: "cuda:0".into(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    uuid: Some("GPU-1234".into()),
                }],
                driver: Some("580.159.04".into()),
                cuda_driver_api: Some("13.0".into()),
                cpu: Some("AMD EPYC".into()),
            },
            hf_cache: Some("/home/u/.cache/huggingface/hub".into()),
            hf_offline: Some(true),
            evaluation: None,
        };
        let env = json!({
            "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0",
            "precision": "bf16", "mode": "faithful", "timing_method": "cuda_event",
            "grad_mode": "no_grad", "tf32_matmul": false, "tf32_cudnn": true,
            "integer_inputs": "kept", "transformers": "5.23.0", "python": "3.12.3",
        });
        let results = [
            exec(
                json!({"verdict": "correct", "compiled": true, "correctness": true,
                "ref_source": "baseline:H100/baseline_time_torch.json", "env": env}),
            ),
            exec(
                json!({"verdict": "incorrect", "compiled": true, "correctness": false,
                "ref_source": "baseline:H100/baseline_time_torch.json", "env": env}),
            ),
            // A result without an env (an orchestrator-side failure) adds nothing.
            exec(json!({"verdict": "compile_error", "compiled": false, "correctness": false})),
        ];
        let started = Started {
            method: MethodKind::Refine,
            turns: 5,
            samples: 1,
            feedback: Some(FeedbackMode::GE),
        };
        provenance(&started, Some(&config), Some(&recorded), results.iter())
    }

    /// The golden run's provenance as `report.json` holds it; no secret of the endpoint in it.
    #[test]
    fn golden_provenance_json() {
        let p = golden_run();
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({
                "levels": [4],
                "hardware": {
                    "measured_on": ["NVIDIA H100 80GB HBM3"],
                    "devices": [{"id": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234"}],
                    "driver": "580.159.04",
                    "cuda_driver_api": "13.0",
                    "cpu": "AMD EPYC"
                },
                "software": {
                    "krefine": {"version": "0.1.0", "commit": "0123456789abcdef0123456789abcdef01234567"},
                    "torch": "2.11.0+cu130",
                    "cuda": "13.0",
                    "python": "3.12.3",
                    "transformers": "5.23.0"
                },
                "model": {
                    "provider": "openai",
                    "name": "gpt-test",
                    "endpoint_host": "llm.example.com:8443",
                    "temperature": 0.7f32,
                    "top_p": 0.95f32,
                    "max_tokens": 8192
                },
                "method": {"kind": "refine", "turns": 5, "samples_per_task": 1, "feedback": "GE"},
                "dataset": {
                    "path": "/data/KernelBench",
                    "kind": "kernelbench_checkout",
                    "git_commit": "fedcba9876543210fedcba9876543210fedcba98",
                    "content_hash": "blake3:00112233445566778899aabbccddeeff",
                    "level": 4,
                    "problems": "1-3"
                },
                "baseline": {
                    "path": "/data/baselines/H100/baseline_time_torch.json",
                    "hash": "blake3:ffeeddccbbaa99887766554433221100"
                },
                "eval": {
                    "mode": "faithful",
                    "precision": "bf16",
                    "timing_method": "cuda_event",
                    "reference_timing": ["baseline:H100/baseline_time_torch.json"],
                    "integer_inputs": "kept",
                    "inputs": "kernelbench",
                    "tf32_matmul": false,
                    "tf32_cudnn": true,
                    "correct_trials": 5,
                    "timing_trials": 100
                }
            })
        );
        let json = serde_json::to_string(&p).unwrap();
        assert!(!json.contains("sk-"), "{json}");
    }

    /// The golden run's provenance as the text report shows it.
    #[test]
    fn golden_provenance_text() {
        let text: Vec<String> = lines(&golden_run())
            .into_iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        assert_eq!(
            text,
            [
                "levels: 4",
                "hardware: NVIDIA H100 80GB HBM3; cuda:0 GPU-1234",
                "software: driver 580.159.04, cuda 13.0, torch 2.11.0+cu130, python 3.12.3, transformers 5.23.0",
                "krefine: 0.1.0 (0123456789ab)",
                "model: openai gpt-test at llm.example.com:8443 (temperature 0.7, top_p 0.95, max_tokens 8192)",
                "method: refine, 5 turn(s), 1 sample(s) per task, feedback GE",
                "dataset: /data/KernelBench (kernelbench_checkout, commit fedcba987654, blake3:0011223344556677), problems 1-3",
                "baseline: /data/baselines/H100/baseline_time_torch.json (blake3:ffeeddccbbaa9988)",
                "evaluation: faithful mode, bf16, cuda_event timing, reference baseline:H100/baseline_time_torch.json, integer inputs kept, inputs kernelbench",
            ]
        );
    }

    #[test]
    fn mismatches_name_each_differing_field_and_run() {
        let started = Started {
            method: MethodKind::Refine,
            turns: 1,
            samples: 1,
            feedback: None,
        };
        let h100 = json!({"device_name": "H100", "precision": "fp32", "mode": "faithful"});
        let a100 = json!({"device_name": "A100", "precision": "fp32", "mode": "faithful"});
        let run = |env: &serde_json::Value| {
            let e = exec(
                json!({"verdict": "correct", "compiled": true, "correctness": true, "env": env}),
            );
            provenance(&started, None, None, std::iter::once(&e))
        };
        let (a, b, c) = (run(&h100), run(&h100), run(&a100));
        assert!(mismatches(&[("a", &a), ("b", &b)]).is_empty());
        assert_eq!(
            mismatches(&[("a", &a), ("c", &c)]),
            ["the runs differ in hardware (a: H100; c: A100)"]
        );
        let mut d = a.clone();
        d.levels = vec![4];
        d.baseline = Some(FileHash {
            path: "b.json".into(),
            hash: "blake3:0123456789abcdef0123".into(),
        });
        assert_eq!(
            mismatches(&[("a", &a), ("d", &d)]),
            [
                "the runs differ in level (a: []; d: [4])",
                "the runs differ in baseline (a: timed live; d: blake3:0123456789abcdef)"
            ]
        );
        // Inputs drawn on the device (eval.inputs, recorded in every result's env).
        let on_gpu = json!({"device_name": "H100", "precision": "fp32", "mode": "faithful",
            "inputs": "device"});
        let e = run(&on_gpu);
        assert_eq!(e.eval.inputs.as_deref(), Some("device"));
        assert_eq!(
            mismatches(&[("a", &a), ("e", &e)]),
            ["the runs differ in inputs (a: kernelbench; e: device)"]
        );
    }

    #[test]
    fn timing_method_and_tolerance_are_recorded_and_compared() {
        let started = Started {
            method: MethodKind::Refine,
            turns: 1,
            samples: 1,
            feedback: None,
        };
        let run = |method: &str, tolerance: Option<serde_json::Value>| {
            let mut env =
                json!({"device_name": "H100", "precision": "fp32", "timing_method": method});
            if let Some(t) = tolerance {
                env["tolerance"] = t;
            }
            let e = exec(
                json!({"verdict": "correct", "compiled": true, "correctness": true, "env": env}),
            );
            provenance(&started, None, None, std::iter::once(&e))
        };
        let kb = json!({"name": "kernelbench", "atol": 1e-4, "rtol": 1e-4});
        let v0 = json!({"name": "kernelbench-v0", "atol": 1e-2, "rtol": 1e-2});
        let old = run("cuda_event", None);
        let new = run("cuda_event", Some(kb));
        let loose = run("do_bench", Some(v0));
        assert_eq!(
            new.eval.tolerance.as_deref(),
            Some("kernelbench (atol = rtol = 1e-4)")
        );
        assert!(lines(&loose).iter().any(|(k, v)| *k == "evaluation"
            && v.contains("do_bench timing")
            && v.ends_with("tolerance kernelbench-v0 (atol = rtol = 1e-2)")));
        // A log from before tolerances were recorded used KernelBench's table.
        assert!(mismatches(&[("old", &old), ("new", &new)]).is_empty());
        assert_eq!(
            mismatches(&[("new", &new), ("loose", &loose)]),
            [
                "the runs differ in timing method (new: cuda_event; loose: do_bench)",
                "the runs differ in tolerance (new: kernelbench; loose: kernelbench-v0)"
            ]
        );
    }

    #[test]
    fn without_a_run_directory_record_the_config_still_speaks() {
        let started = Started {
            method: MethodKind::Sampling,
            turns: 1,
            samples: 4,
            feedback: None,
        };
        let p = provenance(&started, None, None, std::iter::empty());
        assert_eq!(p.levels, Vec::<u32>::new());
        assert_eq!(p.baseline, None);
        let text = lines(&p);
        assert!(text.contains(&("baseline", "timed live".to_string())));
        assert!(text.contains(&(
            "method",
            "sampling, 1 turn(s), 4 sample(s) per task".to_string()
        )));
    }

    #[test]
    fn endpoint_host_drops_everything_but_the_host() {
        let h = |u: &str| endpoint_host(Provider::Openai, Some(u));
        assert_eq!(
            h("https://user:sk-secret@api.example.com/v1?key=sk-x").as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            h("http://127.0.0.1:8000/v1").as_deref(),
            Some("127.0.0.1:8000")
        );
        assert_eq!(
            endpoint_host(Provider::Openai, None).as_deref(),
            Some("api.openai.com")
        );
        assert_eq!(endpoint_host(Provider::Scripted, Some("http://x/")), None);
        assert_eq!(h("not a url"), None);
    }

    #[test]
    fn short_forms() {
        assert_eq!(short("0123456789abcdef0123"), "0123456789ab");
        assert_eq!(short("0123456789abcdef-dirty"), "0123456789ab-dirty");
        assert_eq!(short("unknown"), "unknown");
        assert_eq!(
            short_hash("blake3:00112233445566778899"),
            "blake3:0011223344556677"
        );
    }
}
