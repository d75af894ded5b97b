//! krefine: an orchestrator for LLM kernel-refinement experiments on KernelBench-style problems.
//!
//! Rooms (one job each):
//! - [`types`]: everything that crosses rooms (events, commands, verdicts, results); [`run_end`]:
//!   why a run ended (`EndReason`), a leaf of it.
//! - [`settings`]: the enums several rooms read from their own config sections (a leaf).
//! - [`config`]: the TOML experiment config: assembles the rooms' sections, overrides, validation.
//! - [`dataset`]: loading KernelBench problems (checkout, folder, JSONL) and problem selections.
//! - [`machine`]: the pure per-task state machine (statig).
//! - [`checks`]: static checks on a candidate's source before it is compiled (KernelBench parity).
//! - [`engine`]: the async shell that runs machines, performs commands through services and gates.
//! - [`gpu`]: device discovery (cudarc) and FIFO device leases.
//! - [`cpu_budget`]: one budget of CPU cores for builds, CPU preparation of inputs and CPU timing.
//! - [`refprep`]: preparing problems' reference data while their answers are generated.
//! - [`store`]: run directories and the append-only event log (its one writer and one reader).
//! - [`lock`]: advisory file locks between processes (a run directory, a build directory).
//! - [`scratch`]: a run's scratch folder, removed when the run ends; dead runs' swept.
//! - [`services`]: the `Llm`, `Compiler` and `Executor` traits.
//! - [`llm`]: LLM providers (scripted, OpenAI-compatible, replay), the request gate, code extraction.
//! - [`prompt`]: prompt templates and rendering.
//! - [`worker`]: the Python worker processes (compile, correctness, timing, profile).
//! - [`launcher`]: where worker processes start (locally, as Slurm job steps, over SSH), lost
//!   workers and drained hosts.
//! - [`sim`]: simulated compile/execute services for tests and the scheduler benchmark.
//! - [`metrics`], [`report`]: fast_p@N and friends as pure functions of the log, and their formats.
//! - [`interchange`]: KernelBench generations in (submission JSON, runs folder) and submissions out.
//! - [`spend`]: the one type for LLM spending (tokens, USD), shared by reducer, reports and budget.
//! - [`state`]: a run as folded from its log (`RunState`), the one reducer every consumer uses:
//!   displays, reports, ledger, GPU-seconds, fast_p curves, the resume budget and the engine's
//!   resume, `--replay-llm`, the benchmarks' figures, the Python package.
//! - [`view`]: `RunView`, the state with its fast_p curve for displays, and where displays' records
//!   come from (`view::source`).
//! - [`tui`]: the terminal UI (ratatui) for live runs, `watch` and `replay`; [`progress`]: the
//!   `--no-tui` progress bar.
//! - [`cli`]: the command-line surface.
//!
//! Floors, bottom up (a room imports only from floors below it; the README's Layout has the table):
//! leaves (`settings`, `run_end`, `cpu_budget`, `lock`, `scratch`); `types`; `services`, `store`,
//! `spend`, `dataset`, `prompt`, `hf`; `gpu`, `sim`, `checks`; `launcher`, `refprep`, `machine`,
//! `provenance`; `worker`, `state`; `llm`, `metrics`; `config`, `engine`; `report`, `view`; `tui`,
//! `progress`, `interchange`; `cli`.

pub mod checks;
pub mod cli;
pub mod config;
pub mod cpu_budget;
pub mod dataset;
pub mod engine;
#[allow(
    unsafe_code,
    reason = "device discovery asks the CUDA driver through cudarc's FFI calls"
)]
pub mod gpu;
pub mod hf;
pub mod interchange;
pub mod launcher;
pub mod llm;
#[allow(
    unsafe_code,
    reason = "a lock folder's access check asks the kernel (access(2)) before anything is created in it"
)]
pub mod lock;
pub mod machine;
pub mod metrics;
pub mod progress;
pub mod prompt;
pub mod provenance;
pub mod refprep;
pub mod report;
pub mod run_end;
pub mod scratch;
pub mod services;
pub mod settings;
pub mod sim;
pub mod spend;
pub mod state;
pub mod store;
#[allow(
    unsafe_code,
    reason = "whether the terminal's foreground process group is ours (getpgrp, tcgetpgrp)"
)]
pub mod tui;
pub mod types;
pub mod view;
// The worker room starts and sandboxes processes (fork/exec hooks, namespaces, prctl, mmap): calls
// into the kernel are its job. Two more of the workspace's lints wait there for the room's rework
// (issue 38's later phase): the safety comment of `sandbox_enter::Prepared::enter`'s unsafe block
// is not in the `// SAFETY:` form clippy reads, and `InputStore::ensure_with`'s allow has no reason.
#[allow(
    unsafe_code,
    clippy::undocumented_unsafe_blocks,
    clippy::allow_attributes_without_reason,
    reason = "the worker room calls the kernel; see the comment above"
)]
pub mod worker;
