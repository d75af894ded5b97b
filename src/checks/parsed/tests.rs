//! Exact findings of the parsed layer on each spelling of issue 23's tricks, in both modes; no
//! finding on honest candidates; no panic on any text.

use proptest::prelude::*;

use super::check;
use crate::checks::tests::{CLEAN, E, W, faithful, strict, with_hack};

/// (hack appended to the clean candidate, the strict findings as (category, line offset)).
/// Each finding comes from the parsed layer unless the comment says a regex rule also sees it.
const SPELLINGS: &[(&str, &[(&str, u32)])] = &[
    // The four spellings named in issue 23.
    (
        "import sys\nframe = getattr(sys, \"_get\" + \"frame\")(1)\n",
        &[("introspection", 1)],
    ),
    (
        "type.__setattr__(torch.cuda.Event, \"elapsed_time\", lambda s, e: 0.1)\n",
        &[("timing_patch", 0)],
    ),
    (
        "torch.__dict__.update(allclose=lambda *a, **k: True)\n",
        &[("introspection", 0)],
    ),
    (
        "worker = __import__(\"thre\" + \"ading\")\n",
        &[("thread_injection", 0)],
    ),
    // Frames through folded names.
    (
        "import sys\nf = getattr(sys, \"emarfteg_\"[::-1])\n",
        &[("introspection", 1)],
    ),
    (
        "name = \"%s%s\" % (\"f_\", \"back\")\ndef peek(frame):\n    return getattr(frame, name)\n",
        &[("introspection", 0), ("introspection", 2)],
    ),
    (
        "def peek(gen):\n    return getattr(gen, \"gi_\" + \"frame\")\n",
        &[("introspection", 1)],
    ),
    (
        "import inspect as ins\nstack = ins.stack()\n",
        // line 0: the regex rule sees `inspect` too.
        &[("introspection", 0), ("introspection", 1)],
    ),
    (
        "import sys\nget = sys.__dict__[\"_get\" \"frame\"]\n",
        &[("introspection", 1)],
    ),
    // The garbage collector through an alias and a from-import.
    (
        "import gc as g\nleak = g.get_objects()\n",
        &[("introspection", 1)],
    ),
    ("from gc import get_referrers\n", &[("introspection", 0)]),
    (
        "import gc\nrefs = getattr(gc, \"get_\" + \"referents\")\n",
        &[("introspection", 1)],
    ),
    // builtins, sys.modules and module namespaces.
    (
        "b = getattr(__import__(\"built\" + \"ins\"), \"open\")\n",
        &[("introspection", 0)],
    ),
    (
        "import sys\nt = sys.modules[\"thr\" \"eading\"]\n",
        // the regex rule sees `sys.modules`; the parsed layer the module it reaches.
        &[("thread_injection", 1), ("introspection", 1)],
    ),
    ("ns = vars(torch)\n", &[("introspection", 0)]),
    // Patching torch past the regex rules.
    (
        "object.__setattr__(torch.Tensor, \"add\", lambda *a: a[0])\n",
        &[("timing_patch", 0)],
    ),
    (
        "T = torch\nsetattr(T, \"allclose\", lambda *a, **k: True)\n",
        &[("timing_patch", 1)],
    ),
    // Imports of split or computed names.
    (
        "import importlib\nmp = importlib.import_module(\"\".join([\"multi\", \"processing\"]))\n",
        &[("thread_injection", 1)],
    ),
    (
        "def load(n):\n    return __import__(n)\n",
        &[("introspection", 1)],
    ),
    (
        "c = __import__(\"{}{}\".format(\"ct\", \"ypes\"))\n",
        &[("introspection", 0)],
    ),
    (
        "import os\npid = getattr(os, \"fo\" + \"rk\")()\n",
        &[("thread_injection", 1)],
    ),
    (
        "codes = [95, 103]\nx = getattr(torch, \"\".join(chr(c) for c in codes))\n",
        &[("introspection", 1)],
    ),
    // Code from strings, and a name assembled step by step.
    (
        "exec(\"im\" + \"port threading\")\n",
        &[("introspection", 0)],
    ),
    (
        "import sys\nn = \"_get\"\nn += \"frame\"\nf = getattr(sys, n)\n",
        &[("introspection", 3)],
    ),
];

