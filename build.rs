//! Records the git commit krefine was built from (`KREFINE_GIT_COMMIT`), for the provenance every
//! report carries. Builds outside a git checkout (a crates.io package, a tarball) record "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=KREFINE_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (checkouts) and the branch it points at (commits). Only
    // files that exist: cargo reruns the script on every build for a missing one.
    let mut watch = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watch.push(format!("{dir}/HEAD"));
    }
    if let (Some(common), Some(branch)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        watch.push(format!("{common}/{branch}"));
        watch.push(format!("{common}/packed-refs"));
    }
    for path in watch.iter().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
