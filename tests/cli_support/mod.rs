//! What the tests that drive the `krefine` binary on CPU share: the repository, the workers' Python,
//! running the binary (a failure panics with its output), and small file helpers.
#![allow(dead_code, reason = "each test binary uses its own part")]
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with torch for workers (`KREFINE_TEST_PYTHON`, else the repository's `.venv`). A
/// missing one fails loudly: a silently skipped worker test proves nothing.
pub fn python() -> PathBuf {
    let p = std::env::var_os("KREFINE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(
        p.exists(),
        "no Python with torch at {}; set KREFINE_TEST_PYTHON",
        p.display()
    );
    p
}

pub fn krefine(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(args)
        .output()
        .expect("run krefine");
    if !o.status.success() {
        panic!(
            "krefine {args:?} failed ({}):\n{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    o
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}
