//! What every property-test target shares: the case count (`PROPTEST_CASES`, default 64 so that
//! `cargo test` stays fast; `scripts/fuzz` runs each target at volume) and no failure files written
//! into the repository (`scripts/fuzz` prints the seed instead: `PROPTEST_RNG_SEED` replays a run).

use proptest::test_runner::Config;

pub fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
