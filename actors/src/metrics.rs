//! Live figures of a running job, shared between its actors and its handle.

use dashmap::DashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tidemark::checkpoint::shared::Space;
use tidemark::checkpoint::{CompletedCheckpoint, StateHandle, SubtaskState};
use tidemark::ids::{ChannelId, OperatorId};
use tidemark::time::TimeMetrics;

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

/// The live figures of one job, over all its attempts: restarts add to
/// them, they never reset. [`crate::JobHandle::metrics`] reads them while the
/// job runs; the `--json` report is built from them.
#[derive(Debug, Default)]
pub struct JobMetrics {
    records_in: AtomicU64,
    /// Records read by each source operator.
    records_by_source: DashMap<OperatorId, AtomicU64>,
    /// One gauge per channel, created at its first deployment and kept
    /// across restarts.
    pub channels: DashMap<ChannelId, Arc<ChannelGauge>>,
    /// Figures of checkpoints, savepoints, restarts and restores.
    pub checkpoints: CheckpointStats,
    /// Timers, windows and watermarks, counted by the subtasks.
    pub time: Arc<TimeMetrics>,
}

/// Figures of the checkpoints of a run.
#[derive(Debug, Default)]
pub struct CheckpointStats {
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
    /// Trigger to completion, per completed checkpoint, in milliseconds.
    pub durations_ms: Mutex<Vec<f64>>,
    /// How long a subtask waited for the barrier on all its inputs, per
    /// acknowledgement of the current attempt, in milliseconds.
    pub alignments_ms: Mutex<Vec<f64>>,
    /// Bytes of the whole state the last completed checkpoint references,
    /// shared files of earlier checkpoints and inline state included.
    pub bytes_full: AtomicU64,
    /// From a failure to the deployment of the next attempt that deploys
    /// (restored, if there is a checkpoint), in milliseconds; one sample per
    /// recovery.
    pub recoveries_ms: Mutex<Vec<f64>>,
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
    pub bytes_uploaded_samples: Mutex<Vec<f64>>,
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

impl CheckpointStats {
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
        checkpoint: tidemark::ids::CheckpointId,
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

    /// Adds one sample to `samples`, for [`CheckpointStats::percentiles`].
    pub fn record(samples: &Mutex<Vec<f64>>, value: f64) {
        samples.lock().expect("metrics lock").push(value);
    }

    /// (p50, p99, max) of the samples; zeros when there are none.
    pub fn percentiles(samples: &Mutex<Vec<f64>>) -> (f64, f64, f64) {
        let mut v = samples.lock().expect("metrics lock").clone();
        if v.is_empty() {
            return (0.0, 0.0, 0.0);
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        (at(0.5), at(0.99), v[v.len() - 1])
    }
}

impl JobMetrics {
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
