//! krefine: an orchestrator for LLM kernel-refinement experiments on KernelBench-style problems.
//!
//! Rooms (one job each):
//! - [`types`]: everything that crosses rooms (events, commands, verdicts, results).
//! - [`settings`]: the enums several rooms read from their own config sections (a leaf).
//! - [`config`]: the TOML experiment config: assembles the rooms' sections, overrides, validation.
//! - [`dataset`]: loading KernelBench problems (checkout, folder, JSONL) and problem selections.
//! - [`machine`]: the pure per-task state machine (statig) and folding a log into task states.
//! - [`checks`]: static checks on a candidate's source before it is compiled (KernelBench parity).
//! - [`engine`]: the async shell that runs machines, performs commands through services and gates.
//! - [`gpu`]: device discovery (cudarc) and FIFO device leases.
//! - [`refprep`]: preparing problems' reference data while their answers are generated.
//! - [`store`]: run directories and the append-only event log.
//! - [`lock`]: advisory file locks between processes (a run directory, a build directory).
//! - [`services`]: the `Llm`, `Compiler` and `Executor` traits.
//! - [`llm`]: LLM providers (scripted, OpenAI-compatible, replay), the request gate, code extraction.
//! - [`prompt`]: prompt templates and rendering.
//! - [`worker`]: the Python worker processes (compile, correctness, timing, profile).
//! - [`launcher`]: where worker processes start (locally, as Slurm job steps, over SSH), lost
//!   workers and drained hosts.
//! - [`sim`]: simulated compile/execute services for tests and the scheduler benchmark.
//! - [`metrics`], [`report`]: fast_p@N and friends as pure functions of the log, and their formats.
//! - [`interchange`]: KernelBench generations in (submission JSON, runs folder) and submissions out.
//! - [`view`]: a run as folded from its log (`RunView`), the one reducer every display uses.
//! - [`tui`]: the terminal UI (ratatui) for live runs, `watch` and `replay`; [`progress`]: the
//!   `--no-tui` progress bar.
//! - [`cli`]: the command-line surface.

pub mod checks;
pub mod cli;
pub mod config;
pub mod dataset;
pub mod engine;
pub mod gpu;
pub mod hf;
pub mod interchange;
pub mod launcher;
pub mod llm;
pub mod lock;
pub mod machine;
pub mod metrics;
pub mod progress;
pub mod prompt;
pub mod provenance;
pub mod refprep;
pub mod report;
pub mod services;
pub mod settings;
pub mod sim;
pub mod store;
pub mod tui;
pub mod types;
pub mod view;
pub mod worker;
