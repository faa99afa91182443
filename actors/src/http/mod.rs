//! The REST API of a running job, on actix-web, in the shape of Flink's
//! (paths, field names, `/v1/` prefix, 32-hex job ids), so that the
//! `flink` command and scripts written against Flink work unchanged;
//! Prometheus metrics at `/metrics` and a page at `/`.
//!
//! The server runs on a thread and actix system of its own, so that a slow
//! client never holds up the job's arbiters; handlers read the job's shared
//! figures and send the supervisor the same messages the job handle does.

mod auth;
mod checkpoints;
mod jobs;
mod operations;
mod page;
mod prometheus;
mod rescales;

use crate::cluster::supervisor::JobControl;
use crate::metrics::JobMetrics;
use crate::tls::RestTls;
use actix_web::dev::ServerHandle;
use actix_web::http::{header, StatusCode};
use actix_web::{web, App, HttpResponse, ResponseError};
use serde_json::json;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use tidemark_core::checkpoint::CheckpointConfig;
use tidemark_core::job::Job;
use tidemark_core::model::ids::{JobId, OperatorId};
use tidemark_core::model::key_group::key_hash;

pub use crate::job::HttpTokenError;
pub use auth::check_exposure;
pub use auth::HttpToken;
pub(crate) use operations::Operations;

/// How long a finished job's server stays up for clients that triggered
/// an operation (a stop with a savepoint) and have not read its outcome.
const LINGER: Duration = Duration::from_secs(10);

/// A job as Flink names it: 32 lowercase hex characters (Flink's `JobID`),
/// from the job's id, so that every run of a job has the same one.
pub fn flink_job_id(job: JobId) -> String {
    format!("{:016x}{:016x}", job.0, key_hash(&job.0))
}

/// Where a job ended up, in Flink's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobStatus {
    Running,
    Finished,
    Failed,
    Canceled,
}

impl JobStatus {
    fn flink_name(self) -> &'static str {
        match self {
            JobStatus::Running => "RUNNING",
            JobStatus::Finished => "FINISHED",
            JobStatus::Failed => "FAILED",
            JobStatus::Canceled => "CANCELED",
        }
    }
}

/// One vertex of the job graph (an operator chain).
struct Vertex {
    /// 32 hex characters, from the operator's uid.
    id: String,
    operator: OperatorId,
    name: String,
    /// At the start: a rescale changes it.
    initial_parallelism: u32,
    max_parallelism: u32,
    is_source: bool,
}

/// What the handlers read and act on: the job's identity and graph, its
/// live figures, its control once deployed, and how it ended.
pub(crate) struct JobView {
    jid: String,
    job: JobId,
    name: String,
    start_ms: u64,
    vertices: Vec<Vertex>,
    metrics: Arc<JobMetrics>,
    control: OnceLock<JobControl>,
    checkpointing: Option<CheckpointConfig>,
    state_backend: &'static str,
    ended: Mutex<Option<(JobStatus, u64)>>,
    operations: Operations,
    server: Mutex<Option<Server>>,
}

impl JobView {
    pub(crate) fn new(job: &Job, id: JobId, metrics: Arc<JobMetrics>) -> Self {
        let graph = &job.graph;
        JobView {
            jid: flink_job_id(id),
            job: id,
            name: job.name.clone(),
            start_ms: crate::clock::now().unix_ms,
            vertices: graph
                .operators
                .iter()
                .map(|o| Vertex {
                    id: format!("{:016x}{:016x}", key_hash(&o.uid), u64::from(o.id.0)),
                    operator: o.id,
                    name: o.name.clone(),
                    initial_parallelism: o.parallelism,
                    max_parallelism: o.max_parallelism,
                    is_source: graph.is_source(o.id),
                })
                .collect(),
            metrics,
            control: OnceLock::new(),
            checkpointing: job.config.checkpointing.clone(),
            state_backend: match job.config.state_backend {
                tidemark_core::StateBackend::Heap => "HashMapStateBackend",
                _ => "EmbeddedRocksDBStateBackend",
            },
            ended: Mutex::new(None),
            operations: Operations::default(),
            server: Mutex::new(None),
        }
    }

