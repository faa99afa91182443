//! Live figures of a running job, shared between its actors and its handle.

use dashmap::DashMap;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tidemark_core::checkpoint::shared::Space;
use tidemark_core::checkpoint::stats::{CheckpointStatsTracker, SharedCheckpointStats};
use tidemark_core::checkpoint::{CompletedCheckpoint, StateHandle, SubtaskState};
use tidemark_core::cluster::rescale::Rescales;
use tidemark_core::model::ids::{ChannelId, OperatorId, SubtaskId};
use tidemark_core::model::rng::SplitMix64;
use tidemark_core::time::TimeMetrics;

/// High-water marks of one channel, against the credits that bound them.
#[derive(Debug, Default)]
pub struct ChannelGauge {
    /// Batches the output endpoint may have in flight: bounds
    /// `max_output_queued`.
    pub output_credits: u32,
    /// Batches the input endpoint grants: bounds `max_input_buffered`.
    pub input_credits: u32,
    max_output_queued: AtomicU32,
    max_input_buffered: AtomicU32,
}

impl ChannelGauge {
    /// A gauge with no batches seen yet.
    pub fn new(output_credits: u32, input_credits: u32) -> Self {
        ChannelGauge {
            output_credits,
            input_credits,
            ..Default::default()
        }
    }

    /// Called by the output endpoint with its current queue length.
    pub fn observe_output(&self, queued: u32) {
        self.max_output_queued.fetch_max(queued, Ordering::Relaxed);
    }

    /// Called by the input endpoint with the batches it holds or has handed
    /// to its subtask.
    pub fn observe_input(&self, buffered: u32) {
        self.max_input_buffered
            .fetch_max(buffered, Ordering::Relaxed);
    }

    /// Most batches ever queued in the output endpoint.
    pub fn max_output_queued(&self) -> u32 {
        self.max_output_queued.load(Ordering::Relaxed)
    }

    /// Most batches ever in the input endpoint or handed to its subtask.
    pub fn max_input_buffered(&self) -> u32 {
        self.max_input_buffered.load(Ordering::Relaxed)
    }
}

/// Live figures of one subtask, over all attempts: each attempt's actor
/// adds to the same counters, once per batch.
#[derive(Debug, Default)]
pub struct SubtaskCounters {
    records_in: AtomicU64,
    records_out: AtomicU64,
    backpressured_ns: AtomicU64,
    input_watermark: WatermarkGauge,
}

/// A watermark as Flink's gauges show it: `i64::MIN` (Flink's
/// `Long.MIN_VALUE`) until one arrives.
#[derive(Debug)]
struct WatermarkGauge(AtomicI64);

impl Default for WatermarkGauge {
    fn default() -> Self {
        WatermarkGauge(AtomicI64::new(i64::MIN))
    }
}

impl SubtaskCounters {
    /// Records taken in: read by a source, received by any other subtask.
    pub fn add_records_in(&self, n: u64) {
        self.records_in.fetch_add(n, Ordering::Relaxed);
    }

    /// Records sent on to downstream subtasks.
    pub fn add_records_out(&self, n: u64) {
        self.records_out.fetch_add(n, Ordering::Relaxed);
    }

