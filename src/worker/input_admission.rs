//! How large the reference-input store may grow and what to remove to make room (pure decisions
//! over what is on disk or in memory; `super::input_store` applies them under its locks).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// One entry found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    pub key: String,
    pub bytes: u64,
    pub last_used: SystemTime,
}

/// The entries to remove, oldest use first, until the rest fit `limit` bytes. `keep` (the entry just
/// made or used) is never chosen, even when it alone is over the limit.
pub fn plan_eviction(entries: &[EntryInfo], limit: u64, keep: &str) -> Vec<String> {
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut order: Vec<&EntryInfo> = entries.iter().filter(|e| e.key != keep).collect();
    order.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.key.cmp(&b.key)));
    let mut victims = Vec::new();
    for e in order {
        if total <= limit {
            break;
        }
        total -= e.bytes;
        victims.push(e.key.clone());
    }
    victims
}

/// Space kept free on the store's file system: 10% of it or 5 GB, whichever is larger.
pub const MIN_FREE_BYTES: u64 = 5_000_000_000;

/// The bytes the store may hold: `resources.reference_cache_gb` (`limit`; `u64::MAX` when unset),
/// and never more than its finished entries (`stored`, which eviction can give back) plus the file
/// system's free space less the margin it keeps free (max(10% of `fs_total`, [`MIN_FREE_BYTES`])):
/// the store never fills the disk.
pub fn effective_cap(limit: u64, stored: u64, free: u64, fs_total: u64) -> u64 {
    let margin = (fs_total / 10).max(MIN_FREE_BYTES);
    limit.min(stored.saturating_add(free.saturating_sub(margin)))
}

/// The in-memory tier's folder in `/dev/shm`: `<prefix><pid>` (a scratch folder: swept when its run
/// died).
pub const RAM_STORE_PREFIX: &str = "krefine-inputs-";

/// The in-memory tier kept for later runs (`resources.reference_ram_keep`): one folder in `/dev/shm`
/// shared by every run on the machine and left in place when a run ends (gone at reboot, or removed
/// by hand). Not a scratch folder: no run sweeps it.
pub const RAM_STORE_KEPT: &str = "krefine-inputs.kept";

/// The in-memory tier's folder: this process's own, or the kept one shared by runs (`keep`).
pub fn ram_store_dir(keep: bool) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if keep {
        shm.join(RAM_STORE_KEPT)
    } else {
        shm.join(format!("{RAM_STORE_PREFIX}{}", std::process::id()))
    }
}

/// Share of the machine's memory the in-memory tier may hold by default
/// (`resources.reference_ram_gb` unset).
pub const RAM_SHARE: f64 = 0.45;
/// Share of the machine's memory an in-memory admission leaves available to everything else.
pub const RAM_RESERVE_SHARE: f64 = 0.25;

/// `(MemTotal, MemAvailable)` in bytes, from `/proc/meminfo`.
pub fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kb| kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// The in-memory tier's default bound: [`RAM_SHARE`] of the machine's memory (0 when unknown).
pub fn default_ram_bytes() -> u64 {
    meminfo().map_or(0, |(total, _)| (total as f64 * RAM_SHARE) as u64)
}

/// The in-memory tier's cap at admission: `cap`, and never more than its finished entries
/// (`stored`, which eviction gives back) plus the memory available beyond
/// [`RAM_RESERVE_SHARE`] of `total`.
pub fn memory_cap(cap: u64, stored: u64, available: u64, total: u64) -> u64 {
    let reserve = (total as f64 * RAM_RESERVE_SHARE) as u64;
    cap.min(stored.saturating_add(available.saturating_sub(reserve)))
}