    /// The job is deployed: requests that act on it can be served.
    pub(crate) fn deployed(&self, control: JobControl) {
        let _ = self.control.set(control);
    }

    /// The job ended with `status`; the server goes on answering with it
    /// until [`JobView::shutdown`].
    pub(crate) fn ended(&self, status: JobStatus) {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        ended.get_or_insert((status, crate::clock::now().unix_ms));
    }

    /// Waits (at most [`LINGER`]) until every operation a client triggered
    /// has been answered and its outcome read, then stops the server.
    pub(crate) fn shutdown(&self) {
        self.operations.wait_until_read(LINGER);
        self.stop_server();
    }

    /// Stops the server, if it still runs.
    pub(crate) fn stop_server(&self) {
        let server = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(server) = server {
            server.stop();
        }
    }

    fn status(&self) -> (JobStatus, Option<u64>) {
        match *self.ended.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((status, at)) => (status, Some(at)),
            None => (JobStatus::Running, None),
        }
    }

    /// The job's control, or why the request cannot act on the job.
    fn control(&self) -> Result<&JobControl, ApiError> {
        match (self.status().0, self.control.get()) {
            (JobStatus::Running, Some(control)) => Ok(control),
            (JobStatus::Running, None) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the job is still being deployed",
            )),
            (status, _) => Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("the job has ended ({})", status.flink_name()),
            )),
        }
    }

    /// The parallelism `vertex` runs at, after the rescales so far.
    fn parallelism(&self, vertex: &Vertex) -> u32 {
        let rescales = self.metrics.rescales();
        let deployed = rescales
            .deployed()
            .operators
            .get(vertex.operator.0 as usize);
        deployed.map_or(vertex.initial_parallelism, |o| o.parallelism)
    }

    fn vertex(&self, id: &str) -> Result<&Vertex, ApiError> {
        self.vertices.iter().find(|v| v.id == id).ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, format!("the job has no vertex {id}"))
        })
    }

    /// The job named in a request's path: 32 hex characters, this job's.
    fn check_job(&self, jid: &str) -> Result<(), ApiError> {
        check_flink_id(jid, "job id")?;
        if !jid.eq_ignore_ascii_case(&self.jid) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("Job {jid} not found"),
            ));
        }
        Ok(())
    }
}

/// Refuses `id` unless it reads as one of Flink's 16-byte ids (`JobID`,
/// `TriggerId`): 32 hex characters.
fn check_flink_id(id: &str, what: &str) -> Result<(), ApiError> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        format!("{id:?} is not a {what}: a {what} is 32 hexadecimal characters"),
    ))
}

/// A failed request, answered as Flink does: `{"errors": [...]}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status).json(json!({ "errors": [self.message] }))
    }
}

/// A running server: its address, and how to stop it.
pub(crate) struct Server {
    handle: ServerHandle,
    thread: JoinHandle<()>,
}

impl Server {
    fn stop(self) {
        let Server { handle, thread } = self;
        // The server's own system stops once the server has.
        futures::executor::block_on(handle.stop(true));
        let _ = thread.join();
    }
}

/// Every route, also under Flink's versioned prefix `/v1`.
fn routes(config: &mut web::ServiceConfig) {
    jobs::routes(config);
    checkpoints::routes(config);
    operations::routes(config);
    rescales::routes(config);
    config.route("/metrics", web::get().to(prometheus::metrics));
}

/// How the REST API is secured: the token every request must present,
/// and TLS.
pub(crate) struct Secured {
    pub token: Option<HttpToken>,
    pub tls: Option<RestTls>,
}

