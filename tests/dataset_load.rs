//! Loading problems from every supported layout, selections, and the error messages users see.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::fs;
use std::path::{Path, PathBuf};

use krefine::dataset::{DatasetError, Selection, load, parse_selection};
use krefine::types::ProblemKey;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dataset")
}

fn ids(problems: &[krefine::types::Problem]) -> Vec<u32> {
    problems.iter().map(|p| p.key.problem_id).collect()
}

fn names(problems: &[krefine::types::Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.name.as_str()).collect()
}

fn err_text(r: Result<Vec<krefine::types::Problem>, DatasetError>) -> String {
    match r {
        Ok(p) => panic!("expected an error, loaded {} problems", p.len()),
        Err(e) => e.to_string(),
    }
}

// ------------------------------------------------------------------------------------------------
// Layouts

#[test]
fn checkout_layout_loads_the_level_sorted_by_id() {
    let p = load(&fixtures().join("checkout"), 1, "all").unwrap();
    assert_eq!(ids(&p), vec![1, 2, 10]);
    assert_eq!(
        names(&p),
        vec![
            "1_Square_matrix_multiplication_.py",
            "2_ReLU.py",
            "10_Softmax.py"
        ]
    );
    assert_eq!(
        p[2].key,
        ProblemKey {
            level: 1,
            problem_id: 10
        }
    );
    assert!(p[2].code.contains("torch.softmax(x, dim=1)"));

    let l2 = load(&fixtures().join("checkout"), 2, "all").unwrap();
    assert_eq!(names(&l2), vec!["1_Conv2D_ReLU_BiasAdd.py"]);
    assert_eq!(l2[0].key.level, 2);
}

#[test]
fn levels_layout_and_kernelbench_folder_itself() {
    let p = load(&fixtures().join("levels"), 3, "all").unwrap();
    assert_eq!(names(&p), vec!["1_MLP.py"]);
    assert_eq!(p[0].key.level, 3);
    // The `KernelBench/` folder of a checkout is a levels folder too.
    let p = load(&fixtures().join("checkout/KernelBench"), 1, "2").unwrap();
    assert_eq!(names(&p), vec!["2_ReLU.py"]);
}

#[test]
fn flat_folder_uses_the_configured_level_and_ignores_other_files() {
    let p = load(&fixtures().join("flat"), 4, "all").unwrap();
    assert_eq!(names(&p), vec!["1_Abs.py", "3_Sigmoid.py"]);
    assert!(p.iter().all(|p| p.key.level == 4));
}

#[test]
fn jsonl_filters_by_level_and_normalises_names() {
    let path = fixtures().join("problems.jsonl");
    let p = load(&path, 1, "all").unwrap();
    assert_eq!(ids(&p), vec![1, 2]);
    // `file` wins; an HF-style `name` without `.py` gets it appended.
    assert_eq!(
        names(&p),
        vec!["1_Square_matrix_multiplication_.py", "2_ReLU.py"]
    );
    assert_eq!(p[0].code, "class Model:\n    # one\n    pass\n");
    let p = load(&path, 2, "all").unwrap();
    // A `name` that already ends in `.py` is kept as is.
    assert_eq!(names(&p), vec!["1_Conv2D_ReLU_BiasAdd.py"]);
}

#[test]
fn real_shared_dataset_has_100_100_50_20_problems() {
    // The KernelBench data sits beside the checkout (never inside it); KREFINE_KERNELBENCH_JSONL
    // points elsewhere.
    let path = std::env::var_os("KREFINE_KERNELBENCH_JSONL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/kernelbench/problems.jsonl")
        });
    let path = path.as_path();
    if !path.exists() {
        eprintln!("skipped: {} is absent", path.display());
        return;
    }
    let counts: Vec<usize> = (1..=4)
        .map(|level| load(path, level, "all").unwrap().len())
        .collect();
    assert_eq!(counts, vec![100, 100, 50, 20]);
    let l1 = load(path, 1, "1,19").unwrap();
    assert_eq!(
        names(&l1),
        vec!["1_Square_matrix_multiplication_.py", "19_ReLU.py"]
    );
}

// ------------------------------------------------------------------------------------------------
// Selections

