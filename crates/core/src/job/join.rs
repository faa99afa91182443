//! The interval join, as Flink's `intervalJoin().between(lower, upper)`: a
//! keyed two-input function that pairs a left record `a` with every right
//! record `b` of its key whose timestamp lies in
//! `[ts(a) + lower, ts(a) + upper]`, bounds included.
//!
//! Each side's records wait in keyed state until the watermark shows that
//! no record of the other side can pair with them any more: a left record
//! at `t` can pair with right records up to `t + upper`, a right record
//! with left records up to `t - lower`. Both sides of a key are one state
//! value, so a record costs one state access; the key has one event-time
//! cleanup time at a time, rounded up to a multiple of the interval's
//! length, so that records arriving in time order register none and one
//! firing clears several. That time is in the buffers, so its timer is
//! implied (`KeyedContext::register_implied_timer`): setting one writes no
//! other state, and a timer an earlier one replaced fires to no effect.
//! The state thus stays bounded by the interval, the disorder and that
//! rounding, and rides every checkpoint, savepoint and rescale as any keyed
//! state does. A record behind the watermark is late and dropped (counted),
//! as in Flink.

use crate::dataflow::operator::Collector;
use crate::dataflow::two_input::KeyedCoProcessFunction;
use crate::state::timers::RestoredTimers;
use crate::state::{AllKeys, Key, KeyedContext, StateRegistrar, ValueState};
use crate::time::{TimeMetrics, Timestamped};
use crate::Data;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::sync::Arc;