/// Serves `view` on `listener` from a thread of its own, until the view
/// shuts it down; returns the address it serves on. With a token, every
/// request must present it.
pub(crate) fn serve(
    listener: TcpListener,
    view: Arc<JobView>,
    Secured { token, tls }: Secured,
) -> std::io::Result<SocketAddr> {
    let addr = listener.local_addr()?;
    let loopback = addr.ip().is_loopback();
    let data = web::Data::from(view.clone());
    let sampled = view.clone();
    let (started, handle) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(format!("tidemark-http-{}", view.name))
        .spawn(move || {
            let system = actix_rt::System::new();
            let server = actix_web::HttpServer::new(move || {
                let token = token.clone();
                App::new()
                    .wrap_fn(move |request, service| {
                        use actix_web::dev::Service;
                        use futures::future::{ready, Either, FutureExt};
                        if let Some(token) = &token {
                            let authorization = request.headers().get(header::AUTHORIZATION);
                            if !token.admits(authorization.map(|v| v.as_bytes())) {
                                let response = request.into_response(unauthorized());
                                return Either::Left(ready(Ok(response.map_into_right_body())));
                            }
                        }
                        if loopback && !local_host(&request) {
                            let refused = ApiError::new(
                                StatusCode::FORBIDDEN,
                                "this server answers only requests to localhost, 127.0.0.1 or [::1]",
                            );
                            let response = request.error_response(refused).map_into_right_body();
                            return Either::Left(ready(Ok(response)));
                        }
                        Either::Right(service.call(request).map(|r| r.map(|r| r.map_into_left_body())))
                    })
                    .app_data(data.clone())
                    .app_data(web::QueryConfig::default().error_handler(|e, _| {
                        ApiError::new(StatusCode::BAD_REQUEST, e.to_string()).into()
                    }))
                    .app_data(web::PathConfig::default().error_handler(|e, _| {
                        ApiError::new(StatusCode::BAD_REQUEST, e.to_string()).into()
                    }))
                    .service(web::scope("/v1").configure(routes))
                    .configure(routes)
                    .configure(page::routes)
                    .default_service(web::to(not_found))
            })
            .workers(1)
            // A page's idle keep-alive connection must not hold up the
            // end of the job.
            .shutdown_timeout(1)
            .disable_signals();
            let server = match tls {
                Some(tls) => server.listen_rustls_0_23(listener, tls.config()),
                None => server.listen(listener),
            };
            match server {
                Ok(server) => {
                    let server = server.run();
                    let _ = started.send(Ok(server.handle()));
                    let _ = system.block_on(async move {
                        actix_rt::spawn(jobs::sample_history(sampled));
                        server.await
                    });
                }
                Err(e) => {
                    let _ = started.send(Err(e));
                }
            }
        })?;
    let handle = handle
        .recv()
        .map_err(|_| std::io::Error::other("the HTTP server's thread died"))??;
    *view.server.lock().unwrap_or_else(PoisonError::into_inner) = Some(Server { handle, thread });
    // A job that ended while the server started has no one left to stop it.
    if view.status().0 != JobStatus::Running {
        view.stop_server();
    }
    Ok(addr)
}

/// A refused request: Flink's error shape, and the challenges that make a
/// browser ask for the token (as a Basic password) and tell a client that
/// a bearer token will do.
fn unauthorized() -> HttpResponse {
    HttpResponse::Unauthorized()
        .append_header((header::WWW_AUTHENTICATE, "Basic realm=\"tidemark\""))
        .append_header((header::WWW_AUTHENTICATE, "Bearer realm=\"tidemark\""))
        .json(json!({ "errors": ["this REST API needs its token: Authorization: Bearer TOKEN"] }))
}

/// Whether a request names this machine in its `Host`: a server on
/// loopback refuses other names, so that a page whose domain was rebound
/// to 127.0.0.1 cannot reach the job.
fn local_host(request: &actix_web::dev::ServiceRequest) -> bool {
    let Some(host) = request
        .headers()
        .get(actix_web::http::header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return true;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    ["localhost", "127.0.0.1", "::1"].contains(&name.to_ascii_lowercase().as_str())
}

async fn not_found(request: actix_web::HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Not found: {}", request.path()),
    ))
}

/// Binds `addr` for [`serve`]: an error here means nothing was deployed.
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
}
