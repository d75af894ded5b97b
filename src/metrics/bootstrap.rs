//! Seeded percentile bootstrap over problems.
//!
//! Reproducible by construction: the generator is PCG64 (`rand_pcg::Pcg64`, a fixed algorithm with a
//! stable output stream) seeded from the user's seed, and an index in `0..n` is drawn from one 64-bit
//! output by multiply-shift (`(x * n) >> 64`), so the same seed gives the same resamples on every
//! machine and every krefine version that keeps this file. Intervals are percentile intervals with
//! linear interpolation between order statistics (numpy's default `quantile` method).

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde::Serialize;

/// A two-sided interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

/// `resamples` lists of `n` indices in `0..n`, drawn with replacement.
pub fn resample_indices(n: usize, resamples: u32, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = Pcg64::seed_from_u64(seed);
    (0..resamples)
        .map(|_| {
            (0..n)
                .map(|_| ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize)
                .collect()
        })
        .collect()
}

/// The `q` quantile (`0..=1`) of sorted values, interpolating linearly between order statistics.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let pos = q.clamp(0.0, 1.0) * last as f64;
    let below = pos.floor() as usize;
    let above = pos.ceil() as usize;
    let frac = pos - below as f64;
    Some(sorted[below] + (sorted[above] - sorted[below]) * frac)
}

/// The central `level` (e.g. 0.95) percentile interval of `values`; `None` when there are none.
/// Non-finite values are ignored.
pub fn percentile_interval(mut values: Vec<f64>, level: f64) -> Option<Interval> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let tail = (1.0 - level.clamp(0.0, 1.0)) / 2.0;
    Some(Interval {
        lo: quantile(&values, tail)?,
        hi: quantile(&values, 1.0 - tail)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // numpy.quantile([1,2,3,4], [0, 0.025, 0.5, 0.975, 1]) = 1, 1.075, 2.5, 3.925, 4
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert!((quantile(&v, 0.025).unwrap() - 1.075).abs() < 1e-12);
        assert_eq!(quantile(&v, 0.5), Some(2.5));
        assert!((quantile(&v, 0.975).unwrap() - 3.925).abs() < 1e-12);
        assert_eq!(quantile(&v, 1.0), Some(4.0));
        assert_eq!(quantile(&[], 0.5), None);
        let i = percentile_interval(vec![4.0, f64::NAN, 1.0, 3.0, 2.0], 0.5).unwrap();
        assert_eq!((i.lo, i.hi), (1.75, 3.25));
    }

    #[test]
    fn resamples_are_seeded_and_in_range() {
        let a = resample_indices(5, 3, 7);
        assert_eq!(a, resample_indices(5, 3, 7));
        assert_ne!(a, resample_indices(5, 3, 8));
        assert_eq!(a.len(), 3);
        assert!(a.iter().all(|r| r.len() == 5 && r.iter().all(|&i| i < 5)));
        assert!(resample_indices(0, 2, 1).iter().all(Vec::is_empty));
        // The stream is part of the reproducibility promise: these are the golden resamples.
        assert_eq!(
            resample_indices(2, 4, 0),
            vec![vec![0, 0], vec![1, 0], vec![1, 0], vec![0, 1]]
        );
        assert_eq!(
            resample_indices(3, 2, 42),
            vec![vec![0, 0, 2], vec![1, 2, 1]]
        );
    }
}
