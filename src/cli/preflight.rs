//! What a config's inputs are checked for before anything runs, by `krefine run` (which refuses to
//! start) and `krefine doctor CONFIG` (which lists every finding): the dataset loads and selects
//! problems, and a scripted provider's answers file reads and holds an answer for every turn the run
//! plans (a missing one would be a silently empty answer). Each check names the file and the key.

use std::collections::BTreeSet;
use std::path::Path;

use crate::config::{LoadedConfig, Provider};
use crate::types::{Problem, ProblemKey};

/// One input and what was found of it.
pub(super) struct Finding {
    /// What was checked: `dataset.path`, `model.answers`, ...
    pub key: &'static str,
    /// `Ok(what it holds)` or `Err(what is wrong)`.
    pub result: Result<String, String>,
}

/// The problems of the config's dataset selection, or why there are none.
pub(super) fn problems(loaded: &LoadedConfig) -> Result<Vec<Problem>, String> {
    let cfg = &loaded.config;
    let path = loaded.resolve(&cfg.dataset.path);
    let problems = crate::dataset::load(&path, cfg.dataset.level, &cfg.dataset.problems)
        .map_err(|e| e.to_string())?;
    if problems.is_empty() {
        return Err(format!(
            "dataset {}: the selection {:?} of level {} has no problems",
            path.display(),
            cfg.dataset.problems,
            cfg.dataset.level
        ));
    }
    Ok(problems)
}

/// The turns a scripted answers file answers: (problem, sample, turn).
type AnswerKeys = BTreeSet<(ProblemKey, u32, u32)>;

/// The keys of a scripted answers file, and whether its answers are served generations (`krefine
/// eval`, where a missing sample counts as failed by design).
fn answer_keys(path: &Path) -> Result<(AnswerKeys, bool), String> {
    // The provider's own reader says what is wrong with a line (file, line, field).
    crate::llm::scripted::ScriptedLlm::load(path).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read scripted answers {}: {e}", path.display()))?;
    let mut keys = BTreeSet::new();
    let mut served = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let problem = v["problem"].as_str().and_then(|p| p.parse().ok());
        let sample = v["sample"].as_u64().unwrap_or(0) as u32;
        let turn = v["turn"].as_u64().unwrap_or(0) as u32;
        served |= v["served"].as_bool().unwrap_or(false);
        if let Some(problem) = problem {
            keys.insert((problem, sample, turn));
        }
    }
    Ok((keys, served))
}

/// Whether the scripted provider's answers file holds an answer for every turn of every task the
/// run plans on `problems`: `Ok(None)` for other providers and served generations, `Ok(Some(how
/// many answers))` when it does, else the missing ones.
pub(super) fn scripted_answers(
    loaded: &LoadedConfig,
    problems: &[Problem],
) -> Result<Option<String>, String> {
    let cfg = &loaded.config;
    if cfg.model.provider != Provider::Scripted {
        return Ok(None);
    }
    let Some(answers) = cfg.model.answers.as_deref() else {
        return Err("model.provider = \"scripted\" needs model.answers".into());
    };
    let path = loaded.resolve(answers);
    let (keys, served) = answer_keys(&path)?;
    if served {
        return Ok(None);
    }
    let (samples, turns) = (
        cfg.method.samples_per_problem(),
        cfg.method.turns_per_task(),
    );
    let missing: Vec<String> = problems
        .iter()
        .flat_map(|p| (0..samples).flat_map(move |s| (1..=turns).map(move |t| (p.key, s, t))))
        .filter(|k| !keys.contains(k))
        .map(|(p, s, t)| format!("problem {p} sample {s} turn {t}"))
        .collect();
    if missing.is_empty() {
        return Ok(Some(format!(
            "{}: an answer for each of the {} planned turn(s)",
            path.display(),
            problems.len() as u32 * samples * turns
        )));
    }
    let shown = missing
        .iter()
        .take(5)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    let more = match missing.len() {
        n if n > 5 => format!(" and {} more", n - 5),
        _ => String::new(),
    };
    Err(format!(
        "model.answers {} has no answer for {shown}{more}: every planned turn needs one (the run \
         would send that turn an empty answer)",
        path.display()
    ))
}

/// Every input check of the config, for `doctor`.
pub(super) fn inputs(loaded: &LoadedConfig) -> Vec<Finding> {
    let cfg = &loaded.config;
    let mut out = Vec::new();
    let problems = problems(loaded);
    out.push(Finding {
        key: "dataset.path",
        result: problems.as_ref().map_err(Clone::clone).map(|p| {
            format!(
                "{}: {} problem(s) of level {} ({})",
                loaded.resolve(&cfg.dataset.path).display(),
                p.len(),
                cfg.dataset.level,
                cfg.dataset.problems
            )
        }),
    });
    if cfg.model.provider == Provider::Scripted {
        let result = match &problems {
            Ok(p) => scripted_answers(loaded, p).map(|s| s.unwrap_or_default()),
            // Without problems only the file itself can be checked.
            Err(_) => match cfg.model.answers.as_deref().map(|a| loaded.resolve(a)) {
                Some(path) => answer_keys(&path)
                    .map(|(k, _)| format!("{}: {} answer(s)", path.display(), k.len())),
                None => Err("model.provider = \"scripted\" needs model.answers".into()),
            },
        };
        out.push(Finding {
            key: "model.answers",
            result,
        });
    }
    if cfg.model.provider == Provider::Replay
        && let Some(run) = cfg.model.replay_run.as_deref()
    {
        let path = crate::store::events_path(&loaded.resolve(run));
        out.push(Finding {
            key: "model.replay_run",
            result: match crate::store::read_log(&path) {
                Ok(log) => Ok(format!(
                    "{}: {} record(s)",
                    path.display(),
                    log.records.len()
                )),
                Err(e) => Err(e.to_string()),
            },
        });
    }
    let files: [(&'static str, Option<&Path>, bool); 2] = [
        ("eval.baseline", cfg.eval.baseline.as_deref(), false),
        ("prompt.templates", cfg.prompt.templates.as_deref(), true),
    ];
    for (key, given, folder) in files {
        let Some(given) = given else { continue };
        let path = loaded.resolve(given);
        let ok = if folder {
            path.is_dir()
        } else {
            path.is_file()
        };
        out.push(Finding {
            key,
            result: if ok {
                Ok(path.display().to_string())
            } else {
                Err(format!(
                    "{key} {}: no such {}",
                    path.display(),
                    if folder { "folder" } else { "file" }
                ))
            },
        });
    }
    out
}
