//! Checkpoints, savepoints and stop-with-savepoint triggered over REST, as
//! Flink's asynchronous operations: the POST answers at once with a
//! `request-id` (Flink's `TriggerId`), and `GET .../{triggerid}` answers
//! `IN_PROGRESS` until the outcome is known. `flink savepoint` and `flink
//! stop` poll the savepoint's.

use super::{ApiError, JobView};
use crate::cluster::supervisor::{finished, Answer, Savepoint};
use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tidemark_core::model::event::CheckpointKind;
use tidemark_core::model::rng::SplitMix64;
use tidemark_storage::{check_savepoint_dir, CheckpointStorage};

/// Operations remembered: a client polls within seconds, so only the
/// newest are kept.
const KEPT: usize = 100;

/// Operations in progress at once: more are refused, so that a client in
/// a loop cannot queue checkpoint after checkpoint ahead of the periodic
/// ones.
const IN_FLIGHT: usize = 4;

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
    /// It ends the job (a stop, a savepoint that cancels): its client
    /// may first ask once the job has ended.
    ends_job: bool,
    /// A client asked how it stands: one that waits for the outcome.
    polled: bool,
    /// A client has read the outcome.
    read: bool,
}

impl Operation {
    /// Whether a client still waits for its outcome: one polled it, or it
    /// ends the job, and nobody has read the outcome yet.
    fn holds_the_server(&self) -> bool {
        (self.polled || self.ends_job) && !self.read
    }
}