#[test]
fn selections_parse_with_spaces_and_inclusive_ranges() {
    assert_eq!(parse_selection("all").unwrap(), Selection::All);
    assert_eq!(parse_selection(" ALL ").unwrap(), Selection::All);
    assert_eq!(
        parse_selection("1-10,42").unwrap(),
        Selection::Ids(vec![1..=10, 42..=42])
    );
    assert_eq!(
        parse_selection(" 1 - 3 , 7 ").unwrap(),
        Selection::Ids(vec![1..=3, 7..=7])
    );
    let s = parse_selection("1-3,7").unwrap();
    assert!(s.contains(1) && s.contains(3) && s.contains(7));
    assert!(!s.contains(4) && !s.contains(0));
    assert_eq!(s.to_string(), "1-3,7");
}

#[test]
fn malformed_selections_name_the_token() {
    let cases = [
        (
            "1-3,x",
            "invalid problem selection \"1-3,x\": \"x\": expected an id or an inclusive range like 3-7 (non-negative integers)",
        ),
        (
            "5-2",
            "invalid problem selection \"5-2\": \"5-2\": the range's start is greater than its end",
        ),
        (
            "1,,2",
            "invalid problem selection \"1,,2\": \"\": empty item (two commas in a row or a trailing comma)",
        ),
        (
            "-4",
            "invalid problem selection \"-4\": \"-4\": expected an id or an inclusive range like 3-7 (non-negative integers)",
        ),
        (
            "1 2",
            "invalid problem selection \"1 2\": \"1 2\": expected an id or an inclusive range like 3-7 (non-negative integers)",
        ),
        (
            " ",
            "invalid problem selection \" \": \"\": the selection is empty (use \"all\" or ids like \"1-10,42\")",
        ),
    ];
    for (sel, want) in cases {
        let e = parse_selection(sel).unwrap_err();
        assert_eq!(e.to_string(), want, "selection {sel:?}");
    }
}

#[test]
fn selection_picks_problems_and_unknown_ids_are_named() {
    let path = fixtures().join("checkout");
    let p = load(&path, 1, "10, 1").unwrap();
    assert_eq!(ids(&p), vec![1, 10]);
    let p = load(&path, 1, "1-2").unwrap();
    assert_eq!(ids(&p), vec![1, 2]);

    let e = err_text(load(&path, 1, "1-4,10-12,99"));
    assert_eq!(
        e,
        format!(
            "problem selection \"1-4,10-12,99\" names ids that level 1 of {} does not have: 3-4, 11-12, 99 (it has 1-2, 10)",
            path.display()
        )
    );
}

// ------------------------------------------------------------------------------------------------
// Errors

#[test]
fn missing_path_and_missing_level() {
    let missing = fixtures().join("nope");
    assert_eq!(
        err_text(load(&missing, 1, "all")),
        format!("dataset path {} does not exist", missing.display())
    );

    let checkout = fixtures().join("checkout");
    assert_eq!(
        err_text(load(&checkout, 3, "all")),
        format!(
            "dataset {0}: no level3/ folder (looked for {0}/KernelBench/level3 and {0}/level3); found level1, level2",
            checkout.display()
        )
    );
}

#[test]
fn file_without_numeric_prefix_is_named() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("1_A.py"), "class Model: pass\n").unwrap();
    fs::write(dir.path().join("helpers.py"), "x = 1\n").unwrap();
    let e = err_text(load(dir.path(), 1, "all"));
    assert_eq!(
        e,
        format!(
            "{}: file name does not start with a numeric problem id (expected `<id>_<name>.py`, like `19_ReLU.py`)",
            dir.path().join("helpers.py").display()
        )
    );
}

#[test]
fn duplicate_ids_in_a_folder_name_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let level = dir.path().join("level1");
    fs::create_dir(&level).unwrap();
    fs::write(level.join("7_Relu.py"), "class Model: pass\n").unwrap();
    fs::write(level.join("7_Relu_v2.py"), "class Model: pass\n").unwrap();
    let e = err_text(load(dir.path(), 1, "all"));
    assert_eq!(
        e,
        format!(
            "duplicate problem id 7 in level 1: {} and {}",
            level.join("7_Relu.py").display(),
            level.join("7_Relu_v2.py").display()
        )
    );
}

