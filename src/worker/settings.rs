//! [`WorkerSettings`]: everything the pool needs, and its timeouts as validated durations.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::WorkerError;
use super::baseline::BaselineTable;
use super::config::{BuildMode, EvalSection, InputsMode, Timeouts};
use super::sandbox::SandboxMode;
use crate::launcher::Launcher;
use crate::services::DeviceId;
use crate::types::{EvalMode, Precision, TimingMethod, Tolerance};

/// Everything the pool needs. Paths should be absolute (the harness gets them verbatim).
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Interpreter with torch (see [`super::find_python`]).
    pub python: PathBuf,
    /// Folder holding the deployed harness (see [`super::deploy_harness`]).
    pub harness_dir: PathBuf,
    /// Each worker gets `<scratch_root>/<worker name>/` as HOME, TMPDIR and working directory.
    pub scratch_root: PathBuf,
    /// Worker logs: `<log_dir>/<worker name>.log` (`compile-0.log`, `gpu-1.log`, `cpu-0.log`).
    pub log_dir: PathBuf,
    /// Content-addressed build directories.
    pub build_cache: PathBuf,
    /// How `load_inline` extensions are built (`eval.build`).
    pub build: BuildMode,
    /// Persistent compile worker processes (at least 1).
    pub compile_workers: usize,
    /// One evaluation worker per device.
    pub devices: Vec<DeviceId>,
    /// `TORCH_CUDA_ARCH_LIST`; `None`: from the GPUs' compute capabilities (none on a CPU-only pool).
    pub arch_list: Option<String>,
    pub precision: Precision,
    pub mode: EvalMode,
    pub seed: u64,
    pub correct_trials: u32,
    pub warmup: u32,
    /// Timed trials; 0 turns timing off.
    pub timing_trials: u32,
    /// `eval.timing_method`.
    pub timing_method: TimingMethod,
    /// `eval.tolerance` resolved (`None`: every tolerance key unset, KernelBench's table).
    pub tolerance: Option<Tolerance>,
    /// `eval.reference = "compile"`: the reference's torch.compile backend and mode.
    pub reference_compile: Option<super::protocol::ReferenceCompile>,
    pub timeouts: Timeouts,
    /// Replace a worker after this many requests (0: never).
    pub recycle_after: u32,
    pub profile_rows: u32,
    pub ncu: bool,
    /// `eval.profiler` (`None`: unset, the torch table plus ncu where `ncu`).
    pub profiler: Option<super::config::ProfilerKind>,
    /// Reference runtimes from a KernelBench baseline file instead of timing the reference.
    pub baseline: Option<Arc<BaselineTable>>,
    /// GPU driver version, recorded in every result's `env`.
    pub driver: Option<String>,
    /// `eval.max_speedup`: the excessive-speedup bound (default: the roofline, or 50).
    pub max_speedup: Option<f64>,
    /// `eval.cast_integer_inputs`: KernelBench's cast of integer and bool inputs.
    pub cast_integer_inputs: bool,
    /// `eval.inputs`: where the inputs are drawn (KernelBench's CPU generation, or the device).
    pub inputs: InputsMode,
    /// The on-disk store of CPU-made inputs (`eval.reference_cache`); `None`: no store.
    pub reference_cache: Option<PathBuf>,
    /// `resources.reference_cache_gb` in bytes (`u64::MAX`: unset, the file system's free space
    /// bounds the store alone); 0 turns the store off.
    pub reference_cache_bytes: u64,
    /// `resources.reference_ram_gb` in bytes: the store's in-memory tier (`/dev/shm`); 0: none.
    pub reference_ram_bytes: u64,
    /// `resources.reference_ram_keep`: the in-memory tier is the machine's kept folder, shared by
    /// runs and left in place, instead of this run's own.
    pub reference_ram_keep: bool,
    /// Extra worker environment (the Hugging Face cache and offline mode, see `crate::hf`).
    pub extra_env: Vec<(String, std::ffi::OsString)>,
    /// The orchestrator's own `CUDA_VISIBLE_DEVICES` (set by the user or a scheduler), against which
    /// `DeviceId::Gpu(i)` is an index; see [`crate::gpu::worker_visible_device`].
    pub visible_devices: Option<String>,
    /// `eval.sandbox`: confine every worker in namespaces (see [`super::sandbox`]).
    pub sandbox: SandboxMode,
    /// Where workers start (`resources.launcher`; see [`crate::launcher`]).
    pub launcher: Arc<Launcher>,
}

