//! `/jobs/{jobid}/checkpoints` and below: the checkpoint statistics in
//! Flink's JSON shape and field names.

use super::{ApiError, JobView};
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde_json::{json, Value};
use tidemark_core::checkpoint::stats::{
    self, CheckpointStats, CheckpointStatus, OperatorStats, StatsSummary, SubtaskStats, Totals,
};
use tidemark_core::model::event::Alignment;
use tidemark_core::model::ids::CheckpointId;

pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/jobs/{jobid}/checkpoints", web::get().to(overview))
        .route("/jobs/{jobid}/checkpoints/config", web::get().to(settings))
        .route(
            "/jobs/{jobid}/checkpoints/details/{checkpointid}",
            web::get().to(details),
        )
        .route(
            "/jobs/{jobid}/checkpoints/details/{checkpointid}/subtasks/{vertexid}",
            web::get().to(subtasks),
        );
}

fn status_name(status: CheckpointStatus) -> (&'static str, &'static str) {
    match status {
        CheckpointStatus::InProgress => ("IN_PROGRESS", "in_progress"),
        CheckpointStatus::Completed => ("COMPLETED", "completed"),
        CheckpointStatus::Failed => ("FAILED", "failed"),
    }
}

pub(super) fn summary(s: &StatsSummary) -> Value {
    json!({
        "min": s.min, "max": s.max, "avg": s.avg.round() as u64,
        "p50": s.p50, "p90": s.p90, "p95": s.p95, "p99": s.p99, "p999": s.p999,
    })
}

/// The fields Flink's checkpoint, task and subtask summaries share.
fn sizes(totals: &Totals) -> Value {
    json!({
        "state_size": totals.state_size,
        "checkpointed_size": totals.checkpointed_size,
        "processed_data": totals.processed_data,
        "persisted_data": totals.persisted_data,
        // Flink's name for the bytes processed while aligning.
        "alignment_buffered": totals.processed_data,
    })
}

fn merge(mut into: Value, from: Value) -> Value {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
    into
}

/// One history entry (Flink's `CheckpointStatistics`).
fn entry(c: &CheckpointStats, view: &JobView) -> Value {
    let (status, class) = status_name(c.status);
    let tasks: serde_json::Map<String, Value> = c
        .operators
        .iter()
        .filter_map(|o| {
            let vertex = view.vertices.iter().find(|v| v.operator == o.operator)?;
            Some((vertex.id.clone(), task(o, c)))
        })
        .collect();
    let mut body = merge(
        json!({
            "className": class,
            "id": c.id.0,
            "status": status,
            "is_savepoint": c.kind.is_savepoint(),
            "savepointFormat": c.kind.is_savepoint().then_some("CANONICAL"),
            "checkpoint_type": c.kind.flink_name(),
            "trigger_timestamp": c.trigger_timestamp,
            "latest_ack_timestamp": c.latest_ack().map_or(-1, |t| t as i64),
            "end_to_end_duration": c.end_to_end_duration(),
            "num_subtasks": c.num_subtasks(),
            "num_acknowledged_subtasks": c.num_acknowledged(),
            "external_path": c.external_path.as_deref().map(super::operations::flink_location),
            "discarded": false,
            "tasks": tasks,
        }),
        sizes(&c.totals()),
    );
    if c.status == CheckpointStatus::Failed {
        body["failure_timestamp"] = json!(c.end_timestamp);
        body["failure_message"] = json!(c.failure);
    }
    body
}

/// One operator of one checkpoint (Flink's `TaskCheckpointStatistics`:
/// its `id` and `status` are the checkpoint's).
fn task(o: &OperatorStats, c: &CheckpointStats) -> Value {
    merge(
        json!({
            "id": c.id.0,
            "status": status_name(c.status).0,
            "latest_ack_timestamp": o.latest_ack().map_or(-1, |t| t as i64),
            "end_to_end_duration": o.latest_ack().map_or(0, |t| t.saturating_sub(c.trigger_timestamp)),
            "num_subtasks": o.subtasks.len(),
            "num_acknowledged_subtasks": o.acknowledged(),
        }),
        sizes(&o.totals()),
    )
}

fn millis(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

/// One subtask of one checkpoint (Flink's `SubtaskCheckpointStatistics`).
fn subtask(index: usize, s: Option<&SubtaskStats>, trigger: u64) -> Value {
    let Some(s) = s else {
        return json!({ "index": index, "status": "pending_or_failed" });
    };
    let m = &s.metrics;
    json!({
        "index": index,
        "status": "completed",
        "ack_timestamp": s.ack_timestamp,
        "end_to_end_duration": s.ack_timestamp.saturating_sub(trigger),
        "state_size": s.state_size,
        "checkpointed_size": s.checkpointed_size,
        "checkpoint": { "sync": millis(m.sync), "async": millis(m.async_) },
        "alignment": {
            "buffered": m.bytes_during_alignment,
            "processed": m.bytes_during_alignment,
            "persisted": m.persisted_inflight_bytes,
            "duration": millis(m.alignment),
        },
        "start_delay": millis(m.start_delay),
        "unaligned_checkpoint": m.unaligned,
        "aborted": false,
    })
}

fn checkpoint_id(raw: &str) -> Result<CheckpointId, ApiError> {
    raw.parse().map(CheckpointId).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{raw:?} is not a checkpoint id: a checkpoint id is a number"),
        )
    })
}