    /// Time the subtask held output back for lack of credit, taking no
    /// input meanwhile (Flink's backpressured time).
    pub fn add_backpressured(&self, time: Duration) {
        self.backpressured_ns
            .fetch_add(time.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Records taken in so far.
    pub fn records_in(&self) -> u64 {
        self.records_in.load(Ordering::Relaxed)
    }

    /// Records sent on so far.
    pub fn records_out(&self) -> u64 {
        self.records_out.load(Ordering::Relaxed)
    }

    /// Time blocked on credit so far.
    pub fn backpressured(&self) -> Duration {
        Duration::from_nanos(self.backpressured_ns.load(Ordering::Relaxed))
    }

    /// The subtask's inputs together advanced to `watermark` (`u64::MAX`,
    /// the end of input, reads as Flink's `Long.MAX_VALUE`).
    pub fn set_input_watermark(&self, watermark: u64) {
        let flink = i64::try_from(watermark).unwrap_or(i64::MAX);
        self.input_watermark.0.store(flink, Ordering::Relaxed);
    }

    /// A new attempt: no watermark has reached it yet, whatever reached the
    /// one before (it restarts from a checkpoint's, lower).
    pub fn clear_input_watermark(&self) {
        self.input_watermark.0.store(i64::MIN, Ordering::Relaxed);
    }

    /// The watermark a worker process reported for its subtask.
    pub fn mirror_input_watermark(&self, flink: i64) {
        self.input_watermark.0.store(flink, Ordering::Relaxed);
    }

    /// Flink's `currentInputWatermark`, in ms: the least watermark of the
    /// inputs in this attempt, `i64::MIN` before any.
    pub fn input_watermark(&self) -> i64 {
        self.input_watermark.0.load(Ordering::Relaxed)
    }
}

/// What [`History`] keeps of one operator's subtasks, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OperatorTotals {
    /// Records sent on.
    pub records_out: u64,
    /// Milliseconds held back for lack of credit.
    pub backpressured_ms: u64,
}

/// Every operator's totals at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistorySample {
    /// When, in Unix milliseconds.
    pub unix_ms: u64,
    /// Operators with no subtask deployed yet are missing.
    pub operators: BTreeMap<OperatorId, OperatorTotals>,
}

/// The operators' totals over the run, so that charts opened at any moment
/// show the run so far, not only what they saw themselves. Sampled every
/// [`History::EVERY`]; once more than [`History::BOUND`] samples are kept,
/// every other one goes and the spacing doubles, so that they always reach
/// back to the start in bounded memory. The two newest samples are served
/// too, kept or not, so that a rate "now" spans one period however long
/// the run.
#[derive(Debug)]
pub struct History {
    /// Spacing of the kept samples.
    interval_ms: u64,
    kept: Vec<HistorySample>,
    /// The sample before the newest, and the newest: they stand for now.
    recent: [Option<HistorySample>; 2],
}

impl Default for History {
    fn default() -> Self {
        History {
            interval_ms: Self::EVERY.as_millis() as u64,
            kept: Vec::new(),
            recent: [None, None],
        }
    }
}

impl History {
    /// How often the sampler adds a sample.
    pub const EVERY: Duration = Duration::from_secs(1);
    /// Most samples kept: 5 minutes at the start's spacing.
    pub const BOUND: usize = 300;

    /// Adds `sample`, taken after every one before.
    pub fn record(&mut self, sample: HistorySample) {
        self.recent = [self.recent[1].take(), Some(sample.clone())];
        // Half a period of slack: a sampler's tick comes a little early or late.
        let slack = Self::EVERY.as_millis() as u64 / 2;
        let due = self.kept.last().is_none_or(|last| {
            sample.unix_ms.saturating_sub(last.unix_ms) + slack >= self.interval_ms
        });
        if !due {
            return;
        }
        self.kept.push(sample);
        if self.kept.len() > Self::BOUND {
            // The first (the start) and every other one after it.
            let mut position = 0;
            self.kept.retain(|_| {
                position += 1;
                position % 2 == 1
            });
            self.interval_ms *= 2;
        }
    }

    /// The samples, oldest first; the last two are the newest taken.
    pub fn samples(&self) -> impl Iterator<Item = &HistorySample> {
        let recent = self.recent.iter().flatten();
        let since = recent.clone().next().map_or(u64::MAX, |s| s.unix_ms);
        let older = self.kept.iter().take_while(move |s| s.unix_ms < since);
        older.chain(recent)
    }
}

