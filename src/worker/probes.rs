//! The precision probes' summaries (issue 36): what a problem's precision probe (kb_precision.py: the
//! reference's own error against float64 on signed inputs) came to, kept across runs so that its
//! float64 forward runs once per problem and kind of device, not once per worker and run (on an H200 a
//! transposed convolution's probe took 6-8 s of its first candidate's lease).
//!
//! A summary is what the worker itself reported in an evaluate response (`precision_probe`, a field
//! only the worker writes, never one a candidate's process sends); it goes back to the worker in every
//! later request of the problem on that kind of device (`ReferenceSpec::precision_probe`). Kept in
//! memory and, with a reference cache (`eval.reference_cache`), in `<cache>/precision-probes/<key>.json`
//! (written under a temporary name and renamed into place; a file that does not read as a summary is
//! ignored). The key holds everything the probe's figure depends on: the problem's code, the run's
//! precision, mode (TF32 in the reference), reference compilation, seed and input policy, the device's
//! name, torch and the harness itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex as StdMutex;

use super::protocol::{ProbeSummary, ReferenceSpec};

/// The folder of summaries in a reference cache (no entry of the input store: it has no manifest).
pub(super) const PROBES_DIR: &str = "precision-probes";
/// The summaries this pool knows, by key ([`ProbeSummaries::key`]).
pub(super) struct ProbeSummaries {
    /// `<reference cache>/precision-probes`, when the run has a reference cache.
    dir: Option<PathBuf>,
    known: StdMutex<HashMap<String, ProbeSummary>>,
}

impl ProbeSummaries {
    pub(super) fn new(reference_cache: Option<&Path>) -> ProbeSummaries {
        ProbeSummaries {
            dir: reference_cache.map(|c| c.join(PROBES_DIR)),
            known: StdMutex::new(HashMap::new()),
        }
    }

