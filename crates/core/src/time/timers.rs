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

/// One clock's timers of one key: a set of timestamps, held without an
/// allocation while there is at most one, which is the common case.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Timestamps {
    one: Option<u64>,
    more: Vec<u64>,
}

impl Timestamps {
    fn insert(&mut self, timestamp: u64) -> bool {
        match self.one {
            None => self.one = Some(timestamp),
            Some(t) if t == timestamp => return false,
            Some(_) if self.more.contains(&timestamp) => return false,
            Some(_) => self.more.push(timestamp),
        }
        true
    }

    fn remove(&mut self, timestamp: u64) -> bool {
        if self.one == Some(timestamp) {
            self.one = self.more.pop();
            true
        } else if let Some(at) = self.more.iter().position(|&t| t == timestamp) {
            self.more.swap_remove(at);
            true
        } else {
            false
        }
    }

    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.one.iter().chain(&self.more).copied()
    }
}

/// One key's timers, each timestamp at most once per domain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTimers {
    event: Timestamps,
    processing: Timestamps,
}

impl KeyTimers {
    fn of(&mut self, domain: TimeDomain) -> &mut Timestamps {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Adds `timestamp`; false if it was there.
    pub(crate) fn insert(&mut self, domain: TimeDomain, timestamp: u64) -> bool {
        self.of(domain).insert(timestamp)
    }

    /// Removes `timestamp`; false if it was not there.
    pub(crate) fn remove(&mut self, domain: TimeDomain, timestamp: u64) -> bool {
        self.of(domain).remove(timestamp)
    }

    /// The timestamps of `domain`.
    pub(crate) fn timestamps(&self, domain: TimeDomain) -> impl Iterator<Item = u64> + '_ {
        match domain {
            TimeDomain::EventTime => self.event.iter(),
            TimeDomain::ProcessingTime => self.processing.iter(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.event.one.is_none() && self.processing.one.is_none()
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
        let mut t = KeyTimers::default();
        assert!(t.insert(TimeDomain::EventTime, 5));
        assert!(!t.insert(TimeDomain::EventTime, 5));
        assert!(t.insert(TimeDomain::ProcessingTime, 5));
        assert!(t.insert(TimeDomain::EventTime, 3));
        assert!(t.insert(TimeDomain::EventTime, 9));
        assert!(!t.insert(TimeDomain::EventTime, 9));
        assert_eq!(t.event.iter().collect::<Vec<_>>(), [5, 3, 9]);
        assert!(t.remove(TimeDomain::EventTime, 5));
        assert!(!t.remove(TimeDomain::EventTime, 5));
        assert!(t.remove(TimeDomain::ProcessingTime, 5));
        assert!(t.remove(TimeDomain::EventTime, 3));
        assert!(!t.is_empty());
        assert!(t.remove(TimeDomain::EventTime, 9));
        assert!(t.is_empty());
    }
}
