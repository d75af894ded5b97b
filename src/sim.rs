//! Simulated services: a compiler and executor with scripted verdicts and durations, and an LLM with
//! log-normal latency. Used by engine tests, `eval.executor = "simulated"` runs and the scheduler
//! benchmark; never by a real experiment's numbers.
//!
//! A candidate scripts its own fate with a marker line, e.g.
//! `# krefine-sim: compile=error` or `# krefine-sim: verdict=correct speedup=1.7`. Without a marker a
//! candidate compiles and is correct with speedup 1.0.

use std::time::Duration;

use async_trait::async_trait;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

use crate::services::{
    CompileJob, Compiler, DeviceId, EventSink, ExecJob, Executor, Llm, LlmError, Unavailable,
};
use crate::types::{
    CompileOutcome, CompileStatus, ExecOutcome, LlmAnswer, LlmRequest, ProfileOutcome, Usage,
    Verdict,
};

/// Simulated services: durations in (unscaled) seconds; verdicts come from `# krefine-sim:` markers
/// in the candidate code (see `sim`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SimulatedSection {
    /// Each build's time.
    #[serde(default = "sim_compile")]
    pub compile_s: f64,
    /// Each execution's time, drawn from this range, the same for the same candidate.
    #[serde(default = "sim_exec_min")]
    pub execute_min_s: f64,
    #[serde(default = "sim_exec_max")]
    pub execute_max_s: f64,
    /// Each profile's time.
    #[serde(default = "sim_profile")]
    pub profile_s: f64,
    /// Simulated seconds per real second (1 = real time).
    #[serde(default = "sim_scale")]
    pub time_scale: f64,
}

fn sim_compile() -> f64 {
    0.05
}
fn sim_exec_min() -> f64 {
    0.02
}
fn sim_exec_max() -> f64 {
    0.05
}
fn sim_profile() -> f64 {
    0.02
}
fn sim_scale() -> f64 {
    1.0
}

impl Default for SimulatedSection {
    fn default() -> Self {
        SimulatedSection {
            compile_s: sim_compile(),
            execute_min_s: sim_exec_min(),
            execute_max_s: sim_exec_max(),
            profile_s: sim_profile(),
            time_scale: sim_scale(),
        }
    }
}

/// What a `# krefine-sim:` marker asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct SimScript {
    /// `compile=error` makes this false: the build fails.
    pub compile_ok: bool,
    /// The execution's verdict (`verdict=`; default correct).
    pub verdict: Verdict,
    /// The execution's speedup (`speedup=`; default 1.0).
    pub speedup: f64,
    /// Overrides of the configured durations, in simulated seconds.
    pub compile_s: Option<f64>,
    pub execute_s: Option<f64>,
}

impl SimScript {
    pub fn parse(code: &str) -> SimScript {
        let mut s = SimScript {
            compile_ok: true,
            verdict: Verdict::Correct,
            speedup: 1.0,
            compile_s: None,
            execute_s: None,
        };
        for line in code.lines() {
            let Some(rest) = line.trim().strip_prefix("# krefine-sim:") else {
                continue;
            };
            for kv in rest.split_whitespace() {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                match k {
                    "compile" => s.compile_ok = v != "error",
                    "verdict" => {
                        if let Ok(verdict) =
                            serde_json::from_value::<Verdict>(serde_json::Value::String(v.into()))
                        {
                            s.verdict = verdict;
                        }
                    }
                    "speedup" => s.speedup = v.parse().unwrap_or(s.speedup),
                    "compile_s" => s.compile_s = v.parse().ok(),
                    "execute_s" => s.execute_s = v.parse().ok(),
                    _ => {}
                }
            }
        }
        s
    }
}

pub struct SimServices {
    cfg: SimulatedSection,
}

impl SimServices {
    pub fn new(cfg: SimulatedSection) -> Self {
        SimServices { cfg }
    }

    fn real(&self, simulated_s: f64) -> Duration {
        Duration::from_secs_f64((simulated_s / self.cfg.time_scale).max(0.0))
    }

    fn exec_seconds(&self, job: &ExecJob, script: &SimScript) -> f64 {
        if let Some(s) = script.execute_s {
            return s;
        }
        let (lo, hi) = (self.cfg.execute_min_s, self.cfg.execute_max_s);
        if hi <= lo {
            return lo;
        }
        let seed = blake3::hash(format!("{}:{}:{}", job.task, job.turn, job.code).as_bytes());
        let mut rng = rand::rngs::StdRng::from_seed(*seed.as_bytes());
        rng.random_range(lo..hi)
    }
}

#[async_trait]
impl Compiler for SimServices {
    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable> {
        let script = SimScript::parse(&job.code);
        let secs = script.compile_s.unwrap_or(self.cfg.compile_s);
        tokio::time::sleep(self.real(secs)).await;
        Ok(CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status: if script.compile_ok {
                CompileStatus::Ok
            } else {
                CompileStatus::Error
            },
            cached: false,
            error_name: (!script.compile_ok).then(|| "SimulatedBuildError".into()),
            error: None,
            feedback: if script.compile_ok {
                String::new()
            } else {
                "simulated: error: the candidate was scripted to fail compilation".into()
            },
            log_path: None,
            build_dir: None,
            duration_ms: (secs * 1000.0) as u64,
            findings: Vec::new(),
            build_path: None,
            cpu: None,
        })
    }
}