#[test]
fn empty_code_is_an_error_only_when_selected() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("1_A.py"), "class Model: pass\n").unwrap();
    fs::write(dir.path().join("2_Empty.py"), "  \n").unwrap();
    assert_eq!(ids(&load(dir.path(), 1, "1").unwrap()), vec![1]);
    assert_eq!(
        err_text(load(dir.path(), 1, "all")),
        format!(
            "{}: the problem's code is empty",
            dir.path().join("2_Empty.py").display()
        )
    );
}

#[test]
fn empty_folder_and_unsupported_file() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        err_text(load(dir.path(), 2, "all")),
        format!(
            "dataset {}: no problems of level 2 (no `<id>_<name>.py` files)",
            dir.path().display()
        )
    );
    let csv = dir.path().join("problems.csv");
    fs::write(&csv, "a,b\n").unwrap();
    assert_eq!(
        err_text(load(&csv, 1, "all")),
        format!("{} is neither a folder nor a .jsonl file", csv.display())
    );
}

fn jsonl(lines: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.jsonl");
    fs::write(&path, lines.join("\n")).unwrap();
    (dir, path)
}

#[test]
fn malformed_jsonl_lines_give_file_line_and_expectation() {
    let good = r#"{"level": 1, "problem_id": 1, "name": "1_A", "code": "x"}"#;
    let cases: [(&str, &str); 7] = [
        (
            "{not json",
            "expected a JSON object, but the line is not valid JSON (key must be a string at line 1 column 2)",
        ),
        (
            "[1, 2]",
            "expected a JSON object with level, problem_id, name, code",
        ),
        (
            r#"{"level": 1, "problem_id": 2, "name": "2_B"}"#,
            "missing field `code` (each line needs level, problem_id, name, code)",
        ),
        (
            r#"{"level": "1", "problem_id": 2, "name": "2_B", "code": "x"}"#,
            "`level` must be a non-negative integer, got \"1\"",
        ),
        (
            r#"{"level": 1, "problem_id": -2, "name": "2_B", "code": "x"}"#,
            "`problem_id` must be a non-negative integer, got -2",
        ),
        (
            r#"{"level": 1, "problem_id": 2, "name": 5, "code": "x"}"#,
            "`name` must be a string, got a number",
        ),
        (
            r#"{"level": 1, "problem_id": 2, "name": "", "code": "x"}"#,
            "`name` is empty",
        ),
    ];
    for (line, want) in cases {
        let (_dir, path) = jsonl(&[good, line]);
        let e = err_text(load(&path, 1, "all"));
        assert_eq!(e, format!("{}:2: {want}", path.display()), "line {line}");
    }
}

#[test]
fn jsonl_duplicates_name_both_lines_in_any_level() {
    let a = r#"{"level": 1, "problem_id": 1, "name": "1_A", "code": "x"}"#;
    let b = r#"{"level": 2, "problem_id": 4, "name": "4_B", "code": "x"}"#;
    let (_dir, path) = jsonl(&[a, b, "", a]);
    assert_eq!(
        err_text(load(&path, 1, "all")),
        format!(
            "duplicate problem id 1 in level 1: {0}:1 and {0}:4",
            path.display()
        )
    );
    let (_dir, path) = jsonl(&[b, a, b]);
    assert_eq!(
        err_text(load(&path, 1, "all")),
        format!(
            "duplicate problem id 4 in level 2: {0}:1 and {0}:3",
            path.display()
        )
    );
}

#[test]
fn jsonl_empty_code_names_the_line_and_missing_level_is_reported() {
    let (_dir, path) = jsonl(&[
        r#"{"level": 1, "problem_id": 1, "name": "1_A", "code": "x"}"#,
        r#"{"level": 1, "problem_id": 2, "name": "2_B", "code": ""}"#,
    ]);
    assert_eq!(
        err_text(load(&path, 1, "all")),
        format!("{}:2: the problem's code is empty", path.display())
    );
    assert_eq!(
        err_text(load(&path, 3, "all")),
        format!(
            "dataset {}: no problems of level 3 (no line has this level)",
            path.display()
        )
    );
}
