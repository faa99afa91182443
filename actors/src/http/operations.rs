//! Checkpoints, savepoints and stop-with-savepoint triggered over REST, as
//! Flink's asynchronous operations: the POST answers at once with a
//! `request-id` (Flink's `TriggerId`), and `GET .../{triggerid}` answers
//! `IN_PROGRESS` until the outcome is known. `flink savepoint` and `flink
//! stop` poll the savepoint's.

use super::{ApiError, JobView};
use crate::runtime::{finished, Savepoint};
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tidemark::event::CheckpointKind;
use tidemark::rng::SplitMix64;
use tidemark::storage::{check_savepoint_dir, CheckpointStorage};

/// Operations remembered: a client polls within seconds, so only the
/// newest are kept.
const KEPT: usize = 100;

pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route(
            "/jobs/{jobid}/checkpoints",
            web::post().to(trigger_checkpoint),
        )
        .route(
            "/jobs/{jobid}/checkpoints/{triggerid}",
            web::get().to(checkpoint_status),
        )
        .route(
            "/jobs/{jobid}/savepoints",
            web::post().to(trigger_savepoint),
        )
        .route(
            "/jobs/{jobid}/savepoints/{triggerid}",
            web::get().to(savepoint_status),
        )
        .route("/jobs/{jobid}/stop", web::post().to(stop));
}

/// A checkpoint's or savepoint's trigger id names only operations of its
/// own kind, as in Flink.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Checkpoint,
    Savepoint,
}

struct Operation {
    id: String,
    kind: Kind,
    outcome: Option<Result<Savepoint, String>>,
    /// A client has read the outcome.
    read: bool,
}

/// The operations triggered over REST, newest last.
pub(crate) struct Operations {
    inner: Mutex<(VecDeque<Operation>, SplitMix64)>,
    changed: Condvar,
}

impl Default for Operations {
    fn default() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Operations {
            inner: Mutex::new((VecDeque::new(), SplitMix64::new(seed))),
            changed: Condvar::new(),
        }
    }
}

impl Operations {
    fn lock(&self) -> std::sync::MutexGuard<'_, (VecDeque<Operation>, SplitMix64)> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers an operation under the client's trigger id, or a new one
    /// (32 hex characters); `None` if the client's id is taken.
    fn start(&self, kind: Kind, requested: Option<String>) -> Option<String> {
        let mut inner = self.lock();
        let (ops, rng) = &mut *inner;
        let id = match requested {
            Some(id) if ops.iter().any(|o| o.id == id) => return None,
            Some(id) => id,
            None => format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64()),
        };
        if ops.len() == KEPT {
            ops.pop_front();
        }
        ops.push_back(Operation {
            id: id.clone(),
            kind,
            outcome: None,
            read: false,
        });
        Some(id)
    }

    fn finish(&self, id: &str, outcome: Result<Savepoint, String>) {
        if let Some(op) = self.lock().0.iter_mut().find(|o| o.id == id) {
            op.outcome = Some(outcome);
        }
        self.changed.notify_all();
    }

    /// The outcome of operation `id` of `kind`: `None` if unknown,
    /// `Some(None)` while in progress.
    fn read(&self, id: &str, kind: Kind) -> Option<Option<Result<Savepoint, String>>> {
        let mut inner = self.lock();
        let op = inner.0.iter_mut().find(|o| o.id == id && o.kind == kind)?;
        op.read |= op.outcome.is_some();
        let outcome = op.outcome.clone();
        drop(inner);
        self.changed.notify_all();
        Some(outcome)
    }

    /// Blocks until every operation ended and a client read its outcome,
    /// or `limit` passed.
    pub(crate) fn wait_until_read(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut inner = self.lock();
        while inner.0.iter().any(|o| !o.read) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            inner = self
                .changed
                .wait_timeout(inner, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// A location as Flink writes it: local paths as `file://` URLs, which
/// `--restore` takes as well.
pub(super) fn flink_location(location: &str) -> String {
    if location.starts_with('/') {
        format!("file://{location}")
    } else {
        location.to_owned()
    }
}

/// Reads a JSON body; an empty one is the defaults.
fn body<T: for<'de> Deserialize<'de> + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not what this endpoint takes: {e}"),
        )
    })
}

/// Savepoints are written in Tidemark's one, self-contained format.
fn check_format(format: Option<&str>) -> Result<(), ApiError> {
    match format {
        None | Some("CANONICAL") => Ok(()),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("savepoint format {other:?} is not supported: Tidemark writes CANONICAL (self-contained) savepoints only"),
        )),
    }
}