impl WorkerSettings {
    /// Settings with `EvalSection`'s defaults, one compile worker, the CPU device, and the scratch,
    /// log and build-cache folders under `work_dir` (`scratch/`, `workers/`, `build-cache/`).
    pub fn new(python: PathBuf, harness_dir: PathBuf, work_dir: &Path) -> WorkerSettings {
        let eval = EvalSection::default();
        let mut s = WorkerSettings {
            python,
            harness_dir,
            scratch_root: work_dir.join("scratch"),
            log_dir: work_dir.join("workers"),
            build_cache: work_dir.join("build-cache"),
            build: BuildMode::default(),
            compile_workers: 1,
            devices: vec![DeviceId::Cpu],
            arch_list: None,
            precision: Precision::default(),
            mode: EvalMode::default(),
            seed: 0,
            correct_trials: 0,
            warmup: 0,
            timing_trials: 0,
            timing_method: TimingMethod::default(),
            tolerance: None,
            reference_compile: None,
            timeouts: Timeouts::default(),
            recycle_after: 0,
            profile_rows: 0,
            ncu: false,
            profiler: None,
            baseline: None,
            driver: None,
            max_speedup: None,
            cast_integer_inputs: false,
            inputs: InputsMode::default(),
            reference_cache: None,
            reference_cache_bytes: 0,
            reference_ram_bytes: 0,
            reference_ram_keep: false,
            extra_env: Vec::new(),
            visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            sandbox: SandboxMode::default(),
            launcher: Arc::new(Launcher::local()),
        };
        s.apply_eval(&eval);
        s
    }

    /// Take the evaluation settings of a config's `[eval]` section (the baseline file is loaded
    /// separately, with [`BaselineTable::load`]).
    pub fn apply_eval(&mut self, eval: &EvalSection) {
        self.precision = eval.precision;
        self.mode = eval.mode;
        self.seed = eval.seed;
        self.correct_trials = eval.correct_trials;
        self.warmup = eval.warmup;
        self.timing_trials = eval.timing_trials;
        self.timing_method = eval.timing_method;
        self.tolerance = eval.tolerance_request();
        self.reference_compile = eval.reference_compile();
        self.arch_list = eval.arch_list.clone();
        self.timeouts = eval.timeouts.clone();
        self.recycle_after = eval.recycle_after;
        self.profile_rows = eval.profile_rows;
        self.ncu = eval.ncu || eval.profiler.is_some_and(|p| p.wants_ncu());
        self.profiler = eval.profiler;
        self.build = eval.build;
        self.max_speedup = eval.max_speedup;
        self.cast_integer_inputs = eval.cast_integer_inputs;
        self.inputs = eval.inputs;
        if let Some(dir) = &eval.reference_cache {
            self.reference_cache = Some(dir.clone());
        }
        self.sandbox = eval.sandbox_mode();
        if let Some(dir) = &eval.build_cache {
            self.build_cache = dir.clone();
        }
    }
}

/// The timeouts as durations, validated once.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    pub(super) compile: Duration,
    pub(super) load: Duration,
    pub(super) reference: Duration,
    pub(super) execute: Duration,
    pub(super) profile: Duration,
}

impl Deadlines {
    pub(super) fn from(t: &Timeouts) -> Result<Deadlines, WorkerError> {
        let d = |name: &str, secs: f64| {
            if secs.is_finite() && secs > 0.0 {
                Duration::try_from_secs_f64(secs)
                    .map_err(|e| WorkerError::Settings(format!("timeouts.{name} = {secs}: {e}")))
            } else {
                Err(WorkerError::Settings(format!(
                    "timeouts.{name} must be a positive number of seconds, got {secs}"
                )))
            }
        };
        Ok(Deadlines {
            compile: d("compile_s", t.compile_s)?,
            load: d("load_s", t.load_s)?,
            reference: d("reference_s", t.reference_s)?,
            execute: d("execute_s", t.execute_s)?,
            profile: d("profile_s", t.profile_s)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_timeouts_are_refused() {
        let t = Timeouts {
            execute_s: f64::NAN,
            ..Timeouts::default()
        };
        let e = Deadlines::from(&t).unwrap_err().to_string();
        assert!(e.contains("execute_s"), "{e}");
        let t = Timeouts {
            compile_s: -1.0,
            ..Timeouts::default()
        };
        assert!(Deadlines::from(&t).is_err());
    }
}
