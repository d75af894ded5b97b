//! The pool on a real GPU: CUDA builds in GPU-less compile workers (arch list from the device),
//! cuda_event timing, a profile, a sticky illegal-address error, and a kernel that never ends.
//!
//! Needs a CUDA GPU and a Python with torch and nvcc, so it is ignored by default. On a GPU machine:
//! `KREFINE_TEST_PYTHON=$(command -v python3) <test binary> --ignored --nocapture`.

mod worker_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use krefine::config::Timeouts;
use krefine::services::{Compiler, DeviceId, ExecJob, Executor};
use krefine::types::{CompileStatus, Problem, ProblemKey, TaskId, Verdict};
use krefine::worker::{WorkerPool, WorkerSettings};
use worker_support::*;

const PROBLEM: &str = r#"
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.rand(4096, 4096), torch.rand(4096, 4096)]


def get_init_inputs():
    return []
"#;

/// A CUDA candidate; `body` is the kernel's statement for element `i`.
fn cuda_candidate(name: &str, body: &str) -> String {
    format!(
        r#"
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r'''
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* o, int64_t n) {{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {{ {body} }}
}}

torch::Tensor add(torch::Tensor a, torch::Tensor b) {{
    auto o = torch::empty_like(a);
    int64_t n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), o.data_ptr<float>(), n);
    return o;
}}
'''

ext = load_inline(
    name="{name}",
    cpp_sources="torch::Tensor add(torch::Tensor a, torch::Tensor b);",
    cuda_sources=cuda_src,
    functions=["add"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.add(a.contiguous(), b.contiguous())
"#
    )
}

fn job(code: &str, build_dir: Option<String>) -> ExecJob {
    let key = ProblemKey {
        level: 1,
        problem_id: 901,
    };
    ExecJob {
        task: TaskId {
            problem: key,
            sample: 0,
        },
        turn: 0,
        problem: Arc::new(Problem {
            key,
            name: "901_gpu_add.py".into(),
            code: PROBLEM.into(),
        }),
        code: code.into(),
        build_dir,
    }
}

/// A pool on GPU 0 with three compile workers, GPU-sized timeouts and the GPU's arch list.
async fn gpu_pool(tmp: &std::path::Path) -> Arc<WorkerPool> {
    let work = tmp.join("work");
    let python = test_python().await;
    let harness = deployed_harness(tmp).await;
    let mut s = WorkerSettings::new(python, harness, &work);
    s.devices = vec![DeviceId::Gpu(0)];
    s.compile_workers = 3;
    s.timeouts = Timeouts {
        compile_s: 300.0,
        load_s: 120.0,
        reference_s: 600.0,
        execute_s: 30.0,
        profile_s: 120.0,
    };
    let t = Instant::now();
    let pool = WorkerPool::start(s).await.expect("pool");
    eprintln!(
        "pool started in {:.1} s; torch {}, arch list {:?}",
        t.elapsed().as_secs_f64(),
        pool.torch_version(),
        pool.arch_list()
    );
    assert!(pool.arch_list().is_some(), "arch list from the GPU");
    pool
}

/// Three CUDA candidates: a correct one, one that stores to an illegal address, one whose kernel
/// never ends.
fn candidates() -> (String, String, String) {
    let ok = cuda_candidate("krefine_gpu_ok", "o[i] = a[i] + b[i];");
    // A store through a null pointer may be optimised away (undefined behaviour); a volatile store
    // to an unmapped high address cannot be.
    let bad = cuda_candidate(
        "krefine_gpu_bad",
        "((volatile float*)0xFFFFFFFF00000000ULL)[i] = a[i] + b[i];",
    );
    let hang = cuda_candidate(
        "krefine_gpu_hang",
        // Inputs are in [0, 1): the volatile load never lets the loop end, and cannot be
        // optimised away (an empty side-effect-free loop can be).
        "while (*((volatile const float*)a) >= 0.0f) {} o[i] = a[i];",
    );
    (ok, bad, hang)
}

#[test]
#[ignore = "needs a CUDA GPU; run with --ignored on a GPU machine"]
fn gpu_pool_end_to_end() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pool = gpu_pool(tmp.path()).await;
        let (ok, bad, hang) = candidates();
        let logs = tmp.path().join("logs");
        let t = Instant::now();
        let (c_ok, c_bad, c_hang) = tokio::join!(
            async { pool.compile(compile_job(&ok, &logs, "ok")).await.unwrap() },
            async { pool.compile(compile_job(&bad, &logs, "bad")).await.unwrap() },
            async {
                pool.compile(compile_job(&hang, &logs, "hang"))
                    .await
                    .unwrap()
            },
        );
        eprintln!(
            "3 CUDA compiles in parallel: {:.1} s ({} / {} / {} ms)",
            t.elapsed().as_secs_f64(),
            c_ok.duration_ms,
            c_bad.duration_ms,
            c_hang.duration_ms
        );
        for c in [&c_ok, &c_bad, &c_hang] {
            assert_eq!(c.status, CompileStatus::Ok, "{c:#?}");
        }

        let gpu = DeviceId::Gpu(0);
        let run_ok = |label: &'static str| {
            let pool = &pool;
            let ok = &ok;
            let dir = c_ok.build_dir.clone();
            async move {
                let t = Instant::now();
                let e = pool.execute(job(ok, dir), &DeviceId::Gpu(0)).await.unwrap();
                eprintln!(
                    "{label}: {} in {:.2} s (runtime {:.3} ms, ref {:.3} ms, phases {:?})",
                    e.verdict,
                    t.elapsed().as_secs_f64(),
                    e.runtime_ms,
                    e.ref_runtime_ms,
                    e.phases
                );
                assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
                e
            }
        };

        let first = run_ok("ok (first, builds the reference)").await;
        assert_eq!(first.env.timing_method.as_deref(), Some("cuda_event"));
        assert!(first.env.device_name.contains("NVIDIA"), "{:?}", first.env);
        assert_eq!(first.device, "cuda:0");
        assert_eq!(
            first.metadata.get("device").and_then(|v| v.as_str()),
            Some("cuda:0")
        );
        let again = run_ok("ok (second, cached reference)").await;
        assert_eq!(again.ref_source.as_deref(), Some("cached"));

        let t = Instant::now();
        let p = pool
            .profile(job(&ok, c_ok.build_dir.clone()), &gpu)
            .await
            .unwrap();
        eprintln!("profile: ok={} in {:.2} s", p.ok, t.elapsed().as_secs_f64());
        assert!(p.ok, "{p:#?}");
        assert!(p.table.contains("add_kernel"), "{}", p.table);

        let before = pool.worker_pids().await;
        let t = Instant::now();
        let e = pool
            .execute(job(&bad, c_bad.build_dir.clone()), &gpu)
            .await
            .unwrap();
        eprintln!(
            "illegal address: {} in {:.2} s\n{}",
            e.verdict,
            t.elapsed().as_secs_f64(),
            e.feedback
        );
        assert_eq!(e.verdict, Verdict::CudaError, "{e:#?}");
        run_ok("ok after the sticky error").await;
        let after = pool.worker_pids().await;
        assert_ne!(
            before, after,
            "the poisoned GPU worker must have been replaced"
        );

        let before = pool.worker_pids().await;
        let t = Instant::now();
        let e = pool
            .execute(job(&hang, c_hang.build_dir.clone()), &gpu)
            .await
            .unwrap();
        eprintln!(
            "endless kernel: {} in {:.2} s: {}",
            e.verdict,
            t.elapsed().as_secs_f64(),
            e.feedback
        );
        assert_eq!(e.verdict, Verdict::Timeout, "{e:#?}");
        // The killed worker (its kernel still spinning when it died) must really be gone.
        let now = pool.worker_pids().await;
        let killed: Vec<u32> = before.into_iter().filter(|p| !now.contains(p)).collect();
        assert_eq!(killed.len(), 1, "exactly the GPU worker was killed");
        let t = Instant::now();
        let left = wait_gone(&killed, Duration::from_secs(30)).await;
        eprintln!(
            "killed GPU worker {killed:?} gone after {:.2} s (left: {left:?})",
            t.elapsed().as_secs_f64()
        );
        assert!(left.is_empty(), "the killed GPU worker lingers: {left:?}");
        run_ok("ok after the endless kernel").await;

        let t = Instant::now();
        let cached = pool
            .compile(compile_job(&ok, &logs, "ok-again"))
            .await
            .unwrap();
        assert!(cached.cached && t.elapsed() < Duration::from_secs(1));

        let pids = pool.worker_pids().await;
        drop(pool);
        let survivors = wait_gone(&pids, Duration::from_secs(15)).await;
        assert!(survivors.is_empty(), "survivors: {survivors:?}");
    });
}