    /// The key of `spec`'s problem on a device named `hardware` with this torch and harness.
    pub(super) fn key(spec: &ReferenceSpec, hardware: &str, torch: &str, harness: &str) -> String {
        let mut h = blake3::Hasher::new();
        let seed = spec.seed.to_string();
        let cast = if spec.cast_integer_inputs {
            "cast"
        } else {
            "-"
        };
        // The reference's own settings: strict fp32 pins TF32 off, faithful keeps PyTorch's defaults.
        let compiled = serde_json::to_string(&spec.timing.reference_compile).unwrap_or_default();
        for part in [
            "probe-1",
            spec.problem.code.as_str(),
            spec.precision.as_str(),
            spec.mode.as_str(),
            &compiled,
            &seed,
            cast,
            spec.inputs.as_deref().unwrap_or("kernelbench"),
            hardware,
            torch,
            harness,
        ] {
            // Length prefixes keep the parts' boundaries unambiguous.
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().to_hex()[..24].to_string()
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, ProbeSummary>> {
        match self.known.lock() {
            Ok(k) => k,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The summary kept under `key`: this pool's, else the reference cache's (read once).
    pub(super) fn get(&self, key: &str) -> Option<ProbeSummary> {
        if let Some(s) = self.known().get(key) {
            return Some(s.clone());
        }
        let path = self.dir.as_ref()?.join(format!("{key}.json"));
        let summary = read_summary(&path)?;
        self.known().insert(key.to_string(), summary.clone());
        Some(summary)
    }

    /// Keep what a worker reported under `key` (a summary that is not one is dropped). Blocking file
    /// work runs off the runtime's threads; a failure to write only costs the next run the forward.
    pub(super) async fn record(&self, key: &str, summary: ProbeSummary) {
        if !summary.is_valid() {
            tracing::warn!("a worker reported a precision probe that is not one: {summary:?}");
            return;
        }
        if self
            .known()
            .insert(key.to_string(), summary.clone())
            .as_ref()
            == Some(&summary)
        {
            return;
        }
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let key = key.to_string();
        let written =
            tokio::task::spawn_blocking(move || write_summary(&dir, &key, &summary)).await;
        if let Ok(Err(e)) = written {
            tracing::warn!("could not keep a precision probe's summary: {e}");
        }
    }
}

/// A summary file, or None (missing, unreadable, not a valid summary).
fn read_summary(path: &Path) -> Option<ProbeSummary> {
    let text = std::fs::read(path).ok()?;
    let summary: ProbeSummary = serde_json::from_slice(&text).ok()?;
    summary.is_valid().then_some(summary)
}

fn write_summary(dir: &Path, key: &str, summary: &ProbeSummary) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{key}.tmp-{}", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec(summary).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, dir.join(format!("{key}.json")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::protocol::{ProblemSpec, TimingSpec};
    use proptest::prelude::*;

    fn spec(code: &str) -> ReferenceSpec {
        ReferenceSpec {
            problem: ProblemSpec {
                key: "1/70".into(),
                code: code.into(),
                code_hash: "h".into(),
            },
            device: "cuda:0".into(),
            precision: "fp32".into(),
            mode: "faithful".into(),
            seed: 42,
            correct_trials: 5,
            timing: TimingSpec {
                measure: true,
                warmup: 3,
                trials: 100,
                discard_first: 1,
                l2_flush: true,
                method: Default::default(),
                reference_compile: None,
            },
            reference_runtime: None,
            cast_integer_inputs: false,
            inputs: None,
            stored_inputs: None,
            tolerance: None,
            precision_probe: None,
        }
    }

    fn signed(e: f64) -> ProbeSummary {
        ProbeSummary {
            kind: Some("signed".into()),
            e_ref: Some(e),
            why: None,
        }
    }

    #[tokio::test]
    async fn a_summary_outlives_its_pool_and_only_serves_its_own_key() {
        let cache = tempfile::tempdir().unwrap();
        let key = ProbeSummaries::key(&spec("A"), "NVIDIA H200", "2.11.0", "h1");
        let first = ProbeSummaries::new(Some(cache.path()));
        first.record(&key, signed(3.2e-7)).await;
        assert_eq!(first.get(&key), Some(signed(3.2e-7)));
        // The next run's pool reads it from the reference cache.
        let next = ProbeSummaries::new(Some(cache.path()));
        assert_eq!(next.get(&key), Some(signed(3.2e-7)));
        // Another problem, device, torch, harness or seed: another key.
        let mut seeded = spec("A");
        seeded.seed = 7;
        let mut strict = spec("A");
        strict.mode = "strict".into();
        for other in [
            ProbeSummaries::key(&strict, "NVIDIA H200", "2.11.0", "h1"),
            ProbeSummaries::key(&spec("B"), "NVIDIA H200", "2.11.0", "h1"),
            ProbeSummaries::key(&spec("A"), "NVIDIA H100 80GB HBM3", "2.11.0", "h1"),
            ProbeSummaries::key(&spec("A"), "NVIDIA H200", "2.10.0", "h1"),
            ProbeSummaries::key(&spec("A"), "NVIDIA H200", "2.11.0", "h2"),
            ProbeSummaries::key(&seeded, "NVIDIA H200", "2.11.0", "h1"),
        ] {
            assert_ne!(other, key);
            assert_eq!(next.get(&other), None);
        }
        // Without a reference cache: this pool only.
        let alone = ProbeSummaries::new(None);
        alone.record(&key, signed(1e-6)).await;
        assert_eq!(alone.get(&key), Some(signed(1e-6)));
    }

    #[tokio::test]
    async fn a_summary_that_is_not_one_is_neither_kept_nor_read() {
        let cache = tempfile::tempdir().unwrap();
        let probes = ProbeSummaries::new(Some(cache.path()));
        for bad in [
            signed(f64::NAN),
            signed(0.5),
            signed(-1e-9),
            ProbeSummary {
                kind: Some("tf32".into()),
                e_ref: Some(1e-7),
                why: None,
            },
            ProbeSummary {
                kind: None,
                e_ref: None,
                why: Some(String::new()),
            },
            ProbeSummary {
                kind: Some("signed".into()),
                e_ref: Some(1e-7),
                why: Some("both".into()),
            },
        ] {
            probes.record("k", bad).await;
            assert_eq!(probes.get("k"), None);
        }
        let dir = cache.path().join(PROBES_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("k.json"),
            b"{\"kind\": \"signed\", \"e_ref\": \"x\"}",
        )
        .unwrap();
        assert_eq!(probes.get("k"), None);
        let why = ProbeSummary {
            kind: None,
            e_ref: None,
            why: Some("no floating-point inputs".into()),
        };
        probes.record("w", why.clone()).await;
        assert_eq!(ProbeSummaries::new(Some(cache.path())).get("w"), Some(why));
    }

    proptest! {
        #[test]
        fn any_file_reads_as_a_valid_summary_or_none(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("k.json");
            std::fs::write(&path, &bytes).unwrap();
            if let Some(s) = read_summary(&path) {
                prop_assert!(s.is_valid());
            }
        }

        #[test]
        fn any_summary_json_reads_back_only_when_valid(
            kind in proptest::option::of("(signed|kernelbench|[a-z]{0,8})"),
            e_ref in proptest::option::of(-1.0f64..1.0),
            why in proptest::option::of(".{0,40}"),
        ) {
            let s = ProbeSummary { kind, e_ref, why };
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("k.json");
            std::fs::write(&path, serde_json::to_vec(&s).unwrap()).unwrap();
            prop_assert_eq!(read_summary(&path), s.is_valid().then_some(s.clone()));
        }
    }
}
