//! Keyed timers (Flink's `InternalTimerService`). A key's timers are keyed
//! state of the operator, under the reserved name [`TIMERS_STATE`], so both
//! backends store them in the key group of their key: every snapshot holds
//! them, RocksDB checkpoints them incrementally, and a rescale moves them
//! with their key groups. In front of that state the service keeps an
//! ordered index of every timer, the priority queue the watermark and the
//! clock are checked against, rebuilt from the state on restore.

use super::Millis;
use crate::state::{Key, ValueState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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

/// The timers of one keyed subtask: the index in front of the keyed state
/// that stores them, the watermark and the clock. Sans-IO: the shell tells
/// it the time.
///
/// The index is an ordered map from timestamp to keys. A deleted timer
/// leaves it at once where few keys share its time (sessions, timeouts);
/// where many do, it stays until its time comes, so that a delete never
/// scans a crowd, and firing skips whatever the keyed state no longer
/// holds. A key set again at such a time is indexed twice and fires once,
/// because firing takes the timer out of the keyed state.
pub struct TimerService<K: Key> {
    state: ValueState<KeyTimers>,
    event: BTreeMap<u64, Vec<K>>,
    processing: BTreeMap<u64, Vec<K>>,
    len: u64,
    watermark: Option<u64>,
    now: Millis,
    counters: TimeCounters,
}

impl<K: Key> TimerService<K> {
    /// Keys at one time up to which a delete takes its timer out of the
    /// index.
    const SCANNED_ON_DELETE: usize = 64;

    /// The service over the keyed state `state` (declared as
    /// [`TIMERS_STATE`]).
    pub(crate) fn new(state: ValueState<KeyTimers>) -> Self {
        TimerService {
            state,
            event: BTreeMap::new(),
            processing: BTreeMap::new(),
            len: 0,
            watermark: None,
            now: 0,
            counters: TimeCounters::default(),
        }
    }

    pub(crate) fn state(&self) -> ValueState<KeyTimers> {
        self.state
    }

    fn index(&mut self, domain: TimeDomain) -> &mut BTreeMap<u64, Vec<K>> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Indexes a timer the keyed state just took.
    pub(crate) fn added(&mut self, domain: TimeDomain, timestamp: u64, key: &K) {
        self.index(domain)
            .entry(timestamp)
            .or_default()
            .push(key.clone());
        self.len += 1;
    }

    /// The keyed state just dropped a timer of `key`.
    pub(crate) fn removed(&mut self, domain: TimeDomain, timestamp: u64, key: &K) {
        self.len -= 1;
        let index = self.index(domain);
        let Some(keys) = index.get_mut(&timestamp) else {
            return;
        };
        if keys.len() <= Self::SCANNED_ON_DELETE {
            if let Some(at) = keys.iter().position(|k| k == key) {
                keys.swap_remove(at);
            }
            if keys.is_empty() {
                index.remove(&timestamp);
            }
        }
    }

    /// Rebuilds the index from one key's restored timers.
    pub(crate) fn restored(&mut self, key: &K, timers: &KeyTimers) {
        for ts in timers.event.iter() {
            self.added(TimeDomain::EventTime, ts, key);
        }
        for ts in timers.processing.iter() {
            self.added(TimeDomain::ProcessingTime, ts, key);
        }
    }

    /// Takes the earliest timestamp of `domain` at or before `upto`, with
    /// the keys indexed there; the caller fires those whose keyed state
    /// still holds the timer.
    pub(crate) fn pop_due(&mut self, domain: TimeDomain, upto: u64) -> Option<(u64, Vec<K>)> {
        let index = self.index(domain);
        let entry = index.first_entry().filter(|e| *e.key() <= upto)?;
        Some(entry.remove_entry())
    }

    /// The earliest processing-time timer, for the shell to wake up then
    /// (possibly one since deleted: waking up for it fires nothing).
    pub fn next_processing_timer(&self) -> Option<Millis> {
        self.processing.keys().next().copied()
    }

    /// Timers registered now, over all keys and both domains.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no timer is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The operator's current watermark.
    pub fn watermark(&self) -> Option<u64> {
        self.watermark
    }

    pub(crate) fn set_watermark(&mut self, watermark: u64) {
        self.watermark = self.watermark.max(Some(watermark));
    }

    /// The processing time the shell last gave.
    pub fn now(&self) -> Millis {
        self.now
    }

    pub(crate) fn set_now(&mut self, now: Millis) {
        self.now = self.now.max(now);
    }

    pub(crate) fn counters(&mut self) -> &mut TimeCounters {
        &mut self.counters
    }

    /// What was counted since the last call.
    pub(crate) fn take_counters(&mut self) -> TimeCounters {
        std::mem::take(&mut self.counters)
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