fn expected(
    line: u32,
    found: &[(&'static str, u32)],
    severity: crate::types::Severity,
) -> Vec<(&'static str, Option<u32>, crate::types::Severity)> {
    found
        .iter()
        .map(|(c, off)| (*c, Some(line + off), severity))
        .collect()
}

#[test]
fn each_spelling_is_an_error_in_strict_mode() {
    for (hack, found) in SPELLINGS {
        let (code, line) = with_hack(hack);
        assert_eq!(strict(&code), expected(line, found, E), "{hack}");
    }
}

#[test]
fn each_spelling_is_a_warning_in_faithful_mode() {
    for (hack, found) in SPELLINGS {
        let (code, line) = with_hack(hack);
        assert_eq!(faithful(&code), expected(line, found, W), "{hack}");
    }
}

/// Honest candidates: the prompt examples, the tests' honest fixtures and KernelBench references.
const HONEST: &[(&str, &str)] = &[
    (
        "add_cpp",
        include_str!("../../../prompts/examples/add_cpp.py"),
    ),
    (
        "add_cuda",
        include_str!("../../../prompts/examples/add_cuda.py"),
    ),
    (
        "add_ref",
        include_str!("../../../prompts/examples/add_ref.py"),
    ),
    (
        "add_triton",
        include_str!("../../../prompts/examples/add_triton.py"),
    ),
    (
        "gelu_cuda",
        include_str!("../../../prompts/examples/gelu_cuda.py"),
    ),
    (
        "gelu_ref",
        include_str!("../../../prompts/examples/gelu_ref.py"),
    ),
    (
        "softmax_cuda",
        include_str!("../../../prompts/examples/softmax_cuda.py"),
    ),
    (
        "softmax_ref",
        include_str!("../../../prompts/examples/softmax_ref.py"),
    ),
    (
        "integrity/honest",
        include_str!("../../../tests/fixtures/integrity/honest.py"),
    ),
    (
        "static/false_positives",
        include_str!("../../../tests/fixtures/static/false_positives.py"),
    ),
    (
        "hostile/ok_cpp",
        include_str!("../../../tests/fixtures/hostile/ok_cpp.py"),
    ),
    (
        "hostile/problem_add",
        include_str!("../../../tests/fixtures/hostile/problem_add.py"),
    ),
    (
        "kernelbench/95_CrossEntropyLoss",
        include_str!("../../../tests/fixtures/kernelbench/level1/95_CrossEntropyLoss.py"),
    ),
    (
        "kernelbench/101_NLLLossMasked",
        include_str!("../../../tests/fixtures/kernelbench/level1/101_NLLLossMasked.py"),
    ),
];

/// The parsed layer's findings as (category, line) that the regex rules do not already make.
fn new_findings(code: &str) -> Vec<(&'static str, u32)> {
    use crate::checks::rules::{self, RuleContext};
    use crate::checks::source::Source;
    let src = Source::parse(code);
    let ctx = RuleContext {
        backend: crate::settings::Backend::Cuda,
        precision: crate::types::Precision::Fp32,
    };
    let regex: Vec<(&str, Option<u32>)> = rules::check(&src, &ctx)
        .into_iter()
        .map(|h| (h.category.name(), h.offset.map(|o| src.line(o))))
        .collect();
    check(code)
        .into_iter()
        .map(|h| (h.category.name(), h.offset.map(|o| src.line(o))))
        .filter(|f| !regex.contains(f))
        .map(|(c, l)| (c, l.unwrap_or(0)))
        .collect()
}

#[test]
fn honest_candidates_get_no_new_finding() {
    assert_eq!(check(CLEAN), vec![]);
    for (name, code) in HONEST {
        assert_eq!(new_findings(code), vec![], "{name}");
    }
    // integrity/honest.py caches its extension in `sys.modules`: the regex rule flags it already
    // (an error in strict mode), and the parsed layer adds nothing on other lines.
    let honest = HONEST[8].1;
    assert!(!check(honest).is_empty());
}

#[test]
fn folding_reads_each_constant_spelling() {
    use crate::checks::fold::{Folder, Value};
    use tree_sitter::Parser;
    let cases = [
        ("\"_get\" + \"frame\"", "_getframe"),
        ("\"\".join([\"thre\", \"ading\"])", "threading"),
        ("\"-\".join((\"a\", \"b\"))", "a-b"),
        ("\"%s_%s\" % (\"f\", \"back\")", "f_back"),
        ("\"%sframe\" % \"_get\"", "_getframe"),
        ("f\"gc\"", "gc"),
        ("f\"{{x}}\"", "{x}"),
        ("\"emarfteg_\"[::-1]", "_getframe"),
        ("\"_xgxextxfxrxaxmxex\"[::2]", "_getframe"),
        ("\"xx_getframe\"[2:]", "_getframe"),
        ("\"a\" \"b\" 'c'", "abc"),
        ("\"\\x5fgetframe\"", "_getframe"),
        ("r\"\\x\"", "\\x"),
        ("\"ab\" * 2", "abab"),
        ("chr(95) + \"x\"", "_x"),
        ("\"{}{}\".format(\"gi_\", \"frame\")", "gi_frame"),
        ("\"THREADING\".lower()", "threading"),
        ("\"\".join(reversed(\"cg\"))", "gc"),
        ("(\"f_\" + (\"loc\" + \"als\"))", "f_locals"),
    ];
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_python::LANGUAGE.into())
        .unwrap();
    for (expr, want) in cases {
        let code = format!("x = {expr}\n");
        let tree = parser.parse(&code, None).unwrap();
        let assignment = tree
            .root_node()
            .named_child(0)
            .unwrap()
            .named_child(0)
            .unwrap();
        let right = assignment.child_by_field_name("right").unwrap();
        let folder = Folder::new(code.as_bytes());
        assert_eq!(folder.fold(right), Some(Value::Str(want.into())), "{expr}");
    }
    for expr in [
        "f\"{name}\"",
        "\"a\" + name",
        "\"\\N{LOW LINE}\"",
        "\"%r\" % 1",
    ] {
        let code = format!("x = {expr}\n");
        let tree = parser.parse(&code, None).unwrap();
        let assignment = tree
            .root_node()
            .named_child(0)
            .unwrap()
            .named_child(0)
            .unwrap();
        let right = assignment.child_by_field_name("right").unwrap();
        assert_eq!(Folder::new(code.as_bytes()).fold(right), None, "{expr}");
    }
}

#[test]
fn deep_nesting_and_long_chains_are_bounded() {
    let deep = format!("x = {}1{}\n", "(".repeat(5000), ")".repeat(5000));
    let _ = check(&deep);
    // A chain too long to fold is a computed name, which is still a finding on `sys`.
    let chain: Vec<String> = (0..200).map(|_| "\"_\"".to_string()).collect();
    let code = format!("import sys\nf = getattr(sys, {})\n", chain.join(" + "));
    let hits = check(&code);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(
        hits[0].message.contains("computed at run time"),
        "{}",
        hits[0].message
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_parsed_layer_never_panics_on_arbitrary_text(code in "\\PC*") {
        let _ = check(&code);
    }

    #[test]
    fn the_parsed_layer_never_panics_on_python_like_text(
        code in "([a-z_]{1,8}|\"[a-z_]{0,6}\"|'[a-z]{0,3}'|f\"\\{?[a-z]{0,3}\\}?\"|[0-9]{1,3}|[-+*%\\[\\]():.,=\\n ]|::|getattr|__import__|sys|\\.join){0,60}"
    ) {
        let _ = check(&code);
    }
}

/// bench/gpu's hostile set with real CUDA kernels: the honest control (samples 0 and 7) and the
/// content memoiser (2, ordinary Python) pass strict mode's static checks; every other hack (the loop-state
/// tamperer, 8, included) fails them.
#[test]
fn the_gpu_hostile_set_is_rejected_and_the_control_passes() {
    let set: [(&str, bool); 9] = [
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_0_kernel.py"
            ),
            false,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_1_kernel.py"
            ),
            true,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_2_kernel.py"
            ),
            false,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_3_kernel.py"
            ),
            true,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_4_kernel.py"
            ),
            true,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_5_kernel.py"
            ),
            true,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_6_kernel.py"
            ),
            true,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_7_kernel.py"
            ),
            false,
        ),
        (
            include_str!(
                "../../../bench/gpu/candidates/strict/level_1_problem_1_sample_8_kernel.py"
            ),
            true,
        ),
    ];
    for (sample, (code, rejected)) in set.iter().enumerate() {
        let found = strict(code);
        assert_eq!(
            found.iter().any(|f| f.2 == E),
            *rejected,
            "sample {sample}: {found:?}"
        );
        if !rejected {
            assert_eq!(found, vec![], "sample {sample}");
        }
        assert!(faithful(code).iter().all(|f| f.2 == W), "sample {sample}");
    }
}
