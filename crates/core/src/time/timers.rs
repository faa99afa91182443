//! Keyed timers (Flink's `InternalTimerService`). A key's timers are keyed
//! state of the operator, under the reserved name [`TIMERS_STATE`], so both
//! backends store them in the key group of their key: every snapshot holds
//! them, RocksDB checkpoints them incrementally, and a rescale moves them
//! with their key groups. In front of that state the service keeps an
//! ordered index of every timer, the priority queue the watermark and the
//! clock are checked against, rebuilt from the state on restore. Implied
//! timers are only in that index: a function's own state records them, and
//! the function names them again on restore.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering};

/// The keyed state holding the timers; an operator cannot declare a state
/// of this name.
pub const TIMERS_STATE: &str = "_timers";

/// Which clock a timer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimeDomain {
    /// Fires when the watermark reaches its timestamp.
    EventTime,
    /// Fires when the wall clock reaches its timestamp (ms since the epoch).
    ProcessingTime,
}

/// One key's timers, each timestamp at most once per domain: a list held
/// without an allocation while it has one timer, the common case, in 24
/// bytes (a set per domain took 80, and the keyed state holds one a key).
#[derive(Clone, Debug, Default)]
pub struct KeyTimers(SmallVec<[(TimeDomain, u64); 1]>);

/// As sets: the order timers were set in is not kept.
impl PartialEq for KeyTimers {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().all(|t| other.0.contains(t))
    }
}

impl Eq for KeyTimers {}

impl KeyTimers {
    /// Adds `timestamp`; false if it was there.
    pub(crate) fn insert(&mut self, domain: TimeDomain, timestamp: u64) -> bool {
        if self.0.contains(&(domain, timestamp)) {
            return false;
        }
        self.0.push((domain, timestamp));
        true
    }

    /// Removes `timestamp`; false if it was not there.
    pub(crate) fn remove(&mut self, domain: TimeDomain, timestamp: u64) -> bool {
        let Some(at) = self.0.iter().position(|&t| t == (domain, timestamp)) else {
            return false;
        };
        self.0.swap_remove(at);
        if self.0.spilled() && self.0.len() <= self.0.inline_size() {
            self.0.shrink_to_fit();
        }
        true
    }

    /// The timestamps of `domain`.
    pub(crate) fn timestamps(&self, domain: TimeDomain) -> impl Iterator<Item = u64> + '_ {
        self.0
            .iter()
            .filter(move |(d, _)| *d == domain)
            .map(|&(_, timestamp)| timestamp)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How [`KeyTimers`] are stored, as they always were: a set of timestamps
/// per domain, each its first and the rest.
#[derive(Default, Serialize, Deserialize)]
struct Stored {
    event: Timestamps,
    processing: Timestamps,
}

#[derive(Default, Serialize, Deserialize)]
struct Timestamps {
    one: Option<u64>,
    more: Vec<u64>,
}

impl Serialize for KeyTimers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut stored = Stored::default();
        for &(domain, timestamp) in &self.0 {
            let of = match domain {
                TimeDomain::EventTime => &mut stored.event,
                TimeDomain::ProcessingTime => &mut stored.processing,
            };
            match of.one {
                None => of.one = Some(timestamp),
                Some(_) => of.more.push(timestamp),
            }
        }
        stored.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for KeyTimers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Stored as sets: pushed without a search each.
        let stored = Stored::deserialize(deserializer)?;
        let of = |domain, t: Timestamps| t.one.into_iter().chain(t.more).map(move |t| (domain, t));
        Ok(KeyTimers(
            of(TimeDomain::EventTime, stored.event)
                .chain(of(TimeDomain::ProcessingTime, stored.processing))
                .collect(),
        ))
    }
}

/// What a keyed operator counts about time, added to [`TimeMetrics`] once
/// per batch rather than once per record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeCounters {
    /// Timers registered that were not already set.
    pub timers_registered: u64,
    /// Timers fired.
    pub timers_fired: u64,
    /// Window results emitted.
    pub windows_fired: u64,
    /// Records dropped (or sent to the late-data output) as too late.
    pub late_records: u64,
    /// Pairs interval joins emitted.
    pub join_pairs: u64,
}

/// [`TimeMetrics`] as one process sends them to another: counts, and the
/// largest timestamp and watermark (as kept) seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeMarks {
    /// Timers, windows, late records and join pairs.
    pub counters: TimeCounters,
    /// Records interval joins held when their input ended.
    pub join_buffered: u64,
    /// The largest timestamp a source read.
    pub max_timestamp: u64,
    /// One more than the largest watermark below the final one; 0 before any.
    pub watermark: u64,
}

impl TimeMarks {
    /// What was counted since `before`; the marks stay as they are.
    pub fn since(&self, before: &TimeMarks) -> TimeMarks {
        let (c, b) = (&self.counters, &before.counters);
        TimeMarks {
            counters: TimeCounters {
                timers_registered: c.timers_registered - b.timers_registered,
                timers_fired: c.timers_fired - b.timers_fired,
                windows_fired: c.windows_fired - b.windows_fired,
                late_records: c.late_records - b.late_records,
                join_pairs: c.join_pairs - b.join_pairs,
            },
            join_buffered: self.join_buffered - before.join_buffered,
            ..*self
        }
    }
}

/// The time figures of a job, shared by its subtasks over all attempts.
#[derive(Debug, Default)]
pub struct TimeMetrics {
    timers_registered: AtomicU64,
    timers_fired: AtomicU64,
    windows_fired: AtomicU64,
    late_records: AtomicU64,
    join_pairs: AtomicU64,
    /// Records interval joins still held when their input ended.
    join_buffered: AtomicU64,
    /// Largest timestamp any source read.
    max_timestamp: AtomicU64,
    /// One more than the largest watermark below the final one that reached
    /// a keyed operator; 0 before any.
    watermark: AtomicU64,
}

