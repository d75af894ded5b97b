//! Worker environment scrubbing, with the real harness: secrets in the orchestrator's environment
//! must never be visible to a candidate, neither in a compile worker nor in an evaluation worker.
//!
//! Keep this the only test in this file: it sets environment variables of the test process, which is
//! only sound while no other thread runs.

mod worker_support;

use std::collections::HashMap;

use krefine::services::{Compiler, DeviceId, Executor};
use krefine::types::{CompileStatus, Verdict};
use krefine::worker::WorkerPool;
use worker_support::*;

const CANDIDATE: &str = r#"
import json, os
import torch.nn as nn

print("KREFINE_ENV_DUMP " + json.dumps(dict(os.environ)), flush=True)


class ModelNew(nn.Module):
    def forward(self, a, b):
        print("KREFINE_ENV_DUMP " + json.dumps(dict(os.environ)), flush=True)
        return a + b
"#;

const SECRETS: [&str; 4] = [
    "OPENAI_API_KEY",
    "HF_TOKEN",
    "KREFINE_TEST_CLIENT_SECRET",
    "KREFINE_TEST_UNLISTED",
];

fn dumps(text: &str) -> Vec<HashMap<String, String>> {
    text.lines()
        .filter_map(|l| l.split_once("KREFINE_ENV_DUMP "))
        .map(|(_, json)| serde_json::from_str(json).expect("env dump is JSON"))
        .collect()
}

#[test]
#[allow(
    unsafe_code,
    reason = "std::env::set_var is unsafe: it runs before any other thread"
)]
fn workers_cannot_see_orchestrator_secrets() {
    // SAFETY: this is the only test of this binary and the runtime is not built yet, so no other
    // thread reads the environment while it changes.
    unsafe {
        std::env::set_var("OPENAI_API_KEY", "sk-fake-must-not-leak");
        std::env::set_var("HF_TOKEN", "hf_fake_must_not_leak");
        std::env::set_var("KREFINE_TEST_CLIENT_SECRET", "fake");
        // Not a secret by name, but not on the allowlist either: must not pass.
        std::env::set_var("KREFINE_TEST_UNLISTED", "1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let work = tmp.path().join("work");
        let python = test_python().await;
        let harness = deployed_harness(tmp.path()).await;
        let settings = cpu_settings(python, harness, &work, &work.join("build-cache"));
        let scratch = settings.scratch_root.clone();
        let pool = WorkerPool::start(settings).await.expect("pool");

        let c = pool
            .compile(compile_job(CANDIDATE, &tmp.path().join("logs"), "env"))
            .await
            .unwrap();
        assert_eq!(c.status, CompileStatus::Ok, "{c:#?}");
        let e = pool
            .execute(exec_job(CANDIDATE, c.build_dir.clone()), &DeviceId::Cpu)
            .await
            .unwrap();
        assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
        pool.shutdown().await;

        let compile_log = std::fs::read_to_string(c.log_path.expect("log")).expect("compile log");
        let eval_log = std::fs::read_to_string(work.join("workers/cpu-0.log")).expect("worker log");
        let compile_env = dumps(&compile_log);
        let eval_env = dumps(&eval_log);
        assert!(!compile_env.is_empty(), "no dump in the compile log");
        assert!(!eval_env.is_empty(), "no dump in the worker log");
        for (role, envs) in [("compile-0", &compile_env), ("cpu-0", &eval_env)] {
            for env in envs {
                for secret in SECRETS {
                    assert!(!env.contains_key(secret), "{role} sees {secret}: {env:#?}");
                }
                // HOME and TMPDIR are the worker's own scratch, and for a candidate's process
                // (issue 35) a folder of its own inside it: no candidate sees another's files.
                let own = scratch.join(role);
                let home = env.get("HOME").map(std::path::PathBuf::from);
                assert!(
                    home.as_ref().is_some_and(|h| h.starts_with(&own)),
                    "{role}: HOME {home:?} outside {own:?}"
                );
                assert_eq!(
                    env.get("TMPDIR").map(std::path::PathBuf::from),
                    home,
                    "{role}"
                );
                if role == "cpu-0" {
                    assert!(
                        home.as_ref()
                            .is_some_and(|h| h.starts_with(own.join("candidates"))),
                        "{role}: a candidate's HOME {home:?} is not its own folder"
                    );
                }
                assert_eq!(
                    env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
                    Some(""),
                    "{role}: GPUs hidden"
                );
                assert!(env.contains_key("PATH"), "{role}");
                for (k, v) in env {
                    assert!(
                        !v.contains("must-not-leak") && !v.contains("must_not_leak"),
                        "{role}: {k} carries a secret value"
                    );
                }
            }
        }
    });
}
