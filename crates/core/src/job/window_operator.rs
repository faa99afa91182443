//! The window operator: a keyed function that assigns records to windows,
//! keeps each window's aggregate in keyed state and fires it by timer.
//! Above `time`, whose windows and assigners it uses, so that time stays
//! below state and the operators.
//!
//! Windows in event time without allowed lateness are gone once they fire,
//! so a key's windows say when it fires next: their timers are implied
//! (`KeyedContext::register_implied_timer`), and a record writes its
//! window's state and nothing else. A session keeps the timer of the end it
//! had when it opened: when that fires inside the session, which records
//! have lengthened since, its timer moves to the session's end. Windows
//! that outlive their firing (allowed lateness) or follow the clock keep
//! keyed timers, which remember what fired. A restore with either kind of
//! snapshot into either kind of operator fires each window once: keys whose
//! snapshot held keyed timers keep them, and the windows of the others,
//! which have not fired, get the timers the operator keeps.
//!
//! Tumbling and sliding windows with implied timers and no early firing
//! are kept as slices (`Slicing`): a key's entry holds one slice's
//! accumulator, its window is the slice's start and the end of the next
//! window to fire with it. A record adds to one slice; a firing merges the
//! key's slices of that end and moves each on to the next window, until the
//! last that holds it. A window stored whole, by a snapshot from before
//! slices, is the one slice of its only window, and fires as it did; slices
//! restored where windows are kept whole become the windows they lie in.

use crate::dataflow::operator::{Collector, KeyedProcessFunction};
use crate::state::timers::RestoredTimers;
use crate::state::{AllKeys, Key, KeyedContext, StateRegistrar, ValueState};
use crate::time::window::{AggregateFunction, Slicing, TimeWindow, WindowAssigner};
use crate::time::{TimeDomain, Timestamped};
use smallvec::SmallVec;
use std::sync::Arc;

/// When and how windows fire, beyond their assigner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowConfig {
    /// How long after its end (in event time) a window still takes late
    /// records, firing again for each; past it, records are late data.
    pub allowed_lateness: u64,
    /// Event-time windows also fire every this many ms of processing time
    /// while open (Flink's `ContinuousProcessingTimeTrigger` before the
    /// watermark trigger).
    pub early_firing: Option<u64>,
}

