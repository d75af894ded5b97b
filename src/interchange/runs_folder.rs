//! KernelBench's runs folder: `runs/<run>/level_{L}_problem_{P}_sample_{S}_kernel.py`, one file per
//! generated kernel (what `generate_samples.py` writes and `eval_from_generations.py` reads).

use std::path::Path;

use super::{Generation, Generations, Issue, parse_sample_key};

/// Read every `level_*_kernel.py` file of `dir`. Other files (KernelBench also writes prompts,
/// `eval_results.json`, ...) are skipped; any other Python file (`.py` in any case: the folder holds
/// kernels only), a file that names itself a kernel (`..._kernel.<anything>`), and a kernel file
/// that is unreadable or empty are each an issue naming it: a mistyped name
/// (`Level_1_...`, `level_1_problem_2_sample_0_kernel.PY`) is never skipped silently.
pub fn read(dir: &Path) -> Result<Generations, std::io::Error> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut g = Generations::default();
    for name in names {
        let lower = name.to_ascii_lowercase();
        let kernel_like = lower.ends_with(".py") || lower.contains("_kernel.");
        if !kernel_like {
            continue;
        }
        let issue = |message: String| Issue {
            key: name.clone(),
            message,
        };
        let Some(stem) = name
            .strip_suffix("_kernel.py")
            .filter(|_| name.starts_with("level_"))
        else {
            g.issues.push(issue(
                "not a kernel file name (expected level_<L>_problem_<P>_sample_<S>_kernel.py)"
                    .into(),
            ));
            continue;
        };
        let (problem, sample) = match parse_sample_key(stem) {
            Ok(k) => k,
            Err(m) => {
                g.issues
                    .push(issue(format!("bad file name: {m}_kernel.py")));
                continue;
            }
        };
        let code = match std::fs::read(dir.join(&name)) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(_) => {
                    g.issues.push(issue("not UTF-8 text".into()));
                    continue;
                }
            },
            Err(e) => {
                g.issues.push(issue(format!("cannot read: {e}")));
                continue;
            }
        };
        if code.trim().is_empty() {
            g.issues.push(issue("the file is empty".into()));
            continue;
        }
        g.items.push(Generation {
            problem,
            sample,
            code,
            origin: name,
        });
    }
    if g.items.is_empty() && g.issues.is_empty() {
        g.issues.push(Issue {
            key: "(folder)".into(),
            message: format!(
                "{} has no level_<L>_problem_<P>_sample_<S>_kernel.py files",
                dir.display()
            ),
        });
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kernel_files_and_names_bad_ones() {
        let d = tempfile::tempdir().unwrap();
        let w = |n: &str, t: &str| std::fs::write(d.path().join(n), t).unwrap();
        w("level_1_problem_2_sample_0_kernel.py", "code");
        w("level_1_problem_2_sample_1_kernel.py", "");
        w("level_1_problem_x_sample_0_kernel.py", "code");
        w("level_1_problem_3_sample_0.py", "code");
        w("eval_results.json", "{}");
        w("level_1_problem_2_sample_0_prompt.txt", "p");
        // Mistyped names: never skipped without a word.
        w("Level_1_problem_4_sample_0_kernel.py", "code");
        w("level_1_problem_5_sample_0_kernel.PY", "code");
        w("level_1_problem_6_sample_0_kernel.py.txt", "code");
        let g = read(d.path()).unwrap();
        assert_eq!(g.items.len(), 1);
        assert_eq!(g.items[0].origin, "level_1_problem_2_sample_0_kernel.py");
        let issues: Vec<String> = g.issues.iter().map(ToString::to_string).collect();
        let expected =
            "not a kernel file name (expected level_<L>_problem_<P>_sample_<S>_kernel.py)";
        assert_eq!(
            issues,
            vec![
                format!("Level_1_problem_4_sample_0_kernel.py: {expected}"),
                "level_1_problem_2_sample_1_kernel.py: the file is empty".to_string(),
                format!("level_1_problem_3_sample_0.py: {expected}"),
                format!("level_1_problem_5_sample_0_kernel.PY: {expected}"),
                format!("level_1_problem_6_sample_0_kernel.py.txt: {expected}"),
                "level_1_problem_x_sample_0_kernel.py: bad file name: problem id \"x\" is not a non-negative integer (expected level_<L>_problem_<P>_sample_<S>, like level_1_problem_19_sample_0)_kernel.py".to_string(),
            ]
        );
    }
}
