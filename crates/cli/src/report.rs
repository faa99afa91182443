//! The report of `tidemark run`: what the job did, from its metrics and its
//! checkpoint storage's counters, printed as JSON with `--json`.

use super::Topology;
use crate::config::Mode;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use tidemark_actors::metrics::{JobMetrics, Samples};
use tidemark_actors::runtime::JobReport;
use tidemark_core::cluster::rescale::Rescale;
use tidemark_core::model::channel::ChannelConfig;
use tidemark_core::model::ids::OperatorId;
use tidemark_storage::{CheckpointStorage, StorageCounters};

/// The `--json` report.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// What ran.
    pub topology: Topology,
    /// Records read by all sources, replays included.
    pub records_in: u64,
    /// The same, source by source (by uid).
    pub records_in_by_source: BTreeMap<String, u64>,
    /// From deployment to the end of the job.
    pub elapsed_s: f64,
    /// `records_in` over `elapsed_s`.
    pub throughput_rps: f64,
    /// Subtasks per operator.
    pub parallelism: u32,
    /// Most batches queued in any output endpoint.
    pub max_output_queued: u32,
    /// An output endpoint's credits, which bound `max_output_queued`.
    pub output_credits: u32,
    /// Most batches held by any input endpoint and its subtask.
    pub max_input_buffered: u32,
    /// An input endpoint's credits, which bound `max_input_buffered`.
    pub input_credits: u32,
    /// Checkpoints that completed.
    pub checkpoints_completed: u64,
    /// Checkpoints that failed.
    pub checkpoints_failed: u64,
    /// Restarts after failures.
    pub restarts: u64,
    /// The restart strategy's delays before those restarts, summed: time
    /// the job spent waiting to restart (`recovery_ms` includes it).
    pub restart_wait_ms: f64,
    /// Trigger to completion of each completed checkpoint.
    pub checkpoint_duration_ms: Percentiles,
    /// How long subtasks waited for barriers on all inputs.
    pub alignment_ms: Percentiles,
    /// The whole state the last completed checkpoint references.
    pub checkpointed_bytes_full: u64,
    /// What the last completed checkpoint wrote itself.
    pub bytes_uploaded_last: u64,
    /// What all completed checkpoints wrote themselves.
    pub bytes_uploaded_total: u64,
    /// Files all completed checkpoints wrote themselves.
    pub files_uploaded_total: u64,
    /// What each completed checkpoint wrote itself.
    pub bytes_uploaded_per_checkpoint: Percentiles,
    /// Aligned or unaligned checkpoints.
    pub mode: Mode,
    /// In-flight bytes persisted by the last completed checkpoint, and the
    /// most by any.
    pub persisted_inflight_bytes: LastMax,
    /// Most batches persisted for one channel by one checkpoint.
    pub persisted_inflight_batches_per_channel_max: u32,
    /// Aligned checkpoints whose alignment timed out at some subtask.
    pub checkpoints_switched_to_unaligned: u64,
    /// In-flight batches that restores replayed from channel state.
    pub restored_inflight_batches: u64,
    /// Bytes written to the TCP links between workers (0 in one worker).
    pub link_bytes_sent: u64,
    /// From a failure to the restored attempt's deployment.
    pub recovery_ms: Percentiles,
    /// The state the last restore read (from `--restore` or a failover).
    pub restored_bytes: u64,
    /// The checkpoint (or savepoint) id the last restore read; absent if
    /// the job never restored.
    pub restored_checkpoint: Option<u64>,
    /// How long the last restore took, from reading and downloading its
    /// state until every subtask's state was rebuilt from it.
    pub restore_ms: f64,
    /// Physical objects the retained checkpoints reference.
    pub physical_files_live: u64,
    /// Their total over live bytes after the last completed checkpoint.
    pub space_amplification: f64,
    /// The most `space_amplification` seen.
    pub space_amplification_max: f64,
    /// Objects the run created in checkpoint storage, metadata and the id
    /// counter included.
    pub objects_created: u64,
    /// Objects the run deleted from checkpoint storage.
    pub objects_deleted: u64,
    /// Bytes of every put to checkpoint storage.
    pub bytes_uploaded: u64,
    /// Savepoints that completed.
    pub savepoints_completed: u64,
    /// Trigger to the last savepoint's directory written.
    pub savepoint_ms: f64,
    /// Where the savepoint of --savepoint-after or
    /// --stop-with-savepoint-after is, if it completed.
    pub savepoint: Option<String>,
    /// Window results emitted, early and late firings included.
    pub windows_fired: u64,
    /// Records too late for every window they belong to.
    pub late_records: u64,
    /// Event- and processing-time timers set (not counting ones already set).
    pub timers_registered: u64,
    /// Timers fired, replays after a restore included.
    pub timers_fired: u64,
    /// Timers held by the last completed checkpoint.
    pub timers_in_last_checkpoint: u64,
    /// The most timers any completed checkpoint held.
    pub timers_in_checkpoint_max: u64,
    /// How far the last watermark before the end of input trailed the
    /// newest timestamp the sources read, in ms; `null` without watermarks.
    pub watermark_lag_ms: Option<u64>,
    /// Pairs interval joins emitted, replays after a restore included.
    pub pairs_emitted: u64,
    /// The rescales of the run (`--rescale-after`, the REST API), oldest
    /// first.
    pub rescales: Vec<RescaleFigures>,
    /// Records interval joins still buffered when their input ended: 0
    /// after a bounded run, as the final watermark clears them.
    pub join_buffered_at_end: u64,
}