/// Emits a window's result: the key, the window and the aggregate.
pub type WindowEmit<K, R, O> = Arc<dyn Fn(&K, &TimeWindow, R, &mut Collector<'_, O>) + Send + Sync>;

/// Turns a record too late for any window into output (the late-data
/// output); without one, late records are dropped and counted.
pub type LateData<T, O> = Arc<dyn Fn(T, &mut Collector<'_, O>) + Send + Sync>;

/// A key's open windows (or slices) and their accumulators. Most keys of
/// tumbling windows have one open at a time, and most of sparse sliding
/// windows one or two slices, held without an allocation: a firing then
/// reads no memory but the key's entry. Stored as a sequence, as a `Vec` is.
type Windows<Acc> = SmallVec<[(TimeWindow, Acc); 2]>;

/// The keyed state name of a window operator's windows.
pub const WINDOWS_STATE: &str = "windows";

/// The window operator of one subtask: a keyed function over its key's
/// open windows.
pub struct WindowOperator<K, T, A: AggregateFunction<T>, O> {
    assigner: WindowAssigner,
    settings: WindowConfig,
    /// How windows are sliced, if they are.
    slicing: Option<Slicing>,
    /// Where tumbling or sliding windows are kept whole: how restored
    /// slices are cut, to make windows of them.
    whole: Option<Slicing>,
    aggregate: Arc<A>,
    emit: WindowEmit<K, A::Result, O>,
    late: Option<LateData<T, O>>,
    windows: ValueState<Windows<A::Acc>>,
    /// The windows the record being processed went into, and whether each
    /// is new, so needs its timers (a buffer kept across records).
    touched: Vec<(TimeWindow, bool)>,
    /// Results to emit once the key's state is written back.
    due: Vec<(TimeWindow, A::Result)>,
}

impl<K: Key, T, A: AggregateFunction<T>, O> WindowOperator<K, T, A, O> {
    /// Declares the windows' state in `states`.
    pub fn open(
        states: &mut StateRegistrar<'_, K>,
        assigner: WindowAssigner,
        settings: WindowConfig,
        aggregate: Arc<A>,
        emit: WindowEmit<K, A::Result, O>,
        late: Option<LateData<T, O>>,
    ) -> Self {
        let implied = assigner.domain == TimeDomain::EventTime && settings.allowed_lateness == 0;
        let (slicing, whole) = match implied && settings.early_firing.is_none() {
            true => (assigner.slicing(), None),
            false => (None, assigner.slicing()),
        };
        WindowOperator {
            assigner,
            settings,
            slicing,
            whole,
            aggregate,
            emit,
            late,
            windows: states.value(WINDOWS_STATE),
            touched: Vec::new(),
            due: Vec::new(),
        }
    }

    /// Whether the windows' timers are implied by the windows themselves:
    /// each fires once, at its end, and is then gone.
    fn implies_timers(&self) -> bool {
        self.assigner.domain == TimeDomain::EventTime && self.settings.allowed_lateness == 0
    }

    /// When `window` is cleaned up: its end plus the allowed lateness in
    /// event time; processing time has no late records.
    fn cleanup_time(&self, window: &TimeWindow) -> u64 {
        match self.assigner.domain {
            TimeDomain::EventTime => window
                .max_timestamp()
                .saturating_add(self.settings.allowed_lateness),
            TimeDomain::ProcessingTime => window.max_timestamp(),
        }
    }

    fn fire(
        &self,
        ctx: &mut KeyedContext<'_, K>,
        window: &TimeWindow,
        result: A::Result,
        out: &mut Collector<'_, O>,
    ) {
        ctx.time_counters().windows_fired += 1;
        (self.emit)(ctx.key(), window, result, out);
    }

    /// Makes a key's slices, restored where windows are kept whole (with
    /// lateness or early firing), the windows they lie in, merged. A key
    /// whose slices each fill the window they are next in holds whole
    /// windows already: each such slice is the only one of its window.
    fn whole_windows(&self, windows: &mut Windows<A::Acc>) {
        let Some(slicing) = self.whole else {
            return;
        };
        if windows.iter().all(|(w, _)| slicing.is_window(w)) {
            return;
        }
        for (slice, acc) in std::mem::take(windows) {
            for window in slicing.windows(slice.start, slice.end) {
                match windows.iter_mut().find(|(w, _)| *w == window) {
                    Some((_, merged)) => self.aggregate.merge(merged, acc.clone()),
                    None => windows.push((window, acc.clone())),
                }
            }
        }
    }

    /// Adds `record` to the key's windows in place; the windows it went into
    /// go to `touched`, those whose time has passed to `due` with their
    /// result.
    fn add_to_windows(
        &mut self,
        record: &T,
        timestamp: u64,
        now: Option<u64>,
        ctx: &mut KeyedContext<'_, K>,
    ) {
        let mut entry = ctx.value(&self.windows);
        let windows = entry.get_or_default();
        self.whole_windows(windows);
        for window in self.assigner.assign(timestamp) {
            if is_late(now, self.cleanup_time(&window)) {
                continue;
            }
            let existing = windows.iter().position(|(w, _)| *w == window);
            let at = existing.unwrap_or_else(|| {
                windows.push((window, A::Acc::default()));
                windows.len() - 1
            });
            let acc = &mut windows[at].1;
            self.aggregate.add(acc, record);
            // An open window of a fixed size has its timers already.
            self.touched.push((window, existing.is_none()));
            if is_late(now, window.max_timestamp()) {
                self.due.push((window, self.aggregate.result(acc)));
            }
        }
        if windows.is_empty() {
            entry.clear();
        }
    }

    /// Adds `record` to the key's slice of `timestamp`: the entry of that
    /// slice whose next window is the first not yet fired. The windows it
    /// goes into go to `touched`, new unless another slice of the key lies
    /// in them.
    fn add_to_slice(
        &mut self,
        slicing: Slicing,
        record: &T,
        timestamp: u64,
        now: Option<u64>,
        ctx: &mut KeyedContext<'_, K>,
    ) {
        let start = slicing.start(timestamp);
        let mut end = slicing.first_end(start);
        if let Some(now) = now {
            // The windows ending at or before `now + 1` have fired.
            let fired = i64::try_from(now).unwrap_or(i64::MAX).saturating_add(1);
            if end <= fired {
                let behind = (fired - end) / slicing.slide() + 1;
                let next = behind.checked_mul(slicing.slide());
                match next.and_then(|n| end.checked_add(n)) {
                    Some(next) => end = next,
                    // No window ends after the time that has passed.
                    None => return,
                }
            }
        }
        if end > slicing.last_end(start) {
            return;
        }
        let slice = TimeWindow { start, end };
        let mut entry = ctx.value(&self.windows);
        let slices = entry.get_or_default();
        // The windows from each slice's next to its last have timers.
        let timed: SmallVec<[(i64, i64); 4]> = slices
            .iter()
            .map(|(s, _)| (s.end, slicing.last_end(s.start)))
            .collect();
        for window in slicing.windows(start, end) {
            let new = !timed
                .iter()
                .any(|&(from, to)| (from..=to).contains(&window.end));
            self.touched.push((window, new));
        }
        match slices.iter_mut().find(|(s, _)| *s == slice) {
            Some((_, acc)) => self.aggregate.add(acc, record),
            None => {
                let mut acc = A::Acc::default();
                self.aggregate.add(&mut acc, record);
                slices.push((slice, acc));
            }
        }
    }

    /// Fires the window ending after `timestamp` with the key's slices
    /// whose next window it is, merged; each then waits for its next
    /// window, or is gone after its last. Timers fire in time order, so an
    /// entry whose next window ended before is a whole window that fired
    /// and waited for late records, restored from a snapshot taken with
    /// lateness: it goes.
    fn fire_slices(
        &mut self,
        slicing: Slicing,
        timestamp: u64,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        let end = i64::try_from(timestamp).map_or(i64::MAX, |t| t.saturating_add(1));
        let aggregate = &self.aggregate;
        let fired = ctx.value(&self.windows).update(
            |slices| {
                let mut due = slices.iter().filter(|(s, _)| s.end == end);
                let fired = due.next().map(|(s, first)| {
                    let window = slicing.window(s.start, end);
                    let mut rest = due.peekable();
                    if rest.peek().is_none() {
                        return (window, aggregate.result(first));
                    }
                    let mut acc = first.clone();
                    for (_, other) in rest {
                        aggregate.merge(&mut acc, other.clone());
                    }
                    (window, aggregate.result(&acc))
                });
                slices.retain_mut(|(s, _)| {
                    if s.end != end {
                        return s.end > end;
                    }
                    match end.checked_add(slicing.slide()) {
                        Some(next) if next <= slicing.last_end(s.start) => {
                            s.end = next;
                            true
                        }
                        _ => false,
                    }
                });
                if slices.spilled() && slices.len() <= slices.inline_size() {
                    slices.shrink_to_fit();
                }
                fired
            },
            |slices| !slices.is_empty(),
        );
        if let Some((window, result)) = fired.flatten() {
            self.fire(ctx, &window, result, out);
        }
    }

    /// Adds `record` to the key's sessions, merging every session its own
    /// overlaps or touches.
    fn add_to_session(
        &mut self,
        record: &T,
        timestamp: u64,
        now: Option<u64>,
        ctx: &mut KeyedContext<'_, K>,
    ) {
        let mut windows = ctx.value(&self.windows).clear().unwrap_or_default();
        let mut window = self
            .assigner
            .assign(timestamp)
            .next()
            .expect("a record opens a session");
        let mut merged = Vec::new();
        let mut i = 0;
        while i < windows.len() {
            if windows[i].0.intersects(&window) {
                let (w, a) = windows.swap_remove(i);
                window = window.cover(&w);
                merged.push((w, a));
            } else {
                i += 1;
            }
        }
        if is_late(now, self.cleanup_time(&window)) {
            windows.extend(merged);
        } else {
            let mut acc = A::Acc::default();
            let mut deleted = false;
            // A session the record did not lengthen has its timers, unless
            // a merged one's deleted them. An implied one fires at the end
            // a session first had, and moves on from there.
            let mut new = if self.implies_timers() {
                merged.is_empty()
            } else {
                merged.iter().all(|(w, _)| *w != window)
            };
            for (w, a) in merged {
                if w != window && !self.implies_timers() {
                    self.delete_timers(ctx, &w);
                    deleted = true;
                }
                self.aggregate.merge(&mut acc, a);
            }
            if deleted {
                // A deleted time may have been another session's too.
                for (w, _) in &windows {
                    self.set_timers(ctx, w, now);
                }
                new = true;
            }
            self.aggregate.add(&mut acc, record);
            self.touched.push((window, new));
            if is_late(now, window.max_timestamp()) {
                self.due.push((window, self.aggregate.result(&acc)));
            }
            windows.push((window, acc));
        }
        if !windows.is_empty() {
            ctx.value(&self.windows).set(windows);
        }
    }

    /// The window's firing timer, unless its time has passed (`now`, the
    /// watermark or clock), when it fires on its records instead (as
    /// Flink's `EventTimeTrigger`); and its cleanup timer.
    fn set_timers(&self, ctx: &mut KeyedContext<'_, K>, window: &TimeWindow, now: Option<u64>) {
        if self.implies_timers() {
            // A window past its end is late: it was never opened.
            return ctx.register_implied_timer(window.max_timestamp());
        }
        let domain = self.assigner.domain;
        let (fire, cleanup) = (window.max_timestamp(), self.cleanup_time(window));
        if now.is_none_or(|now| fire > now) {
            ctx.register_timer(domain, fire);
        }
        if cleanup != fire {
            ctx.register_timer(domain, cleanup);
        }
    }

    fn delete_timers(&self, ctx: &mut KeyedContext<'_, K>, window: &TimeWindow) {
        let domain = self.assigner.domain;
        ctx.delete_timer(domain, window.max_timestamp());
        ctx.delete_timer(domain, self.cleanup_time(window));
    }
}

impl<K, T, A, O> KeyedProcessFunction<K, T, O> for WindowOperator<K, T, A, O>
where
    K: Key,
    T: Timestamped + Send,
    A: AggregateFunction<T>,
    O: Send,
{
    fn process(&mut self, record: T, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) {
        let (timestamp, now) = match self.assigner.domain {
            TimeDomain::EventTime => (record.timestamp(), ctx.current_watermark()),
            TimeDomain::ProcessingTime => {
                let now = ctx.current_processing_time();
                (now, Some(now.saturating_sub(1)))
            }
        };
        if self.assigner.is_merging() {
            self.add_to_session(&record, timestamp, now, ctx);
        } else if let Some(slicing) = self.slicing {
            self.add_to_slice(slicing, &record, timestamp, now, ctx);
        } else {
            self.add_to_windows(&record, timestamp, now, ctx);
        }
        let touched = std::mem::take(&mut self.touched);
        for (window, _) in touched.iter().filter(|(_, new)| *new) {
            self.set_timers(ctx, window, now);
        }
        if touched.is_empty()
            && is_late(
                now,
                timestamp.saturating_add(self.settings.allowed_lateness),
            )
        {
            ctx.time_counters().late_records += 1;
            if let Some(late) = &self.late {
                late(record, out);
            }
        }
        // A window whose time has passed but that is still allowed late
        // records fires again with each (Flink's EventTimeTrigger).
        for (window, result) in std::mem::take(&mut self.due) {
            self.fire(ctx, &window, result, out);
        }
        if let (Some(every), TimeDomain::EventTime, false) = (
            self.settings.early_firing,
            self.assigner.domain,
            touched.is_empty(),
        ) {
            let now = ctx.current_processing_time();
            ctx.register_processing_time_timer(now - now % every + every);
        }
        self.touched = touched;
        self.touched.clear();
    }

    fn restore_timers(&mut self, states: AllKeys<'_, K>, timers: &mut RestoredTimers<'_, K>) {
        if self.assigner.domain != TimeDomain::EventTime {
            return;
        }
        if let Some(slicing) = self.slicing {
            // Each window a key's slices lie in has fired for none of them.
            for (key, slices) in states.values(&self.windows) {
                let mut fires: SmallVec<[u64; 16]> = slices
                    .iter()
                    .flat_map(|(s, _)| slicing.windows(s.start, s.end))
                    .map(|w| w.max_timestamp())
                    .collect();
                fires.sort_unstable();
                fires.dedup();
                for fire in fires {
                    timers.imply_unless_keyed(key.clone(), fire);
                }
            }
            return;
        }
        // A key whose snapshot held keyed timers keeps them: they know
        // which windows fired (with allowed lateness, or before timers were
        // implied). The others' windows have not fired.
        for (key, mut windows) in states.values(&self.windows) {
            self.whole_windows(&mut windows);
            for (window, _) in windows {
                let fire = window.max_timestamp();
                if self.implies_timers() {
                    timers.imply_unless_keyed(key.clone(), fire);
                } else {
                    timers.register_unless_keyed(key.clone(), fire);
                    timers.register_unless_keyed(key.clone(), self.cleanup_time(&window));
                }
            }
        }
    }

    fn on_timer(
        &mut self,
        timestamp: u64,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        // A timer of the windows' own clock fires and cleans up the windows
        // of that time; one of the other clock is an early firing, of which
        // sliced windows have none (one left by a snapshot fires nothing).
        let early = ctx.timer_domain() != Some(self.assigner.domain);
        if let Some(slicing) = self.slicing {
            if !early {
                self.fire_slices(slicing, timestamp, ctx, out);
            }
            return;
        }
        let watermark = ctx.current_watermark();
        let mut due = std::mem::take(&mut self.due);
        let mut moved = None;
        let open = ctx.value(&self.windows).update(
            |windows| {
                self.whole_windows(windows);
                if early {
                    // Windows that fired for good wait only for late records.
                    let open = windows
                        .iter()
                        .filter(|(w, _)| !is_late(watermark, w.max_timestamp()));
                    due.extend(open.map(|(w, acc)| (*w, self.aggregate.result(acc))));
                } else {
                    // Cleaned up at or after its time: a window restored
                    // with less lateness than its timer was set for goes
                    // with that timer.
                    windows.retain(|(window, acc)| {
                        if window.max_timestamp() == timestamp {
                            due.push((*window, self.aggregate.result(acc)));
                        }
                        self.cleanup_time(window) > timestamp
                    });
                    if self.implies_timers() && self.assigner.is_merging() {
                        moved = windows
                            .iter()
                            .find(|(w, _)| w.start <= timestamp as i64)
                            .map(|(w, _)| w.max_timestamp());
                    }
                }
                !windows.is_empty()
            },
            |windows| !windows.is_empty(),
        );
        for (window, result) in due.drain(..) {
            self.fire(ctx, &window, result, out);
        }
        self.due = due;
        if let Some(end) = moved {
            // A session lengthened past the end its timer was set at.
            ctx.register_implied_timer(end);
        }
        if let (true, Some(true), Some(every)) = (early, open, self.settings.early_firing) {
            // From now, not from the timer: after a restore, the firings
            // missed while the job was down are not replayed one by one.
            let now = ctx.current_processing_time().max(timestamp);
            ctx.register_processing_time_timer(now - now % every + every);
        }
    }
}

/// Whether `until` has passed at `now` (the watermark, or the clock).
fn is_late(now: Option<u64>, until: u64) -> bool {
    now.is_some_and(|now| until <= now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Savepoints taken when windows were a `Vec` restore as they were.
    #[test]
    fn windows_are_stored_as_a_vec_was() {
        let w = |start| TimeWindow {
            start,
            end: start + 10,
        };
        for open in [vec![], vec![(w(0), 3u64)], vec![(w(0), 3), (w(5), 1)]] {
            let bytes = rmp_serde::to_vec(&open).unwrap();
            let windows: Windows<u64> = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(windows.as_slice(), open.as_slice());
            assert_eq!(rmp_serde::to_vec(&windows).unwrap(), bytes);
        }
    }
}
