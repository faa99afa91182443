//! Live figures of a running job, shared between its actors and its handle.

use dashmap::DashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tidemark::checkpoint::shared::Space;
use tidemark::checkpoint::{CompletedCheckpoint, StateHandle, SubtaskState};
use tidemark::ids::ChannelId;

/// High-water marks of one channel, against the credits that bound them.
#[derive(Debug, Default)]
pub struct ChannelGauge {
    pub output_credits: u32,
    pub input_credits: u32,
    max_output_queued: AtomicU32,
    max_input_buffered: AtomicU32,
}

impl ChannelGauge {
    pub fn new(output_credits: u32, input_credits: u32) -> Self {
        ChannelGauge {
            output_credits,
            input_credits,
            ..Default::default()
        }
    }

    pub fn observe_output(&self, queued: u32) {
        self.max_output_queued.fetch_max(queued, Ordering::Relaxed);
    }

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

#[derive(Debug, Default)]
pub struct JobMetrics {
    records_in: AtomicU64,
    pub channels: DashMap<ChannelId, Arc<ChannelGauge>>,
    pub checkpoints: CheckpointStats,
}

/// Figures of the checkpoints of a run.
#[derive(Debug, Default)]
pub struct CheckpointStats {
    /// Completed checkpoints; savepoints are counted apart.
    pub completed: AtomicU64,
    pub savepoints: AtomicU64,
    /// Trigger to the last savepoint's directory written, in microseconds.
    pub savepoint_us_last: AtomicU64,
    pub failed: AtomicU64,
    pub restarts: AtomicU64,
    /// Trigger to completion, per completed checkpoint, in milliseconds.
    pub durations_ms: Mutex<Vec<f64>>,
    /// Per acknowledgement, in milliseconds.
    pub alignments_ms: Mutex<Vec<f64>>,
    /// State size of the last completed checkpoint.
    pub bytes_full: AtomicU64,
    /// From a failure to the restored attempt's first records, in milliseconds.
    pub recoveries_ms: Mutex<Vec<f64>>,
    /// In-flight bytes persisted as channel state by the last completed
    /// checkpoint, and the most by any.
    pub inflight_last: AtomicU64,
    pub inflight_max: AtomicU64,
    /// Most batches persisted for one channel by any completed checkpoint.
    pub inflight_batches_per_channel_max: AtomicU32,
    /// Completed checkpoints that timed out aligning and went unaligned.
    pub switched_to_unaligned: AtomicU64,
    /// In-flight batches replayed by restores.
    pub restored_inflight_batches: AtomicU64,
    /// What completed checkpoints wrote themselves, as opposed to what they
    /// reference from earlier ones.
    pub bytes_uploaded_last: AtomicU64,
    pub bytes_uploaded_total: AtomicU64,
    pub files_uploaded_total: AtomicU64,
    /// Bytes each completed checkpoint wrote itself.
    pub bytes_uploaded_samples: Mutex<Vec<f64>>,
    /// The state the last restore read, and how long the restore took: from
    /// reading (downloads of native checkpoints included) until every
    /// subtask was built on its state.
    pub restored_bytes_last: AtomicU64,
    pub restore_us_last: AtomicU64,
    /// Physical objects the retained checkpoints reference, and their total
    /// over live bytes after the last completed checkpoint (as `f64` bits),
    /// and the most seen.
    pub physical_files_live: AtomicU64,
    pub space_amplification_last: AtomicU64,
    pub space_amplification_max: AtomicU64,
}

impl CheckpointStats {
    pub fn record_uploads(&self, checkpoint: &CompletedCheckpoint) {
        let written: Vec<u64> = checkpoint
            .subtasks
            .values()
            .flat_map(|s| s.written_by(checkpoint.id).map(StateHandle::size))
            .collect();
        let bytes = written.iter().sum();
        self.bytes_uploaded_last.store(bytes, Ordering::Relaxed);
        self.bytes_uploaded_total
            .fetch_add(bytes, Ordering::Relaxed);
        self.files_uploaded_total
            .fetch_add(written.len() as u64, Ordering::Relaxed);
        Self::record(&self.bytes_uploaded_samples, bytes as f64);
    }

    pub fn record_restore(&self, bytes: u64, took: std::time::Duration) {
        self.restored_bytes_last.store(bytes, Ordering::Relaxed);
        self.restore_us_last
            .store(took.as_micros() as u64, Ordering::Relaxed);
    }

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
    pub fn add_records_in(&self, n: u64) {
        self.records_in.fetch_add(n, Ordering::Relaxed);
    }

    /// Records read by all sources.
    pub fn records_in(&self) -> u64 {
        self.records_in.load(Ordering::Relaxed)
    }

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
