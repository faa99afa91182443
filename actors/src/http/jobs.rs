//! `/jobs`, `/jobs/overview`, `/jobs/{jobid}` and cancelling with
//! `PATCH /jobs/{jobid}`: what `flink list` and `flink cancel` use; each
//! vertex's watermarks, and the history of the job's counters the page
//! charts.

use super::{ApiError, JobStatus, JobView, Vertex};
use crate::metrics::History;
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/jobs", web::get().to(jobs))
        .route("/jobs/overview", web::get().to(overview))
        .route("/jobs/{jobid}", web::get().to(job))
        .route("/jobs/{jobid}", web::patch().to(cancel))
        .route("/jobs/{jobid}/history", web::get().to(history))
        .route(
            "/jobs/{jobid}/vertices/{vertexid}/watermarks",
            web::get().to(watermarks),
        );
}

/// Samples the job's counters into its history from when the server
/// starts until the job ended, so that a page opened at any moment charts
/// the run so far.
pub(super) async fn sample_history(view: Arc<JobView>) {
    let mut ticks = actix_rt::time::interval(History::EVERY);
    loop {
        ticks.tick().await;
        let running = view.status().0 == JobStatus::Running;
        view.metrics.sample_history(crate::clock::now().unix_ms);
        if !running {
            return;
        }
    }
}

/// Flink's task counts by execution state; every state must be present
/// for Flink's client to read them.
fn task_counts(status: JobStatus, tasks: u32) -> Value {
    let count = |s: JobStatus| if status == s { tasks } else { 0 };
    json!({
        "total": tasks,
        "created": 0,
        "scheduled": 0,
        "deploying": 0,
        "running": count(JobStatus::Running),
        "finished": count(JobStatus::Finished),
        "canceling": 0,
        "canceled": count(JobStatus::Canceled),
        "failed": count(JobStatus::Failed),
        "reconciling": 0,
        "initializing": 0,
    })
}

/// The same counts keyed as Flink's `Map<ExecutionState, Integer>` (a
/// vertex's `tasks`, a job's `status-counts`): upper case, no total.
fn by_execution_state(counts: Value) -> Value {
    let Value::Object(counts) = counts else {
        return counts;
    };
    counts
        .into_iter()
        .filter(|(state, _)| state != "total")
        .map(|(state, n)| (state.to_uppercase(), n))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

impl JobView {
    fn tasks(&self) -> u32 {
        self.vertices.iter().map(|v| self.parallelism(v)).sum()
    }

    /// Start, end (-1 while running) and duration, Unix milliseconds.
    fn times(&self) -> (u64, i64, u64) {
        let (_, end) = self.status();
        let now = crate::clock::now().unix_ms;
        let until = end.unwrap_or(now);
        (
            self.start_ms,
            end.map_or(-1, |e| e as i64),
            until.saturating_sub(self.start_ms),
        )
    }

    fn overview(&self) -> Value {
        let (status, _) = self.status();
        let (start, end, duration) = self.times();
        json!({
            "jid": self.jid,
            "name": self.name,
            "state": status.flink_name(),
            "start-time": start,
            "end-time": end,
            "duration": duration,
            "last-modification": if end >= 0 { end as u64 } else { start },
            "tasks": task_counts(status, self.tasks()),
            "pending-operators": 0,
        })
    }

    /// Records in and out, and time blocked on credit, of `vertex`.
    fn vertex_metrics(&self, vertex: &Vertex) -> Value {
        let (mut records_in, mut records_out, mut backpressured) = (0, 0, Duration::ZERO);
        for (id, counters) in self.metrics.subtasks() {
            if id.operator == vertex.operator {
                records_in += counters.records_in();
                records_out += counters.records_out();
                backpressured += counters.backpressured();
            }
        }
        json!({
            "read-bytes": 0,
            "read-bytes-complete": true,
            "write-bytes": 0,
            "write-bytes-complete": true,
            "read-records": records_in,
            "read-records-complete": true,
            "write-records": records_out,
            "write-records-complete": true,
            "accumulated-backpressured-time": backpressured.as_millis() as u64,
        })
    }
}

async fn jobs(view: web::Data<JobView>) -> HttpResponse {
    let (status, _) = view.status();
    HttpResponse::Ok().json(json!({
        "jobs": [{ "id": view.jid, "status": status.flink_name() }]
    }))
}

async fn overview(view: web::Data<JobView>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "jobs": [view.overview()] }))
}