#[async_trait]
impl Executor for SimServices {
    async fn execute(&self, job: ExecJob, device: &DeviceId) -> Result<ExecOutcome, Unavailable> {
        let script = SimScript::parse(&job.code);
        let secs = self.exec_seconds(&job, &script);
        tokio::time::sleep(self.real(secs)).await;
        let wall_ms = (secs * 1000.0) as u64;
        let verdict = script.verdict;
        let mut o = ExecOutcome::failure(
            verdict,
            &device.to_string(),
            match verdict {
                Verdict::Correct => format!(
                    "simulated: correct (5 / 5 trials); candidate {:.3} ms, reference 1.000 ms, speedup {:.2}x",
                    1.0 / script.speedup,
                    script.speedup
                ),
                other => format!("simulated: the candidate was scripted to end as {other}"),
            },
            wall_ms,
        );
        if verdict == Verdict::Correct {
            o.metadata.clear();
            o.compiled = true;
            o.correctness = true;
            o.runtime_ms = 1.0 / script.speedup;
            o.ref_runtime_ms = 1.0;
            o.ref_source = Some("simulated".into());
            o.speedup = Some(script.speedup);
        }
        o.env.device_name = "simulated".into();
        o.env.timing_method = Some("simulated".into());
        Ok(o)
    }

    async fn profile(
        &self,
        _job: ExecJob,
        _device: &DeviceId,
    ) -> Result<ProfileOutcome, Unavailable> {
        tokio::time::sleep(self.real(self.cfg.profile_s)).await;
        Ok(ProfileOutcome {
            worker_losses: Vec::new(),
            ok: true,
            table: "simulated profile: one kernel, 100% of device time".into(),
            ncu: None,
            error: None,
            duration_ms: (self.cfg.profile_s * 1000.0) as u64,
        })
    }
}

/// An LLM that answers after a log-normal delay with a candidate whose fate is drawn at random.
pub struct SimLlm {
    /// An answer's latency in simulated seconds.
    latency: LogNormal<f64>,
    /// Simulated seconds per real second.
    time_scale: f64,
    /// Probabilities of compile error, and of a correct result given it compiles.
    p_compile_error: f64,
    p_correct: f64,
}

impl SimLlm {
    /// `median_s` is the median latency in simulated seconds; `sigma` the log-normal shape.
    pub fn new(median_s: f64, sigma: f64, time_scale: f64) -> Result<Self, String> {
        let latency = LogNormal::new(median_s.ln(), sigma).map_err(|e| e.to_string())?;
        Ok(SimLlm {
            latency,
            time_scale,
            p_compile_error: 0.3,
            p_correct: 0.6,
        })
    }
}

#[async_trait]
impl Llm for SimLlm {
    fn describe(&self) -> String {
        "simulated LLM (log-normal latency)".into()
    }

    async fn complete(&self, req: LlmRequest, _sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        let seed = blake3::hash(format!("{}:{}", req.task, req.turn).as_bytes());
        let mut rng = rand::rngs::StdRng::from_seed(*seed.as_bytes());
        let secs = self.latency.sample(&mut rng);
        tokio::time::sleep(Duration::from_secs_f64(secs / self.time_scale)).await;
        let marker = if rng.random_bool(self.p_compile_error) {
            "compile=error".to_string()
        } else if rng.random_bool(self.p_correct) {
            format!("verdict=correct speedup={:.2}", rng.random_range(0.3..2.5))
        } else {
            "verdict=incorrect".to_string()
        };
        Ok(LlmAnswer {
            content: format!("```python\n# krefine-sim: {marker}\nclass ModelNew: pass\n```"),
            usage: Some(Usage {
                prompt_tokens: 1500,
                completion_tokens: 800,
                reasoning_tokens: 0,
            }),
            cost_usd: Some(0.0),
            model: "simulated".into(),
            finish_reason: Some("stop".into()),
            latency_ms: (secs * 1000.0) as u64,
            attempts: 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_parse() {
        let s = SimScript::parse("x\n  # krefine-sim: verdict=incorrect compile_s=3\n");
        assert_eq!(s.verdict, Verdict::Incorrect);
        assert!(s.compile_ok);
        assert_eq!(s.compile_s, Some(3.0));
        let s = SimScript::parse("# krefine-sim: compile=error");
        assert!(!s.compile_ok);
        let s = SimScript::parse("no marker");
        assert_eq!((s.verdict, s.speedup), (Verdict::Correct, 1.0));
        let s = SimScript::parse("# krefine-sim: verdict=correct speedup=1.75");
        assert_eq!(s.speedup, 1.75);
    }
}
