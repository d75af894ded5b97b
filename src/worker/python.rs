//! Finding the Python the workers run: the configured one, else the first `python3` / `python` on PATH
//! that imports torch.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::WorkerError;

/// `import torch` can take tens of seconds on a cold file cache (CUDA wheels are large).
const CHECK_TIMEOUT: Duration = Duration::from_secs(120);
const NAMES: [&str; 2] = ["python3", "python"];

/// The interpreter to run workers with. The returned path is the interpreter's own `sys.executable`,
/// so launcher shims (pyenv, asdf) that need the orchestrator's environment are resolved here, before
/// workers start with a scrubbed one.
pub async fn find_python(configured: Option<&Path>) -> Result<PathBuf, WorkerError> {
    find_python_on(configured, std::env::var_os("PATH")).await
}

/// [`find_python`] with the search path given (testable without touching the process environment).
pub async fn find_python_on(
    configured: Option<&Path>,
    search_path: Option<std::ffi::OsString>,
) -> Result<PathBuf, WorkerError> {
    if let Some(python) = configured {
        return check_python(python)
            .await
            .map_err(|detail| WorkerError::PythonUnusable {
                python: python.to_path_buf(),
                detail,
            });
    }
    let mut tried = Vec::new();
    for name in NAMES {
        let Some(path) = which(name, search_path.as_deref()).await else {
            tried.push(format!("{name} (not on PATH)"));
            continue;
        };
        match check_python(&path).await {
            Ok(resolved) => return Ok(resolved),
            Err(detail) => tried.push(format!("{name} ({}: {detail})", path.display())),
        }
    }
    Err(WorkerError::PythonNotFound {
        tried: tried.join("; "),
    })
}

/// Run `python -c "import sys, torch; print(sys.executable)"`; Ok(resolved interpreter) or why not.
pub async fn check_python(python: &Path) -> Result<PathBuf, String> {
    let child = tokio::process::Command::new(python)
        .args(["-c", "import sys, torch; print(sys.executable)"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let out = match tokio::time::timeout(CHECK_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("cannot run it: {e}")),
        Err(_) => {
            return Err(format!(
                "`import torch` did not finish within {} s",
                CHECK_TIMEOUT.as_secs()
            ));
        }
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no error output");
        return Err(format!("`import torch` failed ({}): {last}", out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let exe = stdout.lines().rev().find(|l| !l.trim().is_empty());
    Ok(match exe {
        Some(p) => PathBuf::from(p.trim()),
        // An embedded interpreter may report no executable; the path we ran is then the best answer.
        None => python.to_path_buf(),
    })
}

/// First executable file named `name` in PATH.
async fn which(name: &str, search_path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    for dir in std::env::split_paths(search_path?) {
        let candidate = dir.join(name);
        if let Ok(meta) = tokio::fs::metadata(&candidate).await
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Some(candidate);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[tokio::test]
    async fn first_python_that_imports_torch_wins_and_failures_are_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        script(
            &a,
            "python3",
            "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1",
        );
        script(&b, "python", "echo /opt/real/bin/python3.12");
        let path = std::env::join_paths([&a, &b]).unwrap();
        let found = find_python_on(None, Some(path)).await.unwrap();
        assert_eq!(found, PathBuf::from("/opt/real/bin/python3.12"));

        let only_a = std::env::join_paths([&a]).unwrap();
        let err = find_python_on(None, Some(only_a))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("python3 ("), "{err}");
        assert!(err.contains("No module named 'torch'"), "{err}");
        assert!(err.contains("python (not on PATH)"), "{err}");

        let missing = tmp.path().join("nope/python3");
        let err = find_python_on(Some(&missing), None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nope/python3") && err.contains("cannot run it"),
            "{err}"
        );
    }
}