impl JobView {
    /// Where a savepoint asked for with `dir` goes: `dir`, or the job's
    /// savepoint directory; never inside the job's checkpoint directory.
    fn savepoint_target(&self, dir: Option<&str>) -> Result<Option<CheckpointStorage>, ApiError> {
        let settings = self.checkpointing.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "the job runs without checkpointing: it cannot take savepoints",
            )
        })?;
        let Some(dir) = dir else {
            return match settings.savepoint_dir {
                Some(_) => Ok(None),
                None => Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "no target directory was given and the job has no savepoint directory (--savepoint-dir)",
                )),
            };
        };
        // Flink's `file:/path` form; `file:///path` is read as it is.
        let dir = match dir.strip_prefix("file:") {
            Some(path) if !path.starts_with("//") => path,
            _ => dir,
        };
        let forbidden = |problem: String| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("cannot write a savepoint to {dir:?}: {problem}"),
            )
        };
        let mut asked = settings.clone();
        asked.savepoint_dir = Some(dir.to_owned());
        check_savepoint_dir(&asked, self.job).map_err(|e| forbidden(e.to_string()))?;
        CheckpointStorage::open_directory(dir, true)
            .map(Some)
            .map_err(|e| forbidden(e.to_string()))
    }

    /// Starts an operation, and finishes it when the job answers.
    fn launch(
        self: &std::sync::Arc<Self>,
        kind: Kind,
        trigger_id: Option<String>,
        answer: impl FnOnce() -> Result<crate::runtime::Answer, ApiError>,
    ) -> Result<HttpResponse, ApiError> {
        if let Some(id) = &trigger_id {
            if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "{id:?} is not a trigger id: a trigger id is 32 hexadecimal characters"
                    ),
                ));
            }
        }
        let answer = answer()?;
        let id = self.operations.start(kind, trigger_id).ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "an operation with this triggerId exists already",
            )
        })?;
        let view = self.clone();
        let op = id.clone();
        actix_rt::spawn(async move {
            let outcome = finished(answer.await).map_err(|e| e.to_string());
            view.operations.finish(&op, outcome);
        });
        Ok(HttpResponse::Accepted().json(json!({ "request-id": id })))
    }
}

/// Flink's answer on an asynchronous operation: `IN_PROGRESS`, or
/// `COMPLETED` with what `done` makes of the result, or the failure's cause.
fn status(
    view: &JobView,
    (jid, trigger): (String, String),
    kind: Kind,
    done: impl FnOnce(Savepoint) -> Value,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&jid)?;
    let outcome = view.operations.read(&trigger, kind).ok_or_else(|| {
        let what = match kind {
            Kind::Checkpoint => "checkpoint",
            Kind::Savepoint => "savepoint",
        };
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("there is no {what} operation with triggerId {trigger}"),
        )
    })?;
    let body = match outcome {
        None => json!({ "status": { "id": "IN_PROGRESS" }, "operation": null }),
        Some(Ok(savepoint)) => {
            json!({ "status": { "id": "COMPLETED" }, "operation": done(savepoint) })
        }
        Some(Err(cause)) => json!({
            "status": { "id": "COMPLETED" },
            "operation": { "failure-cause": {
                "class": "org.apache.flink.runtime.checkpoint.CheckpointException",
                "stack-trace": cause,
                "serialized-throwable": null,
            } },
        }),
    };
    Ok(HttpResponse::Ok().json(body))
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointRequest {
    checkpoint_type: Option<String>,
    trigger_id: Option<String>,
}

async fn trigger_checkpoint(
    view: web::Data<JobView>,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let request: CheckpointRequest = body(&bytes)?;
    match request.checkpoint_type.as_deref() {
        None | Some("CONFIGURED") | Some("FULL") | Some("INCREMENTAL") => {}
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("checkpoint type {other:?} is not one of CONFIGURED, FULL, INCREMENTAL"),
            ))
        }
    }
    if view.checkpointing.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "the job runs without checkpointing",
        ));
    }
    let view = view.into_inner();
    view.launch(Kind::Checkpoint, request.trigger_id, || {
        Ok(view
            .control()?
            .request(CheckpointKind::Checkpoint, false, None))
    })
}

async fn checkpoint_status(
    view: web::Data<JobView>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    status(
        &view,
        path.into_inner(),
        Kind::Checkpoint,
        |c| json!({ "checkpointId": c.id.0 }),
    )
}

#[derive(Default, Deserialize)]
struct SavepointRequest {
    #[serde(rename = "target-directory")]
    target_directory: Option<String>,
    #[serde(rename = "cancel-job", default)]
    cancel_job: bool,
    #[serde(rename = "formatType")]
    format_type: Option<String>,
    #[serde(rename = "triggerId")]
    trigger_id: Option<String>,
}

async fn trigger_savepoint(
    view: web::Data<JobView>,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let request: SavepointRequest = body(&bytes)?;
    check_format(request.format_type.as_deref())?;
    let target = view.savepoint_target(request.target_directory.as_deref())?;
    let view = view.into_inner();
    // Cancelling with a savepoint is stopping with one: the sinks commit
    // it, so that a restore from it is exactly once.
    view.launch(Kind::Savepoint, request.trigger_id, || {
        Ok(view
            .control()?
            .request(CheckpointKind::Savepoint, request.cancel_job, target))
    })
}

async fn savepoint_status(
    view: web::Data<JobView>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    status(
        &view,
        path.into_inner(),
        Kind::Savepoint,
        |s| json!({ "location": flink_location(&s.location) }),
    )
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StopRequest {
    target_directory: Option<String>,
    #[serde(default)]
    drain: bool,
    format_type: Option<String>,
    trigger_id: Option<String>,
}

async fn stop(
    view: web::Data<JobView>,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let request: StopRequest = body(&bytes)?;
    check_format(request.format_type.as_deref())?;
    if request.drain {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "stopping with drain is not supported: Tidemark stops with a savepoint without advancing the watermark to the end of time",
        ));
    }
    let target = view.savepoint_target(request.target_directory.as_deref())?;
    let view = view.into_inner();
    view.launch(Kind::Savepoint, request.trigger_id, || {
        Ok(view
            .control()?
            .request(CheckpointKind::Savepoint, true, target))
    })
}
