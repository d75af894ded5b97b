//! The golden protocol fixtures (tests/fixtures/protocol/*.json, shared with the harness's tests):
//! every message parses into the Rust types, and serializing it back gives the same JSON, so field
//! names and shapes match exactly on both sides.

use std::collections::BTreeSet;
use std::path::PathBuf;

use krefine::worker::protocol::{
    Request, RequestBody, Response, ResponseBody, WorkerRole, parse_response_value,
};
use serde_json::Value;

fn fixtures() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/protocol");
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("protocol fixtures missing at {}: {e}", dir.display()));
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path).expect("read fixture");
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
        out.push((name, value));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no fixtures in {}", dir.display());
    out
}

/// First difference between two JSON values (numbers compare as f64: `14` and `14.0` are one value
/// on the wire), as a path and a description.
fn json_diff(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            (x.as_f64() != y.as_f64()).then(|| format!("{path}: {x} vs {y}"))
        }
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()).collect::<BTreeSet<_>>() {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => {
                        if let Some(d) = json_diff(&p, u, v) {
                            return Some(d);
                        }
                    }
                    (Some(_), None) => return Some(format!("{p}: only in the fixture")),
                    (None, Some(_)) => return Some(format!("{p}: only in the Rust output")),
                    (None, None) => {}
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Some(format!("{path}: {} vs {} items", x.len(), y.len()));
            }
            x.iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (u, v))| json_diff(&format!("{path}[{i}]"), u, v))
        }
        _ => (a != b).then(|| format!("{path}: {a} vs {b}")),
    }
}

#[test]
fn every_fixture_round_trips_through_the_rust_types() {
    let mut ops = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    for (name, value) in fixtures() {
        let back = if value.get("op").is_some() {
            let req: Request = serde_json::from_value(value.clone())
                .unwrap_or_else(|e| panic!("{name}: not a request: {e}"));
            ops.insert(req.body.op());
            serde_json::to_value(&req).expect("serialize request")
        } else {
            let resp = parse_response_value(value.clone())
                .unwrap_or_else(|e| panic!("{name}: not a response: {e}"));
            kinds.insert(match &resp {
                Response::Ok(r) => r.body.kind(),
                Response::Error(_) => "error",
            });
            resp.to_value().expect("serialize response")
        };
        if let Some(diff) = json_diff("$", &value, &back) {
            panic!("{name} does not round-trip: {diff}");
        }
    }
    let want_ops = BTreeSet::from([
        "compile",
        "prepare",
        "evaluate",
        "profile",
        "warm_headers",
        "shutdown",
    ]);
    let want_kinds = BTreeSet::from([
        "ready",
        "compile",
        "prepare",
        "progress",
        "evaluate",
        "profile",
        "warm_headers",
        "shutdown",
        "error",
    ]);
    assert_eq!(ops, want_ops, "fixtures must cover every request");
    assert_eq!(kinds, want_kinds, "fixtures must cover every response");
}

#[test]
fn fixtures_carry_the_values_we_rely_on() {
    for (name, value) in fixtures() {
        match name.as_str() {
            "ready.json" => {
                let Ok(Response::Ok(r)) = parse_response_value(value) else {
                    panic!("{name}")
                };
                let ResponseBody::Ready(ready) = r.body else {
                    panic!("{name}")
                };
                assert_eq!((r.id, ready.role), (0, WorkerRole::Compile));
                assert!(!ready.torch.is_empty());
            }
            "ready_gpu.json" => {
                let Ok(Response::Ok(r)) = parse_response_value(value) else {
                    panic!("{name}")
                };
                let ResponseBody::Ready(ready) = r.body else {
                    panic!("{name}")
                };
                // Where it runs: host, Slurm job and step, GPU UUID, toolchain.
                let p = ready.placement.expect("placement");
                assert_eq!(p.slurm_job_id.as_deref(), Some("4242"));
                assert_eq!(p.slurm_step_id.as_deref(), Some("3"));
                assert!(p.gpu_uuid.is_some_and(|u| u.starts_with("GPU-")));
                assert!(p.toolchain.is_some_and(|t| t.contains("cuda 13.0")));
            }
            "evaluate_request_baseline.json" => {
                let req: Request = serde_json::from_value(value).expect(&name);
                let RequestBody::Evaluate(e) = req.body else {
                    panic!("{name}")
                };
                let rr = e
                    .reference
                    .reference_runtime
                    .expect("baseline reference runtime");
                assert!(rr.source.starts_with("baseline:"), "{}", rr.source);
            }
            "evaluate_response_incorrect.json" => {
                let Ok(Response::Ok(r)) = parse_response_value(value) else {
                    panic!("{name}")
                };
                let ResponseBody::Evaluate(e) = r.body else {
                    panic!("{name}")
                };
                assert!(e.runtime_stats.is_none() && e.ref_runtime_stats.is_none());
                assert_eq!(e.runtime, -1.0);
            }
            "error_response.json" => {
                let Ok(Response::Error(e)) = parse_response_value(value) else {
                    panic!("{name}")
                };
                assert!(!e.ok && !e.error.is_empty());
            }
            _ => {}
        }
    }
}