/// A copy of checkpoint `id`'s statistics.
fn kept(view: &JobView, id: CheckpointId) -> Result<CheckpointStats, ApiError> {
    let found = stats::lock(&view.metrics.checkpoint_stats).get(id).cloned();
    found.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "checkpoint {} is not in the history (it never existed or is too old)",
                id.0
            ),
        )
    })
}

async fn overview(
    view: web::Data<JobView>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    // Rendered from a copy: the coordinator records into the tracker on
    // every acknowledgement and must not wait for a client.
    let stats = stats::lock(&view.metrics.checkpoint_stats).clone();
    let counts = stats.counts();
    let s = stats.summary();
    let restored = stats.latest_restored().map(|r| {
        json!({
            "id": r.id.0,
            "restore_timestamp": r.timestamp,
            "is_savepoint": r.is_savepoint,
            "external_path": r.external_path.as_deref().map(super::operations::flink_location),
        })
    });
    let body = json!({
        "counts": {
            "restored": counts.restored,
            "total": counts.total,
            "in_progress": counts.in_progress,
            "completed": counts.completed,
            "failed": counts.failed,
        },
        "summary": {
            "state_size": summary(&s.state_size),
            "end_to_end_duration": summary(&s.end_to_end_duration),
            "checkpointed_size": summary(&s.checkpointed_size),
            "processed_data": summary(&s.processed_data),
            "persisted_data": summary(&s.persisted_data),
            "alignment_buffered": summary(&s.processed_data),
        },
        "latest": {
            "completed": stats.latest_completed().map(|c| entry(c, &view)),
            "savepoint": stats.latest_savepoint().map(|c| entry(c, &view)),
            "failed": stats.latest_failed().map(|c| entry(c, &view)),
            "restored": restored,
        },
        "history": stats.history().map(|c| entry(c, &view)).collect::<Vec<_>>(),
    });
    Ok(HttpResponse::Ok().json(body))
}

async fn settings(
    view: web::Data<JobView>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let Some(settings) = &view.checkpointing else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "checkpointing is not enabled for this job",
        ));
    };
    let policy = &settings.policy;
    let aligned_timeout = match settings.alignment {
        Alignment::AlignedWithTimeout(t) => millis(t),
        _ => 0,
    };
    Ok(HttpResponse::Ok().json(json!({
        "mode": "exactly_once",
        "interval": policy.interval.map_or(i64::MAX, |i| millis(i) as i64),
        "timeout": millis(policy.timeout),
        "min_pause": millis(policy.min_pause),
        "max_concurrent": policy.max_concurrent,
        "externalization": { "enabled": true, "delete_on_cancellation": false },
        "state_backend": view.state_backend,
        "checkpoint_storage": settings.storage_url,
        "savepoint_directory": settings.savepoint_dir,
        "unaligned_checkpoints": !matches!(settings.alignment, Alignment::Aligned),
        "tolerable_failed_checkpoints": policy.tolerable_failures,
        "aligned_checkpoint_timeout": aligned_timeout,
        "checkpoints_after_tasks_finish": true,
        "state_changelog_enabled": false,
        "changelog_periodic_materialization_interval": -1,
        "changelog_storage": "memory",
        "retained_checkpoints": policy.retain,
        "incremental": settings.incremental,
        "history": settings.history,
    })))
}

async fn details(
    view: web::Data<JobView>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (jid, checkpoint) = path.into_inner();
    view.check_job(&jid)?;
    let id = checkpoint_id(&checkpoint)?;
    Ok(HttpResponse::Ok().json(entry(&kept(&view, id)?, &view)))
}

async fn subtasks(
    view: web::Data<JobView>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (jid, checkpoint, vertex) = path.into_inner();
    view.check_job(&jid)?;
    let id = checkpoint_id(&checkpoint)?;
    let vertex = view.vertex(&vertex)?;
    let c = &kept(&view, id)?;
    let o = c.operator(vertex.operator).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("vertex {} took no part in checkpoint {}", vertex.id, id.0),
        )
    })?;
    let acked: Vec<&SubtaskStats> = o.subtasks.iter().flatten().collect();
    let of = |f: fn(&SubtaskStats) -> u64| {
        summary(&StatsSummary::of(acked.iter().map(|s| f(s)).collect()))
    };
    let mut body = task(o, c);
    body["summary"] = json!({
        "state_size": of(|s| s.state_size),
        "checkpointed_size": of(|s| s.checkpointed_size),
        "end_to_end_duration": summary(&StatsSummary::of(
            acked.iter().map(|s| s.ack_timestamp.saturating_sub(c.trigger_timestamp)).collect(),
        )),
        "checkpoint_duration": {
            "sync": of(|s| millis(s.metrics.sync)),
            "async": of(|s| millis(s.metrics.async_)),
        },
        "alignment": {
            "buffered": of(|s| s.metrics.bytes_during_alignment),
            "processed": of(|s| s.metrics.bytes_during_alignment),
            "persisted": of(|s| s.metrics.persisted_inflight_bytes),
            "duration": of(|s| millis(s.metrics.alignment)),
        },
        "start_delay": of(|s| millis(s.metrics.start_delay)),
    });
    body["subtasks"] = json!(o
        .subtasks
        .iter()
        .enumerate()
        .map(|(i, s)| subtask(i, s.as_ref(), c.trigger_timestamp))
        .collect::<Vec<_>>());
    Ok(HttpResponse::Ok().json(body))
}