/// Emits what one joined pair yields.
pub type JoinFunction<L, R, O> = Arc<dyn Fn(&L, &R, &mut Collector<'_, O>) + Send + Sync>;

/// The keyed state name of the join's buffers.
pub const JOIN_BUFFERS: &str = "join-buffers";

/// One side's records of a key, with their timestamps, in arrival order.
/// Keys are usually sparse: one record is held without an allocation.
type Side<T> = SmallVec<[(u64, T); 1]>;

/// Picks the arriving record's side (to append to) and the other side (to
/// probe) out of a key's buffers.
type PickSides<L, R, Mine, Other> = fn(&mut Buffers<L, R>) -> (&mut Side<Mine>, &Side<Other>);

/// The records of one key waiting for a partner, and the key's cleanup
/// timer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "L: Serialize, R: Serialize"))]
#[serde(bound(deserialize = "L: Deserialize<'de>, R: Deserialize<'de>"))]
pub struct Buffers<L, R> {
    left: Side<L>,
    right: Side<R>,
    /// The key's cleanup time, if any: its implied timer.
    timer: Option<u64>,
}

impl<L, R> Default for Buffers<L, R> {
    fn default() -> Self {
        Buffers {
            left: SmallVec::new(),
            right: SmallVec::new(),
            timer: None,
        }
    }
}

impl<L, R> Buffers<L, R> {
    /// Records buffered.
    pub fn len(&self) -> usize {
        self.left.len() + self.right.len()
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn left_side(&mut self) -> (&mut Side<L>, &Side<R>) {
        (&mut self.left, &self.right)
    }

    fn right_side(&mut self) -> (&mut Side<R>, &Side<L>) {
        (&mut self.right, &self.left)
    }
}

/// The interval join of one subtask.
pub struct IntervalJoin<L, R, O> {
    lower: i64,
    upper: i64,
    /// Cleanup timers are rounded up to multiples of it.
    granularity: u64,
    buffers: ValueState<Buffers<L, R>>,
    join: JoinFunction<L, R, O>,
    metrics: Arc<TimeMetrics>,
}

/// `t + d`, clamped to the timestamps there are.
fn shift(t: u64, d: i64) -> u64 {
    t.saturating_add_signed(d)
}

impl<L: Data, R: Data, O> IntervalJoin<L, R, O> {
    /// The join of `lower..=upper` (milliseconds, `lower <= upper`),
    /// declaring its buffers in `states`; what is still buffered at the end
    /// of input is counted in `metrics`.
    pub fn open<K: Key>(
        states: &mut StateRegistrar<'_, K>,
        lower: i64,
        upper: i64,
        join: JoinFunction<L, R, O>,
        metrics: Arc<TimeMetrics>,
    ) -> Self {
        IntervalJoin {
            lower,
            upper,
            granularity: upper.abs_diff(lower).max(1),
            buffers: states.value(JOIN_BUFFERS),
            join,
            metrics,
        }
    }

    /// When a left record at `t` can pair with nothing more.
    fn left_expiry(&self, t: u64) -> u64 {
        shift(t, self.upper.max(0))
    }

    /// When a right record at `t` can pair with nothing more.
    fn right_expiry(&self, t: u64) -> u64 {
        shift(t, -self.lower.min(0))
    }

    /// The cleanup time of a record that expires at `expiry`.
    fn cleanup(&self, expiry: u64) -> u64 {
        expiry
            .div_ceil(self.granularity)
            .saturating_mul(self.granularity)
    }

    /// A record of one side at `t` arrives: unless it is late, it pairs
    /// through `emit` with the other side's buffered records whose
    /// timestamps lie in `range`, and waits in its own side's buffer
    /// (`sides` picks both out of the key's buffers) until `expiry`. One
    /// state access; the timer is only touched to make it earlier.
    #[allow(clippy::too_many_arguments)]
    fn arrive<K: Key, Mine, Other>(
        &self,
        ctx: &mut KeyedContext<'_, K>,
        record: Mine,
        t: u64,
        range: std::ops::RangeInclusive<u64>,
        expiry: u64,
        sides: PickSides<L, R, Mine, Other>,
        mut emit: impl FnMut(&Mine, &Other),
    ) {
        if ctx.current_watermark().is_some_and(|w| t < w) {
            ctx.time_counters().late_records += 1;
            return;
        }
        let at = self.cleanup(expiry);
        let mut entry = ctx.value(&self.buffers);
        let buffers = entry.get_or_default();
        let earlier = buffers.timer.is_none_or(|set| at < set);
        if earlier {
            buffers.timer = Some(at);
        }
        let (mine, other) = sides(buffers);
        let mut pairs = 0;
        for (_, o) in other.iter().filter(|(u, _)| range.contains(u)) {
            emit(&record, o);
            pairs += 1;
        }
        mine.push((t, record));
        ctx.time_counters().join_pairs += pairs;
        if earlier {
            ctx.register_implied_timer(at);
        }
    }
}

impl<K, L, R, O> KeyedCoProcessFunction<K, L, R, O> for IntervalJoin<L, R, O>
where
    K: Key,
    L: Data + Timestamped,
    R: Data + Timestamped,
    O: Send,
{
    fn process_left(
        &mut self,
        record: L,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        let t = record.timestamp();
        let range = shift(t, self.lower)..=shift(t, self.upper);
        let (join, expiry) = (&self.join, self.left_expiry(t));
        let sides = Buffers::left_side;
        self.arrive(ctx, record, t, range, expiry, sides, |a, b| join(a, b, out));
    }

    fn process_right(
        &mut self,
        record: R,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        let t = record.timestamp();
        let range = shift(t, -self.upper)..=shift(t, -self.lower);
        let (join, expiry) = (&self.join, self.right_expiry(t));
        let sides = Buffers::right_side;
        self.arrive(ctx, record, t, range, expiry, sides, |b, a| join(a, b, out));
    }

    fn on_timer(
        &mut self,
        timestamp: u64,
        ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) {
        let next = ctx.value(&self.buffers).update(
            |b| {
                b.left.retain(|(t, _)| self.left_expiry(*t) > timestamp);
                b.right.retain(|(t, _)| self.right_expiry(*t) > timestamp);
                if b.timer != Some(timestamp) {
                    // An earlier timer replaced this one.
                    return None;
                }
                let expiries = b.left.iter().map(|(t, _)| self.left_expiry(*t));
                let right = b.right.iter().map(|(t, _)| self.right_expiry(*t));
                b.timer = expiries.chain(right).min().map(|e| self.cleanup(e));
                b.timer
            },
            |b| !b.is_empty(),
        );
        if let Some(Some(at)) = next {
            ctx.register_implied_timer(at);
        }
    }

    fn restore_timers(&mut self, states: AllKeys<'_, K>, timers: &mut RestoredTimers<'_, K>) {
        // A snapshot's keyed timer of the key fires too: to no effect if
        // this one fired first.
        for (key, buffers) in states.values(&self.buffers) {
            if let Some(at) = buffers.timer {
                timers.imply(key, at);
            }
        }
    }

    fn end_input(&mut self, states: AllKeys<'_, K>, _out: &mut Collector<'_, O>) {
        let buffered: usize = states.values(&self.buffers).map(|(_, b)| b.len()).sum();
        self.metrics.add_join_buffered(buffered as u64);
    }
}
