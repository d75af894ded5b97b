//! `prompt.backend` in a config file: the precision KernelBench forces for TileLang (fp16) and
//! ThunderKittens (bf16), taken when `eval.precision` is unset and an error when it contradicts;
//! the DSL backends refuse the CPU device.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use krefine::config::{self, Backend};
use krefine::types::Precision;

const MIN: &str = "[dataset]\npath = \"problems\"\n[model]\nprovider = \"scripted\"\nanswers = \"answers.jsonl\"\n";

fn load(extra: &str, sets: &[&str]) -> Result<config::Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exp.toml");
    std::fs::write(&path, format!("{MIN}{extra}")).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    config::load(&path, &sets)
        .map(|l| l.config)
        .map_err(|e| e.to_string())
}

#[test]
fn forced_precision_is_taken_when_unset() {
    let c = load("[prompt]\nbackend = \"tilelang\"\n", &[]).unwrap();
    assert_eq!(c.prompt.backend, Some(Backend::Tilelang));
    assert_eq!(c.eval.precision, Precision::Fp16);
    let c = load("", &["prompt.backend=thunderkittens"]).unwrap();
    assert_eq!(c.eval.precision, Precision::Bf16);
    // TileLang also runs in bf16 when asked.
    let c = load("", &["prompt.backend=tilelang", "eval.precision=bf16"]).unwrap();
    assert_eq!(c.eval.precision, Precision::Bf16);
    // The others force nothing.
    for backend in ["cuda", "triton", "cute"] {
        let c = load("", &[&format!("prompt.backend={backend}")]).unwrap();
        assert_eq!(c.eval.precision, Precision::Fp32, "{backend}");
    }
    let c = load("", &["prompt.backend=cute", "eval.precision=fp16"]).unwrap();
    assert_eq!(c.prompt.backend, Some(Backend::Cute));
    assert_eq!(c.eval.precision, Precision::Fp16);
}

#[test]
fn a_contradicting_precision_is_an_error_naming_the_key() {
    let e = load(
        "[prompt]\nbackend = \"tilelang\"\n[eval]\nprecision = \"fp32\"\n",
        &[],
    )
    .unwrap_err();
    assert!(e.contains("eval.precision"), "{e}");
    assert!(
        e.contains("prompt.backend = \"tilelang\" runs in fp16 or bf16 (KernelBench forces fp16), got \"fp32\""),
        "{e}"
    );
    let e = load(
        "",
        &["prompt.backend=thunderkittens", "eval.precision=fp16"],
    )
    .unwrap_err();
    assert!(
        e.contains("prompt.backend = \"thunderkittens\" runs in bf16 (KernelBench forces bf16), got \"fp16\""),
        "{e}"
    );
}

#[test]
fn dsl_backends_refuse_the_cpu_device() {
    for backend in ["cute", "tilelang", "thunderkittens"] {
        let e = load(
            "",
            &[
                &format!("prompt.backend={backend}"),
                "resources.devices=cpu",
            ],
        )
        .unwrap_err();
        assert!(e.contains("prompt.backend"), "{e}");
        assert!(
            e.contains(&format!(
                "\"{backend}\" kernels run on a CUDA GPU, but resources.devices = \"cpu\""
            )),
            "{e}"
        );
    }
    // Unchanged for the earlier backends.
    assert!(load("", &["prompt.backend=triton", "resources.devices=cpu"]).is_ok());
    let e = load("", &["prompt.backend=hip"]).unwrap_err();
    assert!(e.contains("backend"), "{e}");
}
