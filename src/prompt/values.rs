//! What templates see: a turn, the backend, the style, the precision and a GPU's spec as minijinja
//! values, with the number formatting decided here once and the feedback mode's limits applied.

use minijinja::context;
use minijinja::value::Value;

use super::config::PromptStyle;
use super::gpu_specs;
use crate::settings::Backend;
use crate::types::{FeedbackMode, Precision, TurnFeedback};

pub(super) fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|t| !t.trim().is_empty())
}

/// What a template sees of an earlier turn, limited to what the feedback mode allows.
pub(super) fn entry_value(entry: &TurnFeedback, mode: FeedbackMode) -> Value {
    let execution = non_empty(&entry.execution).filter(|_| mode.includes_execution());
    let profile = non_empty(&entry.profile).filter(|_| mode.includes_profile());
    context! {
        turn => entry.turn,
        code => non_empty(&entry.code),
        answer => non_empty(&entry.answer),
        execution => execution,
        profile => profile,
    }
}

pub(super) fn backend_value(backend: Backend) -> Value {
    let (name, language, device) = match backend {
        Backend::Cuda => ("cuda", "CUDA", "GPU"),
        Backend::Triton => ("triton", "Triton", "GPU"),
        Backend::Cute => ("cute", "CuTe", "GPU"),
        Backend::Tilelang => ("tilelang", "TileLang", "GPU"),
        Backend::Thunderkittens => ("thunderkittens", "ThunderKittens", "GPU"),
        Backend::Cpu => ("cpu", "C++", "CPU"),
    };
    context! { name => name, language => language, device => device }
}

pub(super) fn style_name(style: PromptStyle) -> &'static str {
    match style {
        PromptStyle::ZeroShot => "zero_shot",
        PromptStyle::OneShot => "one_shot",
        PromptStyle::FewShot => "few_shot",
    }
}

pub(super) fn precision_value(precision: Precision) -> Value {
    // Tolerances are KernelBench's allclose atol = rtol per precision.
    let (dtype, tolerance) = match precision {
        Precision::Fp32 => ("torch.float32", "1e-4"),
        Precision::Fp16 => ("torch.float16", "1e-2"),
        Precision::Bf16 => ("torch.bfloat16", "1e-2"),
    };
    context! { name => precision.as_str(), dtype => dtype, tolerance => tolerance }
}

/// A spec as display strings, so number formatting is decided here once (minijinja would print
/// `67.0` for a float) and templates only lay them out.
pub(super) fn spec_value(s: &gpu_specs::GpuSpec) -> Value {
    let tflops = |v: f64| format!("{v} TFLOP/s");
    let opt_tflops = |v: Option<f64>| match v {
        Some(v) => tflops(v),
        None => "not supported".to_string(),
    };
    context! {
        model => s.model,
        architecture => s.architecture,
        compute_capability => s.compute_capability,
        memory => format!("{} GB {}", s.memory_gb, s.memory_type),
        memory_bandwidth => format!("{} GB/s", s.memory_bandwidth_gbs),
        sm_count => s.sm_count.to_string(),
        fp32 => tflops(s.fp32_tflops),
        tf32 => opt_tflops(s.tf32_tflops),
        fp16 => tflops(s.fp16_tflops),
        bf16 => opt_tflops(s.bf16_tflops),
        l2 => format!("{} MB", s.l2_mb),
        shared_mem_per_sm => format!("{} KB", s.shared_mem_per_sm_kb),
        shared_mem_per_block => format!("{} KB", s.shared_mem_per_block_kb),
        registers_per_sm => s.registers_per_sm.to_string(),
        max_registers_per_thread => gpu_specs::MAX_REGISTERS_PER_THREAD.to_string(),
        max_threads_per_sm => s.max_threads_per_sm.to_string(),
        max_threads_per_block => gpu_specs::MAX_THREADS_PER_BLOCK.to_string(),
        warp_size => gpu_specs::WARP_SIZE.to_string(),
        note => s.note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_value_obeys_the_mode() {
        let entry = TurnFeedback {
            turn: 1,
            answer: Some("a".into()),
            code: Some("c".into()),
            execution: Some("e".into()),
            profile: Some("p".into()),
        };
        let g = entry_value(&entry, FeedbackMode::G);
        assert!(g.get_attr("execution").unwrap().is_none());
        assert!(g.get_attr("profile").unwrap().is_none());
        let ge = entry_value(&entry, FeedbackMode::GE);
        assert_eq!(ge.get_attr("execution").unwrap().as_str(), Some("e"));
        assert!(ge.get_attr("profile").unwrap().is_none());
        let gep = entry_value(&entry, FeedbackMode::GEP);
        assert_eq!(gep.get_attr("profile").unwrap().as_str(), Some("p"));
    }
}