/// The live figures of one job, over all its attempts: restarts add to
/// them, they never reset. [`crate::JobHandle::metrics`] reads them while the
/// job runs; the `--json` report is built from them.
#[derive(Debug)]
pub struct JobMetrics {
    records_in: AtomicU64,
    /// Records read by each source operator.
    records_by_source: DashMap<OperatorId, AtomicU64>,
    /// One gauge per channel, created at its first deployment and kept
    /// across restarts.
    pub channels: DashMap<ChannelId, Arc<ChannelGauge>>,
    /// Figures of checkpoints, savepoints, restarts and restores.
    pub checkpoints: CheckpointCounters,
    /// Timers, windows and watermarks, counted by the subtasks.
    pub time: Arc<TimeMetrics>,
    /// Per subtask, created at its first deployment and kept across
    /// restarts.
    subtasks: DashMap<SubtaskId, Arc<SubtaskCounters>>,
    /// Per checkpoint, operator and subtask, in a bounded history.
    pub checkpoint_stats: SharedCheckpointStats,
    /// Bytes written to the links between workers.
    pub link_bytes_sent: AtomicU64,
    /// The operators' totals over the run, once something samples them.
    history: Mutex<History>,
    /// The parallelism the job runs at and is asked for, and its
    /// rescales: the supervisor decides, the REST API reads.
    rescales: Mutex<Rescales>,
}

impl Default for JobMetrics {
    fn default() -> Self {
        JobMetrics::new(tidemark_core::checkpoint::stats::DEFAULT_HISTORY)
    }
}

/// Figures of the checkpoints of a run.
#[derive(Debug, Default)]
pub struct CheckpointCounters {
    /// Completed checkpoints; savepoints are counted apart.
    pub completed: AtomicU64,
    /// Savepoints written into their directory.
    pub savepoints: AtomicU64,
    /// Trigger to the last savepoint's directory written, in microseconds.
    pub savepoint_us_last: AtomicU64,
    /// Checkpoints and savepoints that expired, were declined or could not
    /// be finalized. Not counted: subsumed ones, those abandoned by a
    /// restart or the job's end, and those a master hook failed to trigger.
    pub failed: AtomicU64,
    /// Restarts after failures (not counting the one that gave up).
    pub restarts: AtomicU64,
    /// The restart strategy's delays before those restarts, summed, in
    /// microseconds: how much of a run went to waiting out failures.
    pub restart_wait_us: AtomicU64,
    /// Trigger to completion, per completed checkpoint, in milliseconds.
    pub durations_ms: Samples,
    /// How long a subtask waited for the barrier on all its inputs, per
    /// acknowledgement of the current attempt, in milliseconds.
    pub alignments_ms: Samples,
    /// Bytes of the whole state the last completed checkpoint references,
    /// shared files of earlier checkpoints and inline state included.
    pub bytes_full: AtomicU64,
    /// From a failure to the deployment of the next attempt that deploys
    /// (restored, if there is a checkpoint), in milliseconds; one sample per
    /// recovery.
    pub recoveries_ms: Samples,
    /// In-flight bytes persisted as channel state by the last completed
    /// checkpoint.
    pub inflight_last: AtomicU64,
    /// The most in-flight bytes any completed checkpoint persisted.
    pub inflight_max: AtomicU64,
    /// Most batches persisted for one channel (one side of it) by any
    /// completed checkpoint.
    pub inflight_batches_per_channel_max: AtomicU32,
    /// Completed checkpoints that timed out aligning and went unaligned.
    pub switched_to_unaligned: AtomicU64,
    /// In-flight batches that restores handed back to subtasks from channel
    /// state, over all restores.
    pub restored_inflight_batches: AtomicU64,
    /// Bytes the last completed checkpoint wrote itself, as opposed to what
    /// it references from earlier ones.
    pub bytes_uploaded_last: AtomicU64,
    /// Bytes all completed checkpoints wrote themselves.
    pub bytes_uploaded_total: AtomicU64,
    /// State handles all completed checkpoints wrote themselves: inline
    /// handles and segments of merged files count one each.
    pub files_uploaded_total: AtomicU64,
    /// Bytes each completed checkpoint wrote itself.
    pub bytes_uploaded_samples: Samples,
    /// Bytes of state the last restore read; 0 if the job never restored.
    pub restored_bytes_last: AtomicU64,
    /// The checkpoint the last restore read; 0 if the job never restored.
    pub restored_checkpoint_last: AtomicU64,
    /// How long the last restore took, in microseconds: from reading
    /// (downloads of native checkpoints included) until every subtask was
    /// built on its state.
    pub restore_us_last: AtomicU64,
    /// Physical objects the retained checkpoints reference, after the last
    /// completed checkpoint.
    pub physical_files_live: AtomicU64,
    /// Total over live bytes of those objects after the last completed
    /// checkpoint, as `f64` bits (`f64::from_bits`): 1.0 with no objects,
    /// infinite when none of their bytes is live.
    pub space_amplification_last: AtomicU64,
    /// The most `space_amplification_last` seen, as `f64` bits.
    pub space_amplification_max: AtomicU64,
    /// Timers in the keyed state of the last completed checkpoint.
    pub timers_last: AtomicU64,
    /// The most timers any completed checkpoint held.
    pub timers_max: AtomicU64,
}

