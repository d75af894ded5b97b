//! Finding the Python the workers run: the configured one; else, in this order, an activated virtual
//! environment (`$VIRTUAL_ENV`), the project's `.venv` (the nearest one walking up from the working
//! directory, then from the config file's folder, then from the krefine executable's folder, as in
//! `target/release/krefine` of a checkout), then `python3` and `python` on `PATH`. The first that
//! imports torch wins; the error lists every interpreter tried and why each failed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::WorkerError;

/// `import torch` can take tens of seconds on a cold file cache (CUDA wheels are large).
const CHECK_TIMEOUT: Duration = Duration::from_secs(120);
const NAMES: [&str; 2] = ["python3", "python"];

/// Where to look for an interpreter when none is configured.
#[derive(Debug, Clone, Default)]
pub struct PythonSearch {
    /// `$VIRTUAL_ENV`: an activated virtual environment.
    pub virtual_env: Option<PathBuf>,
    /// Folders to walk up from looking for `.venv/bin/python`, each with a label for messages.
    pub venv_roots: Vec<(String, PathBuf)>,
    /// `$PATH`.
    pub path: Option<OsString>,
}

impl PythonSearch {
    /// This process's environment: `$VIRTUAL_ENV`, the working directory, `config_dir` (the config
    /// file's folder, when there is one), the executable's folder, `$PATH`.
    pub fn from_env(config_dir: Option<&Path>) -> PythonSearch {
        let mut venv_roots = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            venv_roots.push(("the working directory".to_string(), cwd));
        }
        if let Some(dir) = config_dir
            && let Ok(dir) = std::path::absolute(dir)
        {
            venv_roots.push(("the config's folder".to_string(), dir));
        }
        if let Ok(exe) = std::env::current_exe()
            && let Some(dir) = exe.parent()
        {
            venv_roots.push((
                "the krefine executable's folder".to_string(),
                dir.to_path_buf(),
            ));
        }
        PythonSearch {
            virtual_env: std::env::var_os("VIRTUAL_ENV")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            venv_roots,
            path: std::env::var_os("PATH"),
        }
    }
}

/// The interpreter to run workers with (see the module docs for the search order). The returned
/// path is the interpreter's own `sys.executable`, so launcher shims (pyenv, asdf) that need the
/// orchestrator's environment are resolved here, before workers start with a scrubbed one.
pub async fn find_python(
    configured: Option<&Path>,
    config_dir: Option<&Path>,
) -> Result<PathBuf, WorkerError> {
    find_python_in(configured, &PythonSearch::from_env(config_dir)).await
}

/// [`find_python`] with the search given (testable without touching the process environment).
pub async fn find_python_in(
    configured: Option<&Path>,
    search: &PythonSearch,
) -> Result<PathBuf, WorkerError> {
    if let Some(python) = configured {
        return check_python(python)
            .await
            .map_err(|detail| WorkerError::PythonUnusable {
                python: python.to_path_buf(),
                detail,
            });
    }
    let mut tried: Vec<String> = Vec::new();
    // (label, interpreter) in the order they are tried; `None` when there is nothing to try there.
    let mut candidates: Vec<(String, Option<PathBuf>)> = Vec::new();
    if let Some(venv) = &search.virtual_env {
        let py = venv.join("bin/python");
        candidates.push((
            "$VIRTUAL_ENV".into(),
            is_executable(&py).await.then_some(py),
        ));
    }
    for (label, root) in &search.venv_roots {
        let mut found = None;
        for dir in root.ancestors() {
            let py = dir.join(".venv/bin/python");
            if is_executable(&py).await {
                found = Some(py);
                break;
            }
        }
        candidates.push((format!(".venv from {label}"), found));
    }
    for name in NAMES {
        candidates.push((
            format!("{name} on PATH"),
            which(name, search.path.as_deref()).await,
        ));
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    for (label, path) in candidates {
        let Some(path) = path else {
            tried.push(format!("{label} (none found)"));
            continue;
        };
        if seen.contains(&path) {
            continue;
        }
        seen.push(path.clone());
        match check_python(&path).await {
            Ok(resolved) => return Ok(resolved),
            Err(detail) => tried.push(format!("{label} ({}: {detail})", path.display())),
        }
    }
    Err(WorkerError::PythonNotFound {
        tried: tried.join("; "),
    })
}

async fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::metadata(path)
        .await
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
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
    for dir in std::env::split_paths(search_path?) {
        let candidate = dir.join(name);
        if is_executable(&candidate).await {
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

    fn on_path(path: OsString) -> PythonSearch {
        PythonSearch {
            path: Some(path),
            ..PythonSearch::default()
        }
    }

    #[tokio::test]
    async fn project_venv_and_virtual_env_come_before_path() {
        let tmp = tempfile::tempdir().unwrap();
        // PATH has a python3 without torch, as after `scripts/quickstart` without activating.
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        script(
            &bin,
            "python3",
            "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1",
        );
        // The project: configs/ below a checkout whose .venv has torch.
        let project = tmp.path().join("project");
        let venv_bin = project.join(".venv/bin");
        std::fs::create_dir_all(&venv_bin).unwrap();
        std::fs::create_dir_all(project.join("configs")).unwrap();
        script(&venv_bin, "python", "echo /project/.venv/bin/python");
        let mut search = PythonSearch {
            virtual_env: None,
            venv_roots: vec![
                ("the working directory".into(), tmp.path().join("elsewhere")),
                ("the config's folder".into(), project.join("configs")),
            ],
            path: Some(std::env::join_paths([&bin]).unwrap()),
        };
        let found = find_python_in(None, &search).await.unwrap();
        assert_eq!(found, PathBuf::from("/project/.venv/bin/python"));

        // An activated virtual environment comes first.
        let active = tmp.path().join("active");
        std::fs::create_dir_all(active.join("bin")).unwrap();
        script(&active.join("bin"), "python", "echo /active/bin/python");
        search.virtual_env = Some(active.clone());
        let found = find_python_in(None, &search).await.unwrap();
        assert_eq!(found, PathBuf::from("/active/bin/python"));

        // Nothing usable: every place is named with why it failed.
        std::fs::remove_dir_all(project.join(".venv")).unwrap();
        script(
            &active.join("bin"),
            "python",
            "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1",
        );
        let err = find_python_in(None, &search).await.unwrap_err().to_string();
        for part in [
            "$VIRTUAL_ENV (",
            ".venv from the working directory (none found)",
            ".venv from the config's folder (none found)",
            "python3 on PATH (",
            "python on PATH (none found)",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
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
        let found = find_python_in(None, &on_path(path)).await.unwrap();
        assert_eq!(found, PathBuf::from("/opt/real/bin/python3.12"));

        let only_a = std::env::join_paths([&a]).unwrap();
        let err = find_python_in(None, &on_path(only_a))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("python3 on PATH ("), "{err}");
        assert!(err.contains("No module named 'torch'"), "{err}");
        assert!(err.contains("python on PATH (none found)"), "{err}");

        let missing = tmp.path().join("nope/python3");
        let err = find_python_in(Some(&missing), &PythonSearch::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nope/python3") && err.contains("cannot run it"),
            "{err}"
        );
    }
}