impl TimeMetrics {
    /// Adds what a subtask counted.
    pub fn add(&self, c: &TimeCounters) {
        self.timers_registered
            .fetch_add(c.timers_registered, Ordering::Relaxed);
        self.timers_fired
            .fetch_add(c.timers_fired, Ordering::Relaxed);
        self.windows_fired
            .fetch_add(c.windows_fired, Ordering::Relaxed);
        self.late_records
            .fetch_add(c.late_records, Ordering::Relaxed);
        self.join_pairs.fetch_add(c.join_pairs, Ordering::Relaxed);
    }

    /// Everything counted so far.
    pub fn counters(&self) -> TimeCounters {
        TimeCounters {
            timers_registered: self.timers_registered.load(Ordering::Relaxed),
            timers_fired: self.timers_fired.load(Ordering::Relaxed),
            windows_fired: self.windows_fired.load(Ordering::Relaxed),
            late_records: self.late_records.load(Ordering::Relaxed),
            join_pairs: self.join_pairs.load(Ordering::Relaxed),
        }
    }

    /// What these figures hold, for another process to merge.
    pub fn marks(&self) -> TimeMarks {
        TimeMarks {
            counters: self.counters(),
            join_buffered: self.join_buffered(),
            max_timestamp: self.max_timestamp.load(Ordering::Relaxed),
            watermark: self.watermark.load(Ordering::Relaxed),
        }
    }

    /// Merges what another process counted (the growth of its
    /// [`TimeMetrics::marks`], from [`TimeMarks::since`]).
    pub fn merge(&self, marks: &TimeMarks) {
        self.add(&marks.counters);
        self.add_join_buffered(marks.join_buffered);
        self.max_timestamp
            .fetch_max(marks.max_timestamp, Ordering::Relaxed);
        self.watermark.fetch_max(marks.watermark, Ordering::Relaxed);
    }

    /// An interval join ended its input with `records` still buffered.
    pub fn add_join_buffered(&self, records: u64) {
        self.join_buffered.fetch_add(records, Ordering::Relaxed);
    }

    /// Records interval joins still held when their input ended: 0 once
    /// the final watermark has passed every buffered record.
    pub fn join_buffered(&self) -> u64 {
        self.join_buffered.load(Ordering::Relaxed)
    }

    /// A source read a record of timestamp `timestamp`.
    pub fn observe_timestamp(&self, timestamp: u64) {
        self.max_timestamp.fetch_max(timestamp, Ordering::Relaxed);
    }

    /// A keyed operator reached `watermark`.
    pub fn observe_watermark(&self, watermark: u64) {
        if watermark < u64::MAX {
            self.watermark.fetch_max(watermark + 1, Ordering::Relaxed);
        }
    }

    /// How far the watermark trailed the newest timestamp read, in ms, at
    /// the last watermark before the end of input; `None` before any.
    pub fn watermark_lag(&self) -> Option<u64> {
        let watermark = self.watermark.load(Ordering::Relaxed).checked_sub(1)?;
        Some(
            self.max_timestamp
                .load(Ordering::Relaxed)
                .saturating_sub(watermark),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_timers_are_a_set_per_domain() {
        use TimeDomain::{EventTime, ProcessingTime};
        let mut t = KeyTimers::default();
        assert!(t.insert(EventTime, 5));
        assert!(!t.insert(EventTime, 5));
        assert!(t.insert(ProcessingTime, 5));
        assert!(t.insert(EventTime, 3));
        assert!(t.insert(EventTime, 9));
        assert!(!t.insert(EventTime, 9));
        assert_eq!(t.timestamps(EventTime).collect::<Vec<_>>(), [5, 3, 9]);
        assert_eq!(t.timestamps(ProcessingTime).collect::<Vec<_>>(), [5]);
        assert!(t.remove(EventTime, 5));
        assert!(!t.remove(EventTime, 5));
        assert!(t.remove(ProcessingTime, 5));
        assert!(t.remove(EventTime, 3));
        assert!(!t.is_empty());
        assert!(!t.0.spilled(), "one timer is held inline again");
        assert!(t.remove(EventTime, 9));
        assert!(t.is_empty());
        assert!(size_of::<KeyTimers>() <= 24);
    }

    /// Snapshots taken before the timers of a key became one list restore,
    /// and new ones are as they were: `[[event first, [event rest]],
    /// [processing first, [processing rest]]]` in MessagePack.
    #[test]
    fn key_timers_are_stored_as_they_always_were() {
        use TimeDomain::{EventTime, ProcessingTime};
        let stored = [0x92, 0x92, 0x05, 0x91, 0x03, 0x92, 0x07, 0x90];
        let mut t = KeyTimers::default();
        t.insert(EventTime, 5);
        t.insert(ProcessingTime, 7);
        t.insert(EventTime, 3);
        assert_eq!(rmp_serde::to_vec(&t).unwrap(), stored);
        assert_eq!(rmp_serde::from_slice::<KeyTimers>(&stored).unwrap(), t);
        let none = [0x92, 0x92, 0xc0, 0x90, 0x92, 0xc0, 0x90];
        assert_eq!(rmp_serde::to_vec(&KeyTimers::default()).unwrap(), none);
        assert!(rmp_serde::from_slice::<KeyTimers>(&none)
            .unwrap()
            .is_empty());
    }
}
