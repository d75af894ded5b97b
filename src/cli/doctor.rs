//! `krefine doctor`: what this machine offers for experiments.

use std::path::Path;
use std::process::ExitCode;

use crate::gpu;

pub fn doctor(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let _ = config;
    let d = gpu::discover();
    println!("GPUs:");
    if d.gpus.is_empty() {
        println!("  none ({})", d.note.as_deref().unwrap_or("no GPU"));
    }
    for g in &d.gpus {
        println!(
            "  {}: {} (compute capability {}, {} GiB)",
            g.id,
            g.name,
            g.capability
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_else(|| "?".into()),
            g.total_memory_bytes
                .map(|m| format!("{:.1}", m as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "?".into())
        );
    }
    if let Some(v) = &d.driver_version {
        println!("  CUDA driver API {v}");
    }
    Ok(ExitCode::SUCCESS)
}