/// A figure's last value and its most.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LastMax {
    /// The last value.
    pub last: u64,
    /// The most.
    pub max: u64,
}

/// The median, 99th percentile and maximum of a run's samples; zeros with
/// none. The maximum is exact; the percentiles are exact up to
/// [`Samples::BOUND`] samples and estimated from a uniform sample of that many
/// beyond.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Percentiles {
    /// The median.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The maximum.
    pub max: f64,
}

impl Percentiles {
    fn of(samples: &Samples) -> Self {
        let summary = samples.summary();
        Percentiles {
            p50: summary.quantile(0.5),
            p99: summary.quantile(0.99),
            max: summary.max,
        }
    }
}

/// One rescale of the run.
#[derive(Clone, Debug, Serialize)]
pub struct RescaleFigures {
    /// The parallelism of every operator before.
    pub from: Vec<u32>,
    /// The parallelism asked for.
    pub to: Vec<u32>,
    /// `COMPLETED`, `FAILED` or `IGNORED`, as Flink's history; `null` if
    /// it was under way when the job ended.
    pub state: Option<&'static str>,
    /// From the request to the new attempt running.
    pub took_ms: Option<u64>,
    /// From the old attempt's stop to the new one running.
    pub pause_ms: Option<u64>,
}

impl RescaleFigures {
    fn of(rescale: &Rescale) -> Self {
        RescaleFigures {
            from: rescale.from.clone(),
            to: rescale.to.clone(),
            state: rescale.end.as_ref().map(|end| end.flink_names().0),
            took_ms: rescale
                .ended_ms
                .map(|end| end.saturating_sub(rescale.started_ms)),
            pause_ms: rescale.pause_ms(),
        }
    }
}

/// A finished run, what its report is made from.
pub(super) struct Finished<'a> {
    pub topology: Topology,
    pub mode: Mode,
    pub parallelism: u32,
    pub channels: ChannelConfig,
    pub report: JobReport,
    pub metrics: &'a JobMetrics,
    pub storage: Option<&'a CheckpointStorage>,
    pub savepoint: Option<String>,
    /// The job's sources: operator and uid.
    pub sources: Vec<(OperatorId, String)>,
}

