//! Keyed timers (Flink's `InternalTimerService`). A key's timers are keyed
//! state of the operator, under the reserved name [`TIMERS_STATE`], so both
//! backends store them in the key group of their key: every snapshot holds
//! them, RocksDB checkpoints them incrementally, and a rescale moves them
//! with their key groups. In front of that state the service keeps an
//! ordered index of every timer, the priority queue the watermark and the
//! clock are checked against, rebuilt from the state on restore.

use super::Millis;
use crate::state::{Key, ValueState};
use rustc_hash::FxHashSet;
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

/// One key's timers: sorted timestamps, each at most once per domain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTimers {
    event: Vec<u64>,
    processing: Vec<u64>,
}

impl KeyTimers {
    fn of(&mut self, domain: TimeDomain) -> &mut Vec<u64> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Adds `timestamp`; false if it was there.
    pub(crate) fn insert(&mut self, domain: TimeDomain, timestamp: u64) -> bool {
        let timers = self.of(domain);
        match timers.binary_search(&timestamp) {
            Ok(_) => false,
            Err(at) => {
                timers.insert(at, timestamp);
                true
            }
        }
    }

    /// Removes `timestamp`; false if it was not there.
    pub(crate) fn remove(&mut self, domain: TimeDomain, timestamp: u64) -> bool {
        let timers = self.of(domain);
        match timers.binary_search(&timestamp) {
            Ok(at) => {
                timers.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.event.is_empty() && self.processing.is_empty()
    }
}

/// What a keyed operator counts about time, added to [`TimeMetrics`] once
/// per batch rather than once per record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeCounters {
    /// Timers registered that were not already set.
    pub timers_registered: u64,
    /// Timers fired.
    pub timers_fired: u64,
    /// Window results emitted.
    pub windows_fired: u64,
    /// Records dropped (or sent to the late-data output) as too late.
    pub late_records: u64,
}

/// The time figures of a job, shared by its subtasks over all attempts.
#[derive(Debug, Default)]
pub struct TimeMetrics {
    timers_registered: AtomicU64,
    timers_fired: AtomicU64,
    windows_fired: AtomicU64,
    late_records: AtomicU64,
    /// Largest timestamp any source read.
    max_timestamp: AtomicU64,
    /// Largest watermark below the final one that reached a keyed operator.
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
    }

    /// Everything counted so far.
    pub fn counters(&self) -> TimeCounters {
        TimeCounters {
            timers_registered: self.timers_registered.load(Ordering::Relaxed),
            timers_fired: self.timers_fired.load(Ordering::Relaxed),
            windows_fired: self.windows_fired.load(Ordering::Relaxed),
            late_records: self.late_records.load(Ordering::Relaxed),
        }
    }

    /// A source read a record of timestamp `timestamp`.
    pub fn observe_timestamp(&self, timestamp: u64) {
        self.max_timestamp.fetch_max(timestamp, Ordering::Relaxed);
    }

    /// A keyed operator reached `watermark`.
    pub fn observe_watermark(&self, watermark: u64) {
        if watermark < u64::MAX {
            self.watermark.fetch_max(watermark, Ordering::Relaxed);
        }
    }

    /// How far the watermark trailed the newest timestamp read, in ms, at
    /// the last watermark before the end of input; `None` before any.
    pub fn watermark_lag(&self) -> Option<u64> {
        let watermark = self.watermark.load(Ordering::Relaxed);
        (watermark > 0).then(|| {
            self.max_timestamp
                .load(Ordering::Relaxed)
                .saturating_sub(watermark)
        })
    }
}

/// The timers of one keyed subtask: the index in front of the keyed state
/// that stores them, the watermark and the clock. Sans-IO: the shell tells
/// it the time.
pub struct TimerService<K: Key> {
    state: ValueState<KeyTimers>,
    event: BTreeMap<u64, FxHashSet<K>>,
    processing: BTreeMap<u64, FxHashSet<K>>,
    len: u64,
    watermark: Option<u64>,
    now: Millis,
    counters: TimeCounters,
}

impl<K: Key> TimerService<K> {
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

    fn index(&mut self, domain: TimeDomain) -> &mut BTreeMap<u64, FxHashSet<K>> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Indexes a timer the keyed state just took.
    pub(crate) fn indexed(&mut self, domain: TimeDomain, timestamp: u64, key: &K) {
        self.index(domain)
            .entry(timestamp)
            .or_default()
            .insert(key.clone());
        self.len += 1;
    }

    /// Unindexes a timer the keyed state just dropped.
    pub(crate) fn unindexed(&mut self, domain: TimeDomain, timestamp: u64, key: &K) {
        let index = self.index(domain);
        let Some(keys) = index.get_mut(&timestamp) else {
            return;
        };
        let removed = keys.remove(key);
        if keys.is_empty() {
            index.remove(&timestamp);
        }
        if removed {
            self.len -= 1;
        }
    }

    /// Rebuilds the index from one key's restored timers.
    pub(crate) fn restored(&mut self, key: &K, timers: &KeyTimers) {
        for &ts in &timers.event {
            self.indexed(TimeDomain::EventTime, ts, key);
        }
        for &ts in &timers.processing {
            self.indexed(TimeDomain::ProcessingTime, ts, key);
        }
    }

    /// Takes the earliest timestamp of `domain` at or before `upto`, with
    /// the keys whose timer it is; the caller fires them.
    pub(crate) fn pop_due(&mut self, domain: TimeDomain, upto: u64) -> Option<(u64, Vec<K>)> {
        let index = self.index(domain);
        let entry = index.first_entry().filter(|e| *e.key() <= upto)?;
        let (timestamp, keys) = entry.remove_entry();
        self.len -= keys.len() as u64;
        Some((timestamp, keys.into_iter().collect()))
    }

    /// The earliest processing-time timer, for the shell to wake up then.
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
        assert_eq!(t.event, [3, 5]);
        assert!(t.remove(TimeDomain::EventTime, 5));
        assert!(!t.remove(TimeDomain::EventTime, 5));
        assert!(t.remove(TimeDomain::ProcessingTime, 5));
        assert!(t.remove(TimeDomain::EventTime, 3));
        assert!(t.is_empty());
    }
}
