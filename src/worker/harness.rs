//! The Python harness, shipped inside the binary.
//!
//! One binary deploys everything: at run time the files are written into
//! `<cache>/harness-<digest>/`, where the digest covers every file's name and content, so two krefine
//! versions never share (or overwrite) each other's harness, and a second run reuses the folder.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::WorkerError;

/// The script the workers run (`python -u krefine_harness.py serve ...`).
pub const HARNESS_ENTRY: &str = "krefine_harness.py";

/// Every harness file: (file name, content).
pub const HARNESS_FILES: [(&str, &str); 33] = [
    (
        "krefine_harness.py",
        include_str!("../harness/krefine_harness.py"),
    ),
    ("kb_protocol.py", include_str!("../harness/kb_protocol.py")),
    ("kb_compile.py", include_str!("../harness/kb_compile.py")),
    ("kb_eval.py", include_str!("../harness/kb_eval.py")),
    ("kb_pool.py", include_str!("../harness/kb_pool.py")),
    (
        "kb_reference.py",
        include_str!("../harness/kb_reference.py"),
    ),
    ("kb_memory.py", include_str!("../harness/kb_memory.py")),
    ("kb_tensors.py", include_str!("../harness/kb_tensors.py")),
    (
        "kb_correctness.py",
        include_str!("../harness/kb_correctness.py"),
    ),
    (
        "kb_candidate.py",
        include_str!("../harness/kb_candidate.py"),
    ),
    ("kb_inputs.py", include_str!("../harness/kb_inputs.py")),
    ("kb_prepare.py", include_str!("../harness/kb_prepare.py")),
    ("kb_timing.py", include_str!("../harness/kb_timing.py")),
    ("kb_strict.py", include_str!("../harness/kb_strict.py")),
    ("kb_channel.py", include_str!("../harness/kb_channel.py")),
    ("kb_exchange.py", include_str!("../harness/kb_exchange.py")),
    ("kb_drive.py", include_str!("../harness/kb_drive.py")),
    ("kb_judge.py", include_str!("../harness/kb_judge.py")),
    (
        "kb_precision.py",
        include_str!("../harness/kb_precision.py"),
    ),
    ("kb_profile.py", include_str!("../harness/kb_profile.py")),
    ("kb_ncu.py", include_str!("../harness/kb_ncu.py")),
    ("kb_process.py", include_str!("../harness/kb_process.py")),
    ("kb_feedback.py", include_str!("../harness/kb_feedback.py")),
    ("kb_sandbox.py", include_str!("../harness/kb_sandbox.py")),
    ("kb_shm.py", include_str!("../harness/kb_shm.py")),
    ("kb_build.py", include_str!("../harness/kb_build.py")),
    ("kb_bench.py", include_str!("../harness/kb_bench.py")),
    ("kb_nvcc.py", include_str!("../harness/kb_nvcc.py")),
    ("kb_pch.py", include_str!("../harness/kb_pch.py")),
    ("kb_split.py", include_str!("../harness/kb_split.py")),
    ("kb_cusplit.py", include_str!("../harness/kb_cusplit.py")),
    ("kb_problem.py", include_str!("../harness/kb_problem.py")),
    ("kb_store.py", include_str!("../harness/kb_store.py")),
];

/// 12 hex digits of blake3 over every file's name and content.
pub fn harness_digest() -> &'static str {
    static DIGEST: OnceLock<String> = OnceLock::new();
    DIGEST.get_or_init(|| {
        let mut h = blake3::Hasher::new();
        for (name, content) in HARNESS_FILES {
            // Length prefixes keep (name, content) boundaries unambiguous.
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update(&(content.len() as u64).to_le_bytes());
            h.update(content.as_bytes());
        }
        h.finalize().to_hex()[..12].to_string()
    })
}

/// Write the harness into `<cache_dir>/harness-<digest>/` (files whose content already matches are left
/// alone) and return that folder.
pub async fn deploy_harness(cache_dir: &Path) -> Result<PathBuf, WorkerError> {
    let dir = cache_dir.join(format!("harness-{}", harness_digest()));
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| WorkerError::io("create harness folder", &dir, e))?;
    for (name, content) in HARNESS_FILES {
        let path = dir.join(name);
        match tokio::fs::read(&path).await {
            Ok(existing) if existing == content.as_bytes() => continue,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(WorkerError::io("read harness file", &path, e)),
        }
        // Write-then-rename: a concurrent krefine starting a worker never sees a half-written file.
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        tokio::fs::write(&tmp, content)
            .await
            .map_err(|e| WorkerError::io("write harness file", &tmp, e))?;
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(|e| WorkerError::io("install harness file", &path, e))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deploys_once_and_rewrites_changed_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = deploy_harness(tmp.path()).await.unwrap();
        assert!(dir.ends_with(format!("harness-{}", harness_digest())));
        for (name, content) in HARNESS_FILES {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), content);
        }
        let entry = dir.join(HARNESS_ENTRY);
        let before = std::fs::metadata(&entry).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        deploy_harness(tmp.path()).await.unwrap();
        assert_eq!(
            std::fs::metadata(&entry).unwrap().modified().unwrap(),
            before
        );
        std::fs::write(&entry, "tampered").unwrap();
        deploy_harness(tmp.path()).await.unwrap();
        assert_eq!(std::fs::read_to_string(&entry).unwrap(), HARNESS_FILES[0].1);
    }
}