impl RunReport {
    pub(super) fn new(run: Finished<'_>) -> RunReport {
        let Finished {
            topology,
            mode,
            parallelism,
            channels,
            report,
            metrics,
            storage,
            savepoint,
            sources,
        } = run;
        let storage_counter = |counter: fn(&StorageCounters) -> &AtomicU64| {
            storage.map_or(0, |s| counter(s.counters()).load(Ordering::Relaxed))
        };
        let stats = &metrics.checkpoints;
        let time = metrics.time.counters();
        let gauges: Vec<_> = metrics.channels.iter().map(|g| g.value().clone()).collect();
        RunReport {
            topology,
            records_in: report.records_in,
            records_in_by_source: sources
                .into_iter()
                .map(|(op, uid)| (uid, metrics.records_in_of(op)))
                .collect(),
            elapsed_s: report.elapsed.as_secs_f64(),
            throughput_rps: report.throughput(),
            parallelism,
            max_output_queued: gauges
                .iter()
                .map(|g| g.max_output_queued())
                .max()
                .unwrap_or(0),
            output_credits: channels.output_credits,
            max_input_buffered: gauges
                .iter()
                .map(|g| g.max_input_buffered())
                .max()
                .unwrap_or(0),
            input_credits: channels.input_credits,
            checkpoints_completed: stats.completed.load(Ordering::Relaxed),
            checkpoints_failed: stats.failed.load(Ordering::Relaxed),
            restarts: stats.restarts.load(Ordering::Relaxed),
            restart_wait_ms: stats.restart_wait_us.load(Ordering::Relaxed) as f64 / 1e3,
            checkpoint_duration_ms: Percentiles::of(&stats.durations_ms),
            alignment_ms: Percentiles::of(&stats.alignments_ms),
            checkpointed_bytes_full: stats.bytes_full.load(Ordering::Relaxed),
            bytes_uploaded_last: stats.bytes_uploaded_last.load(Ordering::Relaxed),
            bytes_uploaded_total: stats.bytes_uploaded_total.load(Ordering::Relaxed),
            files_uploaded_total: stats.files_uploaded_total.load(Ordering::Relaxed),
            bytes_uploaded_per_checkpoint: Percentiles::of(&stats.bytes_uploaded_samples),
            mode,
            persisted_inflight_bytes: LastMax {
                last: stats.inflight_last.load(Ordering::Relaxed),
                max: stats.inflight_max.load(Ordering::Relaxed),
            },
            persisted_inflight_batches_per_channel_max: stats
                .inflight_batches_per_channel_max
                .load(Ordering::Relaxed),
            checkpoints_switched_to_unaligned: stats.switched_to_unaligned.load(Ordering::Relaxed),
            restored_inflight_batches: stats.restored_inflight_batches.load(Ordering::Relaxed),
            link_bytes_sent: metrics.link_bytes_sent.load(Ordering::Relaxed),
            recovery_ms: Percentiles::of(&stats.recoveries_ms),
            restored_bytes: stats.restored_bytes_last.load(Ordering::Relaxed),
            restored_checkpoint: Some(stats.restored_checkpoint_last.load(Ordering::Relaxed))
                .filter(|&id| id > 0),
            restore_ms: stats.restore_us_last.load(Ordering::Relaxed) as f64 / 1e3,
            physical_files_live: stats.physical_files_live.load(Ordering::Relaxed),
            space_amplification: f64::from_bits(
                stats.space_amplification_last.load(Ordering::Relaxed),
            ),
            space_amplification_max: f64::from_bits(
                stats.space_amplification_max.load(Ordering::Relaxed),
            ),
            objects_created: storage_counter(|c| &c.objects_created),
            objects_deleted: storage_counter(|c| &c.objects_deleted),
            bytes_uploaded: storage_counter(|c| &c.bytes_uploaded),
            savepoints_completed: stats.savepoints.load(Ordering::Relaxed),
            savepoint_ms: stats.savepoint_us_last.load(Ordering::Relaxed) as f64 / 1e3,
            savepoint,
            windows_fired: time.windows_fired,
            late_records: time.late_records,
            timers_registered: time.timers_registered,
            timers_fired: time.timers_fired,
            timers_in_last_checkpoint: stats.timers_last.load(Ordering::Relaxed),
            timers_in_checkpoint_max: stats.timers_max.load(Ordering::Relaxed),
            watermark_lag_ms: metrics.time.watermark_lag(),
            pairs_emitted: time.join_pairs,
            rescales: metrics
                .rescales()
                .history()
                .map(RescaleFigures::of)
                .collect(),
            join_buffered_at_end: metrics.time.join_buffered(),
        }
    }
}
