//! The timer service of a keyed subtask (Flink's `InternalTimerService`):
//! the index in front of the keyed state that stores each key's timers
//! (`crate::time::timers`). Here, beside the state it reads, so that time
//! stays below state.

use super::{Key, ValueState};
use crate::time::timers::{KeyTimers, TimeCounters, TimeDomain};
use crate::time::Millis;
use std::collections::BTreeMap;

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
///
/// Implied timers are event-time timers that a function's own keyed state
/// already records (a window's end is in the window), so they are only
/// indexed: no keyed state is written to set, delete or fire them, and the
/// function names them again from its restored state
/// (`KeyedProcessFunction::restore_timers`). Nothing deletes them, and each
/// fires as often as it was set; [`TimerService::len`] counts them so.
pub struct TimerService<K: Key> {
    state: ValueState<KeyTimers>,
    event: BTreeMap<u64, Vec<K>>,
    processing: BTreeMap<u64, Vec<K>>,
    implied: BTreeMap<u64, Vec<K>>,
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
            implied: BTreeMap::new(),
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

    /// Indexes an implied event-time timer of `key`.
    pub(crate) fn implied(&mut self, timestamp: u64, key: K) {
        self.implied.entry(timestamp).or_default().push(key);
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
        for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
            for ts in timers.timestamps(domain) {
                self.added(domain, ts, key);
            }
        }
    }

    /// Takes the earliest timestamp of `domain` at or before `upto`, with
    /// the keys indexed there and whether their timers are implied; the
    /// caller fires the implied ones, and the others whose keyed state
    /// still holds the timer. At one time, keyed timers come first.
    pub(crate) fn pop_due(&mut self, domain: TimeDomain, upto: u64) -> Option<(u64, Vec<K>, bool)> {
        let first = |index: &BTreeMap<u64, Vec<K>>| index.keys().next().copied();
        let keyed = first(self.index(domain)).filter(|&t| t <= upto);
        let implied = match domain {
            TimeDomain::EventTime => first(&self.implied).filter(|&t| t <= upto),
            TimeDomain::ProcessingTime => None,
        };
        let implied_first = match (keyed, implied) {
            (None, None) => return None,
            (Some(keyed), Some(implied)) => implied < keyed,
            (keyed, _) => keyed.is_none(),
        };
        if implied_first {
            let (timestamp, keys) = self.implied.pop_first()?;
            self.len -= keys.len() as u64;
            Some((timestamp, keys, true))
        } else {
            let (timestamp, keys) = self.index(domain).pop_first()?;
            Some((timestamp, keys, false))
        }
    }

    /// The keys indexed at event times up to `upto`, in the order
    /// [`Self::pop_due`] takes them out: what firing them will read.
    pub(crate) fn due_event_keys(&self, upto: u64) -> impl Iterator<Item = &K> {
        let mut keyed = self.event.range(..=upto).peekable();
        let mut implied = self.implied.range(..=upto).peekable();
        std::iter::from_fn(move || {
            let implied_first = match (keyed.peek(), implied.peek()) {
                (Some((k, _)), Some((i, _))) => i < k,
                (keyed, _) => keyed.is_none(),
            };
            let (_, keys) = if implied_first {
                implied.next()
            } else {
                keyed.next()
            }?;
            Some(keys)
        })
        .flatten()
    }

    /// The earliest processing-time timer, for the shell to wake up then
    /// (possibly one since deleted: waking up for it fires nothing).
    pub fn next_processing_timer(&self) -> Option<Millis> {
        self.processing.keys().next().copied()
    }

    /// Timers registered now, over all keys and both domains: implied ones
    /// as often as they were set, until they fire.
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

/// The timers a keyed function names after a restore, from its restored
/// state (`KeyedProcessFunction::restore_timers`): implied ones, and those
/// to set only for keys the snapshot held no event-time keyed timers of
/// (keyed timers know what fired; a snapshot taken with implied timers has
/// none), implied or keyed.
pub struct RestoredTimers<'a, K: Key> {
    service: &'a mut TimerService<K>,
    /// Timers for keys without keyed ones, decided once the state is no
    /// longer read.
    pub(crate) unless_keyed: Vec<(K, u64, RestoredTimer)>,
}

/// How a timer named after a restore is kept.
pub(crate) enum RestoredTimer {
    Implied,
    Keyed,
}

impl<'a, K: Key> RestoredTimers<'a, K> {
    pub(crate) fn new(service: &'a mut TimerService<K>) -> Self {
        RestoredTimers {
            service,
            unless_keyed: Vec::new(),
        }
    }

    /// Sets an implied event-time timer of `key` at `timestamp`.
    pub fn imply(&mut self, key: K, timestamp: u64) {
        self.service.implied(timestamp, key);
    }

    /// [`Self::imply`], unless the snapshot held event-time keyed timers of
    /// `key`.
    pub fn imply_unless_keyed(&mut self, key: K, timestamp: u64) {
        self.unless_keyed
            .push((key, timestamp, RestoredTimer::Implied));
    }

    /// Sets a keyed event-time timer of `key` at `timestamp`, unless the
    /// snapshot held event-time keyed timers of `key`.
    pub fn register_unless_keyed(&mut self, key: K, timestamp: u64) {
        self.unless_keyed
            .push((key, timestamp, RestoredTimer::Keyed));
    }
}