/// Admission of a new entry of `planned` bytes: the finished entries to remove (oldest use first;
/// `keep` and those in `busy` are never chosen) so that the finished entries, the other entries being
/// made (`reserved`) and this one fit `cap` together. `None` when it cannot fit even then: nothing is
/// removed for an entry that will not be stored.
pub fn plan_admission(
    entries: &[EntryInfo],
    reserved: u64,
    planned: u64,
    cap: u64,
    keep: &str,
    busy: &[String],
) -> Option<Vec<String>> {
    let need = reserved.saturating_add(planned);
    if need > cap {
        return None;
    }
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut order: Vec<&EntryInfo> = entries
        .iter()
        .filter(|e| e.key != keep && !busy.contains(&e.key))
        .collect();
    order.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.key.cmp(&b.key)));
    let mut victims = Vec::new();
    for e in order {
        if total.saturating_add(need) <= cap {
            break;
        }
        total -= e.bytes;
        victims.push(e.key.clone());
    }
    (total.saturating_add(need) <= cap).then_some(victims)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(key: &str, bytes: u64, secs: u64) -> EntryInfo {
        EntryInfo {
            key: key.into(),
            bytes,
            last_used: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    #[test]
    fn eviction_removes_the_least_recently_used_until_the_rest_fit() {
        let entries = [
            at("a", 40, 3),
            at("b", 30, 1),
            at("c", 20, 2),
            at("d", 10, 4),
        ];
        assert_eq!(plan_eviction(&entries, 100, "d"), Vec::<String>::new());
        assert_eq!(plan_eviction(&entries, 70, "d"), vec!["b"]);
        assert_eq!(plan_eviction(&entries, 60, "d"), vec!["b", "c"]);
        assert_eq!(plan_eviction(&entries, 45, "d"), vec!["b", "c", "a"]);
        // The kept entry stays even when it alone is over the limit.
        assert_eq!(plan_eviction(&entries, 5, "a"), vec!["b", "c", "d"]);
    }

    #[test]
    fn the_cap_keeps_a_tenth_of_the_file_system_or_5_gb_free() {
        const GB: u64 = 1_000_000_000;
        // 252 GB file system, 37 GB free: 25.2 GB kept free, so 11.8 GB more than the 3 GB stored.
        assert_eq!(
            effective_cap(30 * GB, 3 * GB, 37 * GB, 252 * GB),
            14_800_000_000
        );
        // Plenty of room: the configured limit.
        assert_eq!(effective_cap(30 * GB, 0, 900 * GB, 1000 * GB), 30 * GB);
        // No limit set (`resources.reference_cache_gb` unset): the free space alone.
        assert_eq!(
            effective_cap(u64::MAX, 3 * GB, 37 * GB, 252 * GB),
            14_800_000_000
        );
        assert_eq!(effective_cap(u64::MAX, 0, 900 * GB, 1000 * GB), 800 * GB);
        // A small file system keeps 5 GB free (more than its tenth).
        assert_eq!(effective_cap(30 * GB, GB, 8 * GB, 20 * GB), 4 * GB);
        // Less free than the margin: only what is stored already (eviction can give it back).
        assert_eq!(effective_cap(30 * GB, 2 * GB, 4 * GB, 20 * GB), 2 * GB);
        assert_eq!(effective_cap(30 * GB, 0, 0, 0), 0);
    }

    #[test]
    fn admission_counts_entries_being_made_and_evicts_only_when_it_helps() {
        let entries = [at("a", 40, 3), at("b", 30, 1), at("c", 20, 2)];
        let none: Vec<String> = Vec::new();
        // 90 stored + 10 planned fit 100.
        assert_eq!(
            plan_admission(&entries, 0, 10, 100, "n", &none),
            Some(vec![])
        );
        // 90 + 25 reserved by another + 10: b (oldest) goes.
        assert_eq!(
            plan_admission(&entries, 25, 10, 100, "n", &none),
            Some(vec!["b".to_string()])
        );
        // b is in use: c then a go instead.
        assert_eq!(
            plan_admission(&entries, 25, 10, 100, "n", &["b".to_string()]),
            Some(vec!["c".to_string(), "a".to_string()])
        );
        // Larger than the cap alone, or with what others are making: refused, nothing removed.
        assert_eq!(plan_admission(&entries, 0, 101, 100, "n", &none), None);
        assert_eq!(plan_admission(&entries, 60, 50, 100, "n", &none), None);
        // Even removing every entry not in use is not enough.
        assert_eq!(
            plan_admission(&entries, 0, 80, 100, "n", &["a".to_string()]),
            None
        );
    }

    #[test]
    fn the_memory_tier_leaves_a_quarter_of_memory_available() {
        const GB: u64 = 1_000_000_000;
        // 128 GB machine, 100 GB available, nothing stored: 100 - 32 = 68 GB may be admitted.
        assert_eq!(memory_cap(60 * GB, 0, 100 * GB, 128 * GB), 60 * GB);
        assert_eq!(memory_cap(90 * GB, 0, 100 * GB, 128 * GB), 68 * GB);
        // Stored entries count as available again (eviction gives them back).
        assert_eq!(memory_cap(90 * GB, 10 * GB, 50 * GB, 128 * GB), 28 * GB);
        // Less available than the reserve: only what eviction frees.
        assert_eq!(memory_cap(90 * GB, 5 * GB, 20 * GB, 128 * GB), 5 * GB);
    }
}
