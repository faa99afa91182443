//! The interval join, as Flink's `intervalJoin().between(lower, upper)`: a
//! keyed two-input function that pairs a left record `a` with every right
//! record `b` of its key whose timestamp lies in
//! `[ts(a) + lower, ts(a) + upper]`, bounds included.
//!
//! Each side's records wait in keyed state until the watermark shows that
//! no record of the other side can pair with them any more: a left record
//! at `t` can pair with right records up to `t + upper`, a right record
//! with left records up to `t - lower`. An event-time timer per key and
//! cleanup time removes them then, so the state stays bounded by the
//! interval and the disorder, and rides every checkpoint, savepoint and
//! rescale as any keyed state does. A record behind the watermark is late
//! and dropped (counted), as in Flink.

use super::{TimeMetrics, Timestamped};
use crate::operator::Collector;
use crate::state::{AllKeys, Key, KeyedContext, StateRegistrar, ValueState};
use crate::two_input::KeyedCoProcessFunction;
use crate::Data;
use std::sync::Arc;

/// Emits what one joined pair yields.
pub type JoinFunction<L, R, O> = Arc<dyn Fn(&L, &R, &mut Collector<'_, O>) + Send + Sync>;

/// The keyed state names of the two buffers.
pub const LEFT_BUFFER: &str = "join-left";
/// See [`LEFT_BUFFER`].
pub const RIGHT_BUFFER: &str = "join-right";

/// A buffered side of one key: records with their timestamps, in arrival
/// order.
type Buffer<T> = Vec<(u64, T)>;

/// The interval join of one subtask.
pub struct IntervalJoin<L, R, O> {
    lower: i64,
    upper: i64,
    left: ValueState<Buffer<L>>,
    right: ValueState<Buffer<R>>,
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
            left: states.value(LEFT_BUFFER),
            right: states.value(RIGHT_BUFFER),
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

    /// A record of one side at `t`, not late, arrives: it pairs with the
    /// other side's buffered records from `from` to `to`, through `emit`,
    /// and waits in its own side's buffer until `expiry`.
    #[allow(clippy::too_many_arguments)]
    fn arrive<K: Key, Mine: Data, Other: Data>(
        ctx: &mut KeyedContext<'_, K>,
        mine: &ValueState<Buffer<Mine>>,
        other: &ValueState<Buffer<Other>>,
        record: Mine,
        t: u64,
        (from, to): (u64, u64),
        expiry: u64,
        mut emit: impl FnMut(&Mine, &Other),
    ) {
        if ctx.current_watermark().is_some_and(|w| t < w) {
            ctx.time_counters().late_records += 1;
            return;
        }
        let mut pairs = 0;
        if let Some(buffered) = ctx.value(other).get() {
            for (_, o) in buffered.iter().filter(|(u, _)| (from..=to).contains(u)) {
                emit(&record, o);
                pairs += 1;
            }
        }
        ctx.time_counters().join_pairs += pairs;
        ctx.value(mine).get_or_default().push((t, record));
        ctx.register_event_time_timer(expiry);
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
        let range = (shift(t, self.lower), shift(t, self.upper));
        let join = &self.join;
        Self::arrive(
            ctx,
            &self.left,
            &self.right,
            record,
            t,
            range,
            self.left_expiry(t),
            |a, b| join(a, b, out),
        );
    }

    fn process_right(
        &mut self,
        record: R,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        let t = record.timestamp();
        let range = (shift(t, -self.upper), shift(t, -self.lower));
        let join = &self.join;
        Self::arrive(
            ctx,
            &self.right,
            &self.left,
            record,
            t,
            range,
            self.right_expiry(t),
            |b, a| join(a, b, out),
        );
    }

    fn on_timer(
        &mut self,
        timestamp: u64,
        ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) {
        ctx.value(&self.left).update(
            |b| b.retain(|(t, _)| self.left_expiry(*t) > timestamp),
            |b| !b.is_empty(),
        );
        ctx.value(&self.right).update(
            |b| b.retain(|(t, _)| self.right_expiry(*t) > timestamp),
            |b| !b.is_empty(),
        );
    }

    fn end_of_input(&mut self, states: AllKeys<'_, K>, _out: &mut Collector<'_, O>) {
        let left: usize = states.values(&self.left).map(|(_, b)| b.len()).sum();
        let right: usize = states.values(&self.right).map(|(_, b)| b.len()).sum();
        self.metrics.add_join_buffered((left + right) as u64);
    }
}
