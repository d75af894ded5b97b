//! When to try an LLM request again: exponential backoff with jitter, or what the server asked for.
//!
//! Kept by hand rather than `backon`: the retry loop (in `openai.rs`) interleaves the rate gate, an
//! event per attempt and the server's `Retry-After`, which a generic retry combinator would need
//! bending to express; the policy itself is the dozen lines below.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use super::config::ModelSection;

/// The longest `Retry-After` honoured. A server asking for more (an hour, a day) is down for longer
/// than a run should sit idle on it: the wait is cut here, and when the retries run out the turn is
/// left for a resume (see `LlmError::Unavailable`).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Retries after the first attempt, and how long to wait before each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// `model.max_retries`: retries after the first attempt.
    pub max_retries: u32,
    /// The first wait (`model.backoff_base_s`), doubled for each retry after it, with jitter.
    pub base: Duration,
    /// No wait is longer (`model.backoff_max_s`).
    pub max: Duration,
}

impl RetryPolicy {
    pub fn from_model(model: &ModelSection) -> Self {
        RetryPolicy {
            max_retries: model.max_retries,
            base: secs(model.backoff_base_s),
            max: secs(model.backoff_max_s),
        }
    }

    /// Wait before retry number `retry` (1 = the first retry). A server's `Retry-After` is honoured
    /// as given, even beyond `max` (retrying earlier would only spend an attempt on another 429), up
    /// to [`MAX_RETRY_AFTER`]. Otherwise `base * 2^(retry-1)` capped at `max`, with "equal jitter" (half fixed, half random)
    /// so that tasks rejected together do not come back together.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(MAX_RETRY_AFTER);
        }
        let exp = self
            .base
            .saturating_mul(2u32.saturating_pow(retry.saturating_sub(1)))
            .min(self.max);
        let half = exp / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

/// Non-negative, finite seconds; anything else (config validation lets NaN through here) is 0.
fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)
}

/// The wait a response asks for: `retry-after-ms` (OpenAI, Azure), else `Retry-After` in seconds or
/// as an HTTP date. Unparseable values are ignored (the backoff applies).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && let Ok(d) = Duration::try_from_secs_f64(ms / 1000.0)
    {
        return Some(d);
    }
    parse_retry_after(header("retry-after")?, now)
}

/// `Retry-After: <seconds>` (fractions accepted) or `Retry-After: <HTTP date>`; a date in the past
/// means no wait.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(s) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(s).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(base: f64, max: f64) -> RetryPolicy {
        RetryPolicy {
            max_retries: 5,
            base: secs(base),
            max: secs(max),
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let p = policy(1.0, 5.0);
        for _ in 0..200 {
            for (retry, full) in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (30, 5.0)] {
                let d = p.delay(retry, None).as_secs_f64();
                assert!(d >= full / 2.0 && d <= full, "retry {retry}: {d}");
            }
        }
        assert_eq!(policy(0.0, 5.0).delay(3, None), Duration::ZERO);
    }

    #[test]
    fn retry_after_wins_even_beyond_the_cap() {
        let p = policy(1.0, 2.0);
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn retry_after_is_capped() {
        let p = policy(1.0, 2.0);
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(86_400))),
            MAX_RETRY_AFTER
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let huge = parse_retry_after("100000", now);
        assert_eq!(p.delay(1, huge), MAX_RETRY_AFTER);
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 0.25 ", now),
            Some(Duration::from_millis(250))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(7)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_ms_header_is_preferred() {
        let now = SystemTime::now();
        let mut h = HeaderMap::new();
        h.insert("retry-after", "9".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(9)));
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(150)));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