async fn job(view: web::Data<JobView>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let (status, _) = view.status();
    let (start, end, duration) = view.times();
    let vertices: Vec<Value> = view
        .vertices
        .iter()
        .map(|v| {
            json!({
                "id": v.id,
                "name": v.name,
                "maxParallelism": v.max_parallelism,
                "parallelism": view.parallelism(v),
                "status": status.flink_name(),
                "start-time": start,
                "end-time": end,
                "duration": duration,
                "tasks": by_execution_state(task_counts(status, view.parallelism(v))),
                "metrics": view.vertex_metrics(v),
                "source": v.is_source,
            })
        })
        .collect();
    let mut body = view.overview();
    body["isStoppable"] = json!(false);
    body["status-counts"] = by_execution_state(task_counts(status, view.tasks()));
    let reached = |s: JobStatus| match (s, end) {
        (JobStatus::Running, _) => start as i64,
        (s, end) if s == status => end,
        _ => 0,
    };
    body["timestamps"] = json!({
        "INITIALIZING": start, "CREATED": start,
        "RUNNING": reached(JobStatus::Running),
        "FINISHED": reached(JobStatus::Finished),
        "FAILED": reached(JobStatus::Failed),
        "CANCELED": reached(JobStatus::Canceled),
        "FAILING": 0, "CANCELLING": 0, "RESTARTING": 0, "SUSPENDED": 0, "RECONCILING": 0,
    });
    body["plan"] = json!({
        "jid": view.jid,
        "name": view.name,
        "type": "STREAMING",
        "nodes": view.vertices.iter().map(|v| json!({
            "id": v.id,
            "parallelism": view.parallelism(v),
            "operator": "",
            "operator_strategy": "",
            "description": v.name,
            "optimizer_properties": {},
        })).collect::<Vec<_>>(),
    });
    body["now"] = json!(crate::clock::now().unix_ms);
    body["vertices"] = json!(vertices);
    body["restarts"] = json!(view
        .metrics
        .checkpoints
        .restarts
        .load(std::sync::atomic::Ordering::Relaxed));
    Ok(HttpResponse::Ok().json(body))
}

/// Each vertex's records out and backpressured time (Flink's names) at
/// every sample of the history, oldest first: the vertices once, then per
/// sample one array per figure, in the vertices' order.
async fn history(
    view: web::Data<JobView>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let samples: Vec<Value> = view
        .metrics
        .history()
        .iter()
        .map(|sample| {
            let totals = view.vertices.iter().map(|v| {
                let totals = sample.operators.get(&v.operator);
                totals.copied().unwrap_or_default()
            });
            let (out, backpressured): (Vec<u64>, Vec<u64>) =
                totals.map(|t| (t.records_out, t.backpressured_ms)).unzip();
            json!({
                "time": sample.unix_ms,
                "write-records": out,
                "accumulated-backpressured-time": backpressured,
            })
        })
        .collect();
    let vertices: Vec<&str> = view.vertices.iter().map(|v| v.id.as_str()).collect();
    Ok(HttpResponse::Ok().json(json!({ "vertices": vertices, "samples": samples })))
}

/// Flink's `JobVertexWatermarksHandler`: each subtask's
/// `currentInputWatermark` in ms, as a string, `Long.MIN_VALUE` before the
/// first. A source has none, as in Flink: it has no input.
async fn watermarks(
    view: web::Data<JobView>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (jid, vid) = path.into_inner();
    view.check_job(&jid)?;
    let vertex = view.vertex(&vid)?;
    if vertex.is_source {
        return Ok(HttpResponse::Ok().json(json!([])));
    }
    let reached: HashMap<u32, i64> = view
        .metrics
        .subtasks()
        .into_iter()
        .filter(|(id, _)| id.operator == vertex.operator)
        .map(|(id, counters)| (id.index.0, counters.input_watermark()))
        .collect();
    let metrics: Vec<Value> = (0..view.parallelism(vertex))
        .map(|index| {
            let watermark = reached.get(&index).copied().unwrap_or(i64::MIN);
            json!({
                "id": format!("{index}.currentInputWatermark"),
                "value": watermark.to_string(),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(metrics))
}

#[derive(Deserialize)]
struct CancelQuery {
    mode: Option<String>,
}

/// `flink cancel` sends `PATCH /jobs/{jobid}?mode=cancel`.
async fn cancel(
    view: web::Data<JobView>,
    path: web::Path<String>,
    query: web::Query<CancelQuery>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    match query.mode.as_deref() {
        None | Some("cancel") => {}
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("unknown termination mode {other:?}: only mode=cancel is supported"),
            ))
        }
    }
    view.control()?.cancel();
    Ok(HttpResponse::Accepted().json(json!({})))
}