/// What [`Operations::start`] found.
enum Started {
    /// A new operation under this id: trigger it.
    New(String),
    /// The client's trigger id names one already (a retry): trigger
    /// nothing, answer with the same id, as Flink does.
    Existing(String),
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
    /// (32 hex characters).
    fn start(
        &self,
        kind: Kind,
        requested: Option<String>,
        ends_job: bool,
    ) -> Result<Started, ApiError> {
        let mut inner = self.lock();
        let (ops, rng) = &mut *inner;
        let id = match requested {
            Some(id) if ops.iter().any(|o| o.id == id && o.kind == kind) => {
                return Ok(Started::Existing(id))
            }
            Some(id) => id,
            None => format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64()),
        };
        if ops.iter().filter(|o| o.outcome.is_none()).count() >= IN_FLIGHT {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{IN_FLIGHT} checkpoints or savepoints asked for are still in progress; ask again once one has completed"),
            ));
        }
        if ops.len() == KEPT {
            ops.pop_front();
        }
        ops.push_back(Operation {
            id: id.clone(),
            kind,
            outcome: None,
            ends_job,
            polled: false,
            read: false,
        });
        Ok(Started::New(id))
    }

    /// Drops operation `id`, which the job refused before it started.
    fn forget(&self, id: &str) {
        self.lock().0.retain(|o| o.id != id);
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
        op.polled = true;
        op.read |= op.outcome.is_some();
        let outcome = op.outcome.clone();
        drop(inner);
        self.changed.notify_all();
        Some(outcome)
    }

    /// Blocks until every operation a client waits for ended and a client
    /// read its outcome, or `limit` passed. Waited for: one a client
    /// polled, and one that ends the job, whose client need not have asked
    /// yet (`flink stop` polls only once its POST was answered, by when the
    /// stop may have ended the job). A checkpoint nobody asks about holds
    /// nothing up.
    pub(crate) fn wait_until_read(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut inner = self.lock();
        while inner.0.iter().any(Operation::holds_the_server) {
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

/// `scheme://name` of a storage URL (the store: a bucket, a memory
/// store); `None` for a local path, `file://` ones included.
fn store_of(url: &str) -> Option<&str> {
    if url.starts_with("file://") {
        return None;
    }
    let (scheme, rest) = url.split_once("://")?;
    let name = rest.find('/').unwrap_or(rest.len());
    Some(&url[..scheme.len() + 3 + name])
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

/// Reads a JSON body; an empty one is the defaults. The request must say
/// it is JSON: a form or plain text from another site's page, which a
/// browser sends without asking, cannot trigger anything.
fn body<T: for<'de> Deserialize<'de> + Default>(
    request: &HttpRequest,
    bytes: &[u8],
) -> Result<T, ApiError> {
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a request that acts on the job must have Content-Type: application/json",
        ));
    }
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
    /// The job's checkpointing, which every trigger needs.
    fn checkpointing(&self) -> Result<&tidemark_core::checkpoint::CheckpointConfig, ApiError> {
        self.checkpointing.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "the job runs without checkpointing: it takes neither checkpoints nor savepoints",
            )
        })
    }

    /// Where a savepoint asked for with `dir` goes: `dir`, or the job's
    /// savepoint directory; never inside the job's checkpoint directory.
    fn savepoint_target(&self, dir: Option<&str>) -> Result<Option<CheckpointStorage>, ApiError> {
        let settings = self.checkpointing()?;
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
        if let Some(store) = store_of(dir) {
            let known = [
                settings.savepoint_dir.as_deref(),
                Some(&*settings.storage_url),
            ];
            if !known
                .into_iter()
                .flatten()
                .any(|url| store_of(url) == Some(store))
            {
                return Err(forbidden(format!(
                    "over HTTP, savepoints go to local paths or to the stores of the job's checkpoint and savepoint directories, and {store} is neither"
                )));
            }
            let path = dir[store.len()..].trim_end_matches('/');
            if path
                .split('/')
                .skip(1)
                .any(|p| p.is_empty() || p == "." || p == "..")
            {
                return Err(forbidden("empty, `.` and `..` segments are refused".into()));
            }
        }
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
        ends_job: bool,
        answer: impl FnOnce() -> Result<Answer, ApiError>,
    ) -> Result<HttpResponse, ApiError> {
        if let Some(id) = &trigger_id {
            super::check_flink_id(id, "trigger id")?;
        }
        let accepted = |id: &str| HttpResponse::Accepted().json(json!({ "request-id": id }));
        let id = match self.operations.start(kind, trigger_id, ends_job)? {
            Started::Existing(id) => return Ok(accepted(&id)),
            Started::New(id) => id,
        };
        let answer = answer().inspect_err(|_| self.operations.forget(&id))?;
        let view = self.clone();
        let op = id.clone();
        actix_rt::spawn(async move {
            let outcome = finished(answer.await).map_err(|e| e.to_string());
            view.operations.finish(&op, outcome);
        });
        Ok(accepted(&id))
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
        Some(Err(cause)) => {
            // Flink's `CheckpointInfo` and `SavepointInfo` name it apart.
            let field = match kind {
                Kind::Checkpoint => "failureCause",
                Kind::Savepoint => "failure-cause",
            };
            json!({
                "status": { "id": "COMPLETED" },
                "operation": { field: {
                    "class": "org.apache.flink.runtime.checkpoint.CheckpointException",
                    "message": cause,
                    "stack-trace": cause,
                    "serialized-throwable": null,
                } },
            })
        }
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
    request: HttpRequest,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let request: CheckpointRequest = body(&request, &bytes)?;
    match request.checkpoint_type.as_deref() {
        None | Some("CONFIGURED") | Some("FULL") | Some("INCREMENTAL") => {}
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("checkpoint type {other:?} is not one of CONFIGURED, FULL, INCREMENTAL"),
            ))
        }
    }
    view.checkpointing()?;
    let view = view.into_inner();
    view.launch(Kind::Checkpoint, request.trigger_id, false, || {
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
    request: HttpRequest,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let request: SavepointRequest = body(&request, &bytes)?;
    check_format(request.format_type.as_deref())?;
    let target = view.savepoint_target(request.target_directory.as_deref())?;
    let view = view.into_inner();
    // Cancelling with a savepoint is stopping with one: the sinks commit
    // it, so that a restore from it is exactly once.
    view.launch(
        Kind::Savepoint,
        request.trigger_id,
        request.cancel_job,
        || {
            Ok(view
                .control()?
                .request(CheckpointKind::Savepoint, request.cancel_job, target))
        },
    )
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
    request: HttpRequest,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let request: StopRequest = body(&request, &bytes)?;
    check_format(request.format_type.as_deref())?;
    if request.drain {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "stopping with drain is not supported: Tidemark stops with a savepoint without advancing the watermark to the end of time",
        ));
    }
    let target = view.savepoint_target(request.target_directory.as_deref())?;
    let view = view.into_inner();
    view.launch(Kind::Savepoint, request.trigger_id, true, || {
        Ok(view
            .control()?
            .request(CheckpointKind::Savepoint, true, target))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(ops: &Operations) -> bool {
        ops.lock().0.iter().any(Operation::holds_the_server)
    }

    fn id(started: Started) -> String {
        match started {
            Started::New(id) | Started::Existing(id) => id,
        }
    }

    fn savepoint() -> Result<Savepoint, String> {
        Ok(Savepoint {
            id: tidemark_core::model::ids::CheckpointId(1),
            location: "sp".into(),
        })
    }

    #[test]
    fn a_checkpoint_nobody_asks_about_holds_nothing_up() {
        let ops = Operations::default();
        let checkpoint = id(ops.start(Kind::Checkpoint, None, false).unwrap());
        assert!(!holding(&ops));
        ops.finish(&checkpoint, savepoint());
        assert!(!holding(&ops));
    }

    #[test]
    fn a_polled_operation_holds_the_server_until_its_outcome_is_read() {
        let ops = Operations::default();
        let polled = id(ops.start(Kind::Savepoint, None, false).unwrap());
        assert_eq!(ops.read(&polled, Kind::Savepoint), Some(None));
        assert!(holding(&ops), "polled while in progress");
        ops.finish(&polled, savepoint());
        assert!(holding(&ops), "finished, not yet read");
        assert!(matches!(
            ops.read(&polled, Kind::Savepoint),
            Some(Some(Ok(_)))
        ));
        assert!(!holding(&ops));
    }

    #[test]
    fn a_stop_holds_the_server_before_anyone_asked() {
        let ops = Operations::default();
        let stop = id(ops.start(Kind::Savepoint, None, true).unwrap());
        assert!(holding(&ops), "in progress");
        ops.finish(&stop, savepoint());
        assert!(holding(&ops), "ended the job, nobody asked yet");
        assert!(ops.read(&stop, Kind::Savepoint).is_some());
        assert!(!holding(&ops));
    }
}
