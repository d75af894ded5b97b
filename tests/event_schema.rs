//! The event log's schema version follows the set of event kinds: a reader older than a log must
//! say "written by a newer krefine" (it checks `v`), not stumble on an unknown `type`. Each version
//! pins its kinds here; changing the set without bumping `SCHEMA_VERSION` (and pinning the new
//! set) fails this test.

use krefine::types::SCHEMA_VERSION;

/// The event kinds (`type` of a record's event) of each schema version.
const KINDS: &[(u32, &[&str])] = &[
    (
        1,
        &[
            "run_started",
            "run_ended",
            "budget_exhausted",
            "llm_started",
            "llm_answered",
            "llm_failed",
            "compiled",
            "executed",
            "profiled",
            "llm_attempt",
            "llm_delta",
            "lease_granted",
            "lease_released",
        ],
    ),
    // deferred, llm_retry_wait and reference_prepared were added under version 1; version 2 names
    // them, and inputs_prepared (reference inputs made off the lease) and device_retired (a lost GPU),
    // new with it.
    (
        2,
        &[
            "run_started",
            "run_ended",
            "budget_exhausted",
            "llm_started",
            "llm_retry_wait",
            "llm_answered",
            "llm_failed",
            "compiled",
            "executed",
            "profiled",
            "llm_attempt",
            "llm_delta",
            "deferred",
            "lease_granted",
            "lease_released",
            "reference_prepared",
            "inputs_prepared",
            "device_retired",
        ],
    ),
];

/// `Event::Variant { .. } => "kind"` pairs of `Event::kind` (an exhaustive match: the compiler
/// makes it name every variant).
fn kinds_in_source() -> Vec<(String, String)> {
    let src = include_str!("../src/types/mod.rs");
    let start = src
        .find("pub fn kind(&self) -> &'static str {")
        .expect("Event::kind in src/types/mod.rs");
    let body = &src[start..];
    let body = &body[..body.find("\n    }\n").expect("end of Event::kind")];
    body.lines()
        .filter_map(|l| {
            let l = l.trim();
            let variant = l.strip_prefix("Event::")?.split([' ', '{', '(']).next()?;
            let kind = l.split("=> \"").nth(1)?.strip_suffix("\",")?;
            Some((variant.to_string(), kind.to_string()))
        })
        .collect()
}

fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn event_kinds_change_only_with_a_schema_version_bump() {
    let pairs = kinds_in_source();
    assert!(pairs.len() > 10, "parsed {pairs:?}");
    // `kind()` names what serde writes (`rename_all = "snake_case"`).
    for (variant, kind) in &pairs {
        assert_eq!(&snake_case(variant), kind, "Event::{variant}");
    }
    let mut now: Vec<&str> = pairs.iter().map(|(_, k)| k.as_str()).collect();
    now.sort_unstable();
    let (latest, pinned) = KINDS.last().unwrap();
    let mut pinned: Vec<&str> = pinned.to_vec();
    pinned.sort_unstable();
    assert_eq!(
        (SCHEMA_VERSION, &now),
        (*latest, &pinned),
        "the event kinds changed: bump SCHEMA_VERSION in src/types/mod.rs and pin the new set in \
         tests/event_schema.rs"
    );
}