impl CheckpointCounters {
    /// Adds what a completed checkpoint wrote itself to the upload figures,
    /// and keeps the timers it holds.
    pub fn record_uploads(&self, checkpoint: &CompletedCheckpoint) {
        let written: Vec<u64> = checkpoint
            .subtasks
            .values()
            .flat_map(|s| s.written_by(checkpoint.id).map(StateHandle::size))
            .collect();
        let bytes = written.iter().sum();
        self.bytes_uploaded_last.store(bytes, Ordering::Relaxed);
        let timers = checkpoint.subtasks.values().map(|s| s.timers).sum();
        self.timers_last.store(timers, Ordering::Relaxed);
        self.timers_max.fetch_max(timers, Ordering::Relaxed);
        self.bytes_uploaded_total
            .fetch_add(bytes, Ordering::Relaxed);
        self.files_uploaded_total
            .fetch_add(written.len() as u64, Ordering::Relaxed);
        Self::record(&self.bytes_uploaded_samples, bytes as f64);
    }

    /// Sets the last restore's figures: `bytes` of `checkpoint` read, `took`
    /// from reading until every subtask was built.
    pub fn record_restore(
        &self,
        checkpoint: tidemark_core::model::ids::CheckpointId,
        bytes: u64,
        took: std::time::Duration,
    ) {
        self.restored_checkpoint_last
            .store(checkpoint.0, Ordering::Relaxed);
        self.restored_bytes_last.store(bytes, Ordering::Relaxed);
        self.restore_us_last
            .store(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Sets the live objects and space amplification of the retained
    /// checkpoints, after a checkpoint completed.
    pub fn record_space(&self, files: usize, space: Space) {
        self.physical_files_live
            .store(files as u64, Ordering::Relaxed);
        let amplification = space.amplification();
        self.space_amplification_last
            .store(amplification.to_bits(), Ordering::Relaxed);
        // Non-negative floats order as their bits do.
        self.space_amplification_max
            .fetch_max(amplification.to_bits(), Ordering::Relaxed);
    }

    /// Sets the channel-state figures from a completed checkpoint.
    pub fn record_inflight(&self, checkpoint: &CompletedCheckpoint) {
        let states = checkpoint.subtasks.values();
        let bytes = states.clone().map(SubtaskState::inflight_bytes).sum();
        self.inflight_last.store(bytes, Ordering::Relaxed);
        self.inflight_max.fetch_max(bytes, Ordering::Relaxed);
        let batches = states
            .flat_map(|s| s.channels.iter().map(|c| c.batches))
            .max()
            .unwrap_or(0);
        self.inflight_batches_per_channel_max
            .fetch_max(batches, Ordering::Relaxed);
    }

    /// Adds one sample to `samples`: the same as [`Samples::record`].
    pub fn record(samples: &Samples, value: f64) {
        samples.record(value);
    }
}

/// The samples of one figure over a run (a duration per checkpoint, bytes
/// per checkpoint…), in bounded memory however long the job runs.
///
/// The count, sum, minimum and maximum are exact. Percentiles come from a
/// uniform random sample of at most [`Samples::BOUND`] values (Vitter's
/// algorithm R, drawn from a seeded SplitMix64, so that the same values give
/// the same sample): exact while no more values than that were recorded,
/// estimates of the whole run's after.
pub struct Samples {
    inner: Mutex<Reservoir>,
}

#[derive(Clone, Debug)]
struct Reservoir {
    bound: usize,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    kept: Vec<f64>,
    rng: SplitMix64,
}

impl Samples {
    /// Most values kept for percentiles: 32 KiB of `f64`s per figure.
    pub const BOUND: usize = 4096;
    const SEED: u64 = 0x7469_6465_6d61_726b;

    /// No samples, keeping at most `bound` of them for percentiles, chosen
    /// with a SplitMix64 stream seeded with `seed`.
    pub fn with_bound(bound: usize, seed: u64) -> Self {
        assert!(bound > 0, "a reservoir keeps at least one sample");
        Samples {
            inner: Mutex::new(Reservoir {
                bound,
                count: 0,
                sum: 0.0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
                kept: Vec::new(),
                rng: SplitMix64::new(seed),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reservoir> {
        // Every update leaves the figures consistent: a panic elsewhere
        // while the lock was held spoils nothing.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds one value.
    pub fn record(&self, value: f64) {
        let mut r = self.lock();
        r.count += 1;
        r.sum += value;
        r.min = r.min.min(value);
        r.max = r.max.max(value);
        if r.kept.len() < r.bound {
            r.kept.push(value);
        } else {
            // The n-th value replaces a kept one with probability bound/n.
            let n = r.count;
            let slot = r.rng.next_below(n);
            if let Some(kept) = r.kept.get_mut(slot as usize) {
                *kept = value;
            }
        }
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.lock().count
    }

    /// Values kept for percentiles: never more than the bound.
    pub fn kept(&self) -> usize {
        self.lock().kept.len()
    }

    /// The figures of the values recorded so far.
    pub fn summary(&self) -> Summary {
        let r = self.lock();
        let mut sorted = r.kept.clone();
        let (count, sum, min, max) = (r.count, r.sum, r.min, r.max);
        drop(r);
        sorted.sort_by(f64::total_cmp);
        Summary {
            count,
            sum,
            min: if count == 0 { 0.0 } else { min },
            max: if count == 0 { 0.0 } else { max },
            sorted,
        }
    }
}

impl Default for Samples {
    fn default() -> Self {
        Samples::with_bound(Samples::BOUND, Samples::SEED)
    }
}

impl std::fmt::Debug for Samples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.lock();
        f.debug_struct("Samples")
            .field("count", &r.count)
            .field("sum", &r.sum)
            .field("min", &r.min)
            .field("max", &r.max)
            .field("kept", &r.kept.len())
            .finish()
    }
}

/// What [`Samples::summary`] read.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Values recorded.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// The smallest; 0 with none.
    pub min: f64,
    /// The largest; 0 with none.
    pub max: f64,
    /// The values kept, in order.
    sorted: Vec<f64>,
}

impl Summary {
    /// The `q` quantile (0 ≤ `q` ≤ 1) of the kept values, the nearest rank
    /// (`round((n - 1) q)`); 0 with none. The extremes are the exact minimum
    /// and maximum of all values recorded.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.sorted.is_empty() {
            return 0.0;
        }
        if q >= 1.0 {
            return self.max;
        }
        if q <= 0.0 {
            return self.min;
        }
        let last = self.sorted.len() - 1;
        self.sorted[((last as f64 * q).round() as usize).min(last)]
    }

    /// The mean of all values recorded; 0 with none.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}

impl JobMetrics {
    /// No figures yet; the checkpoint history keeps `history` checkpoints.
    pub fn new(history: usize) -> Self {
        JobMetrics {
            records_in: AtomicU64::default(),
            records_by_source: DashMap::new(),
            channels: DashMap::new(),
            checkpoints: CheckpointCounters::default(),
            time: Arc::default(),
            subtasks: DashMap::new(),
            checkpoint_stats: CheckpointStatsTracker::shared(history),
            link_bytes_sent: AtomicU64::default(),
            history: Mutex::default(),
            rescales: Mutex::default(),
        }
    }

    /// The rescales' state, a poisoned lock's included: it holds no
    /// invariant a panic elsewhere could break halfway.
    pub fn rescales(&self) -> std::sync::MutexGuard<'_, Rescales> {
        self.rescales.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds every operator's totals at `unix_ms` to the history.
    pub fn sample_history(&self, unix_ms: u64) {
        let mut operators = BTreeMap::<OperatorId, OperatorTotals>::new();
        for (id, counters) in self.subtasks() {
            let totals = operators.entry(id.operator).or_default();
            totals.records_out += counters.records_out();
            totals.backpressured_ms += counters.backpressured().as_millis() as u64;
        }
        self.lock_history()
            .record(HistorySample { unix_ms, operators });
    }

    /// The operators' totals over the run, oldest first.
    pub fn history(&self) -> Vec<HistorySample> {
        self.lock_history().samples().cloned().collect()
    }

    fn lock_history(&self) -> std::sync::MutexGuard<'_, History> {
        // A sample is added whole or not at all: a panic elsewhere spoils
        // nothing.
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The counters of `subtask`, created on the first call.
    pub fn subtask(&self, subtask: SubtaskId) -> Arc<SubtaskCounters> {
        self.subtasks.entry(subtask).or_default().clone()
    }

    /// Every subtask's counters, in id order.
    pub fn subtasks(&self) -> Vec<(SubtaskId, Arc<SubtaskCounters>)> {
        let mut all: Vec<_> = self
            .subtasks
            .iter()
            .map(|e| (*e.key(), e.value().clone()))
            .collect();
        all.sort_by_key(|(id, _)| *id);
        all
    }

    /// Called by the subtasks of source `operator` with the records they
    /// read, replays included.
    pub fn add_records_in(&self, operator: OperatorId, n: u64) {
        self.records_in.fetch_add(n, Ordering::Relaxed);
        self.records_by_source
            .entry(operator)
            .or_default()
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Records read by the subtasks of source `operator`, over all
    /// attempts.
    pub fn records_in_of(&self, operator: OperatorId) -> u64 {
        self.records_by_source
            .get(&operator)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// Records read by all sources, over all attempts: replays after a
    /// restore count again.
    pub fn records_in(&self) -> u64 {
        self.records_in.load(Ordering::Relaxed)
    }

    /// The gauge of channel `id`, created with these credits on the first
    /// call; later calls return it as it is, whatever credits they pass.
    pub fn channel(
        &self,
        id: ChannelId,
        output_credits: u32,
        input_credits: u32,
    ) -> Arc<ChannelGauge> {
        self.channels
            .entry(id)
            .or_insert_with(|| Arc::new(ChannelGauge::new(output_credits, input_credits)))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The percentiles the report used to compute over every value.
    fn exact(values: &[f64], q: f64) -> f64 {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    }

    #[test]
    fn no_samples_read_as_zeros() {
        let s = Samples::default().summary();
        assert_eq!((s.count, s.min, s.max, s.mean()), (0, 0.0, 0.0, 0.0));
        assert_eq!((s.quantile(0.5), s.quantile(0.99)), (0.0, 0.0));
    }

    #[test]
    fn percentiles_are_exact_up_to_the_bound() {
        let mut rng = SplitMix64::new(7);
        let values: Vec<f64> = (0..Samples::BOUND)
            .map(|_| rng.next_below(1_000_000) as f64 / 7.0)
            .collect();
        let samples = Samples::default();
        for (i, &v) in values.iter().enumerate() {
            samples.record(v);
            if [0, 1, 2, 10, 99, Samples::BOUND - 1].contains(&i) {
                let seen = &values[..=i];
                let s = samples.summary();
                for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
                    assert_eq!(
                        s.quantile(q),
                        exact(seen, q),
                        "q {q} after {} values",
                        i + 1
                    );
                }
                assert_eq!(s.count, i as u64 + 1);
            }
        }
        let s = samples.summary();
        assert_eq!(s.min, exact(&values, 0.0));
        assert_eq!(s.max, exact(&values, 1.0));
        assert_eq!(s.sum, values.iter().sum::<f64>());
    }

    #[test]
    fn a_few_samples() {
        let samples = Samples::default();
        for v in [30.0, 10.0, 20.0] {
            samples.record(v);
        }
        let s = samples.summary();
        assert_eq!(
            (s.quantile(0.5), s.quantile(0.99), s.max),
            (20.0, 30.0, 30.0)
        );
        assert_eq!((s.min, s.mean()), (10.0, 20.0));
    }

    #[test]
    fn a_million_samples_stay_bounded_with_exact_extremes() {
        let samples = Samples::default();
        let n = 1_000_000u64;
        // A shuffled 0..n: the extremes arrive in the middle of the run.
        let mut sum = 0.0;
        for i in 0..n {
            let v = ((i * 7919) % n) as f64;
            sum += v;
            samples.record(v);
            assert!(samples.kept() <= Samples::BOUND);
        }
        assert_eq!(samples.kept(), Samples::BOUND);
        let s = samples.summary();
        assert_eq!((s.count, s.min, s.max), (n, 0.0, (n - 1) as f64));
        assert_eq!(s.sum, sum);
        assert_eq!(s.quantile(1.0), (n - 1) as f64);
        // A uniform sample of 4096: the median within a few percent.
        let median = s.quantile(0.5) / n as f64;
        assert!((0.45..0.55).contains(&median), "median at {median}");
        let p99 = s.quantile(0.99) / n as f64;
        assert!((0.98..1.0).contains(&p99), "p99 at {p99}");
    }

    #[test]
    fn late_values_are_sampled_too() {
        // A run whose later half is ten times slower: a reservoir that kept
        // only the first values would say nothing of it.
        let samples = Samples::with_bound(256, 1);
        for i in 0..100_000 {
            samples.record(if i < 50_000 { 1.0 } else { 10.0 });
        }
        let s = samples.summary();
        assert_eq!(s.quantile(0.1), 1.0);
        assert_eq!(s.quantile(0.9), 10.0);
        assert_eq!(s.mean(), 5.5);
    }

    fn sample(unix_ms: u64) -> HistorySample {
        let totals = OperatorTotals {
            records_out: unix_ms,
            backpressured_ms: 0,
        };
        HistorySample {
            unix_ms,
            operators: BTreeMap::from([(OperatorId(0), totals)]),
        }
    }

    #[test]
    fn the_history_reaches_back_to_the_start_in_bounded_memory() {
        let every = History::EVERY.as_millis() as u64;
        let mut history = History::default();
        // A day of samples, some ticks a little late.
        let ticks = 86_400;
        for tick in 0..ticks {
            let late = [0, 40, 0, 5, 30][tick as usize % 5];
            history.record(sample(tick * every + late));
            assert!(history.samples().count() <= History::BOUND + 2);
        }
        let times: Vec<u64> = history.samples().map(|s| s.unix_ms).collect();
        assert_eq!(times[0], 0, "the start is kept");
        assert!(
            *times.last().unwrap() >= (ticks - 1) * every,
            "the newest sample stands for now"
        );
        let [before, newest] = [times[times.len() - 2], times[times.len() - 1]];
        assert!(newest - before <= 2 * every, "a rate now spans one period");
        assert!(
            times.windows(2).all(|w| w[0] < w[1]),
            "in time order, once each"
        );
        assert!(times.len() > History::BOUND / 2, "{} samples", times.len());
        // Evenly spread: no gap much wider than the spacing the bound allows.
        let widest = times.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(
            widest <= 2 * ticks * every / History::BOUND as u64 + every,
            "a gap of {widest} ms"
        );
    }

    #[test]
    fn the_two_newest_samples_stand_for_now_kept_or_not() {
        let mut history = History {
            interval_ms: 4_000,
            ..History::default()
        };
        for t in [0, 1_000, 2_000, 3_000] {
            history.record(sample(t));
        }
        let times = |h: &History| h.samples().map(|s| s.unix_ms).collect::<Vec<_>>();
        assert_eq!(times(&history), [0, 2_000, 3_000]);
        history.record(sample(4_000));
        history.record(sample(5_000));
        assert_eq!(times(&history), [0, 4_000, 5_000]);
    }

    #[test]
    fn the_same_values_give_the_same_sample() {
        let run = || {
            let samples = Samples::with_bound(64, 42);
            for i in 0..10_000 {
                samples.record(f64::from(i));
            }
            samples.summary()
        };
        let (a, b) = (run(), run());
        assert_eq!(a.sorted, b.sorted);
        assert_eq!(a.quantile(0.5), b.quantile(0.5));
        // And another seed another sample.
        let other = Samples::with_bound(64, 43);
        for i in 0..10_000 {
            other.record(f64::from(i));
        }
        assert_ne!(other.summary().sorted, a.sorted);
    }
}
