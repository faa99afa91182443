//! Running a job: an actix system on its own thread with a pool of arbiters
//! sized to the cores, so that a job can be embedded in any application,
//! async or not, and a handle to wait for it or cancel it.

use crate::cluster::remote::{Distributed, Pool};
use crate::cluster::supervisor::{Hosts, JobSupervisor};
pub use crate::cluster::supervisor::{JobControl, Savepoint};
use crate::dataflow::net::{WorkerAssignment, Workers};
use crate::http::{self, HttpToken, JobStatus, JobView};
pub use crate::job::{job_id, JobError, JobReport};
use crate::messages::LeaseTakenOver;
use crate::metrics::JobMetrics;
use crate::tls::RestTls;
use actix::{Actor, Addr, Arbiter, System};
use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use tidemark_core::checkpoint::lease::{next_renewal, LeaseConfig, Renewal};
use tidemark_core::checkpoint::stats::{self, CheckpointStatsTracker};
use tidemark_core::checkpoint::CheckpointFailure;
use tidemark_core::job::Job;
use tidemark_core::model::event::CheckpointKind;
use tidemark_core::model::ids::{CheckpointId, SubtaskId};
use tidemark_storage::lease::Lease;
use tidemark_storage::{CheckpointStorage, StorageError};

/// A running job, from [`Runtime::run`] or [`RunJob::run`]: wait for it,
/// cancel it, trigger checkpoints, read its live metrics. Dropping the
/// handle does not stop the job.
pub struct JobHandle {
    outcome: mpsc::Receiver<Result<JobReport, JobError>>,
    control: JobControl,
    metrics: Arc<JobMetrics>,
    storage: Option<CheckpointStorage>,
    thread: JoinHandle<()>,
    http: Option<SocketAddr>,
    /// What the REST API serves, if it runs.
    view: Option<Arc<JobView>>,
}

impl JobHandle {
    /// Blocks until the job has finished, failed or been cancelled, and its
    /// threads are gone.
    pub fn wait(self) -> Result<JobReport, JobError> {
        let outcome = self.outcome.recv().unwrap_or_else(|_| {
            Err(JobError::Runtime(
                "the runtime stopped without an outcome".into(),
            ))
        });
        self.thread
            .join()
            .map_err(|_| JobError::Runtime("the runtime thread panicked".into()))?;
        // Normally stopped by the runtime thread already, unless the job
        // ended before the server had started.
        if let Some(view) = &self.view {
            view.stop_server();
        }
        outcome
    }

    /// Asks the job to end: `wait` then returns [`JobError::Cancelled`],
    /// unless the job had already ended. Returns at once; pending
    /// checkpoints are abandoned and their state deleted before the job
    /// ends.
    pub fn cancel(&self) {
        self.control.cancel();
    }

    /// Triggers a checkpoint (or savepoint) now and blocks until it completed
    /// or failed; call it from a thread that is not driving an async runtime.
    pub fn trigger_checkpoint(
        &self,
        kind: CheckpointKind,
    ) -> Result<CheckpointId, CheckpointFailure> {
        self.control.trigger_checkpoint(kind)
    }

    /// Triggers checkpoints and savepoints from other threads.
    pub fn control(&self) -> JobControl {
        self.control.clone()
    }

    /// The job's live figures, updated while it runs and across restarts.
    pub fn metrics(&self) -> &Arc<JobMetrics> {
        &self.metrics
    }

    /// Where the job's REST API is served, if [`Runtime::http`] asked for it.
    pub fn http_address(&self) -> Option<SocketAddr> {
        self.http
    }

    /// The job's checkpoint statistics as of now: per checkpoint, operator
    /// and subtask, in a bounded history, with counts and summaries.
    pub fn checkpoint_stats(&self) -> CheckpointStatsTracker {
        stats::lock(&self.metrics.checkpoint_stats).clone()
    }

    /// The job's checkpoint storage, if it checkpoints: its counters, and
    /// for `memory://` the store itself.
    pub fn storage(&self) -> Option<&CheckpointStorage> {
        self.storage.as_ref()
    }
}

/// Deploys jobs; `threads` arbiters run their actors.
#[derive(Clone, Debug)]
pub struct Runtime {
    /// Arbiters (threads) the job's actors are spread over; 0 counts as 1.
    /// Defaults to the available parallelism.
    pub threads: usize,
    /// Serve the job's REST API, metrics and page here (Flink's REST
    /// API); off by default. Port 0 takes a free port:
    /// [`JobHandle::http_address`] tells which.
    pub http: Option<SocketAddr>,
    /// The token every request to the REST API must present; required
    /// where `http` is not a loopback address.
    pub http_token: Option<HttpToken>,
    /// TLS of the REST API; required where `http` is not a loopback
    /// address, unless `http_insecure`.
    pub http_tls: Option<RestTls>,
    /// Serve the REST API beyond loopback over plain HTTP, its token in
    /// the clear: the network is trusted.
    pub http_insecure: bool,
    /// Spreads the subtasks over this many workers within this process
    /// (subtask index modulo workers), every channel between two of them
    /// over loopback TCP: the data plane of worker processes, in one
    /// process. 0 and 1 keep every channel an actor message.
    pub local_workers: u32,
    /// Runs the subtasks in worker processes instead (`local_workers` is
    /// then ignored): this process keeps the supervisor and the checkpoint
    /// coordinator. Needs checkpoint storage every worker reaches (not
    /// `memory://`).
    pub distributed: Option<Distributed>,
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            http: None,
            http_token: None,
            http_tls: None,
            http_insecure: false,
            local_workers: 0,
            distributed: None,
        }
    }
}

impl Runtime {
    /// Validates the job, opens its checkpoint and savepoint storage and
    /// deploys it on a new actix system on its own thread; returns once the
    /// job's supervisor is running, without waiting for the job. Errors here
    /// mean nothing was deployed.
    pub fn run(&self, job: Job) -> Result<JobHandle, JobError> {
        self.check(&job)?;
        let job_id = job_id(&job.name);
        let checkpointing = job.config.checkpointing.as_ref();
        let storage = checkpointing
            .map(|c| CheckpointStorage::open(&c.storage_url, job_id))
            .transpose()?;
        let savepoint_dir = checkpointing
            .and_then(|c| c.savepoint_dir.as_deref())
            .map(|dir| CheckpointStorage::open_directory(dir, true))
            .transpose()?;
        let listener = self
            .http
            .map(|addr| {
                http::bind(addr).map_err(|e| {
                    JobError::Runtime(format!("cannot serve the REST API on {addr}: {e}"))
                })
            })
            .transpose()?;
        let history = checkpointing.map_or(stats::DEFAULT_HISTORY, |c| c.history);
        let metrics = Arc::new(JobMetrics::new(history));
        let served = listener.map(|l| (l, Arc::new(JobView::new(&job, job_id, metrics.clone()))));
        let (outcome_tx, outcome) = mpsc::channel();
        let (addr_tx, addr_rx) = mpsc::channel();
        let pool = self.distributed.clone().map(Pool::new);
        let placement = match pool {
            Some(_) => WorkerAssignment::new(1),
            None => WorkerAssignment::new(self.local_workers),
        };
        let name = format!("tidemark-{}", job.name);
        let body = JobThread {
            lease: checkpointing.map(|c| c.lease.clone()),
            job,
            threads: self.threads.max(1),
            placement,
            pool,
            metrics: metrics.clone(),
            storage: storage.clone(),
            savepoint_dir,
            view: served.as_ref().map(|(_, view)| view.clone()),
            started: addr_tx,
            outcome: outcome_tx,
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || body.run())
            .map_err(|e| JobError::Runtime(format!("cannot start the runtime thread: {e}")))?;
        let supervisor = addr_rx
            .recv()
            .map_err(|_| JobError::Runtime("the runtime did not start".into()))??;
        let control = JobControl { supervisor };
        let (http, view) = match served {
            Some((listener, view)) => self.serve(listener, view, &control),
            None => (None, None),
        };
        Ok(JobHandle {
            view,
            outcome,
            control,
            metrics,
            storage,
            thread,
            http,
        })
    }

    /// Refuses a job that cannot run as configured, before anything is
    /// created.
    fn check(&self, job: &Job) -> Result<(), JobError> {
        job.validate()?;
        job.config.validate()?;
        if let Some(addr) = self.http {
            http::check_exposure(
                addr,
                self.http_token.is_some(),
                self.http_tls.is_some() || self.http_insecure,
            )?;
        }
        if let Some(settings) = &job.config.checkpointing {
            settings.validate()?;
            tidemark_storage::check_savepoint_dir(settings, job_id(&job.name))?;
        }
        if let (Some(_), Some(settings)) = (&self.distributed, &job.config.checkpointing) {
            let url = &settings.storage_url;
            if url.starts_with("memory://") || url.starts_with("store://") {
                return Err(JobError::Runtime(format!(
                    "checkpoint storage {url} lives in this process: worker processes need storage they all reach (a directory or s3://)"
                )));
            }
        }
        let subtasks: Vec<SubtaskId> = job.graph.subtasks().collect();
        match job
            .config
            .faults
            .iter()
            .find(|f| !subtasks.contains(&f.subtask))
        {
            Some(fault) => Err(JobError::UnknownFaultTarget(fault.subtask)),
            None => Ok(()),
        }
    }

    /// Serves the REST API of the deployed job; a server that cannot start
    /// leaves the job running, unobserved.
    fn serve(
        &self,
        listener: std::net::TcpListener,
        view: Arc<JobView>,
        control: &JobControl,
    ) -> (Option<SocketAddr>, Option<Arc<JobView>>) {
        view.deployed(control.clone());
        let secured = http::Secured {
            token: self.http_token.clone(),
            tls: self.http_tls.clone(),
        };
        match http::serve(listener, view.clone(), secured) {
            Ok(addr) => (Some(addr), Some(view)),
            Err(e) => {
                tracing::error!("the REST API could not start: {e}");
                (None, None)
            }
        }
    }
}

/// The thread a job runs on: its actix system, arbiters and lease.
struct JobThread {
    job: Job,
    threads: usize,
    placement: WorkerAssignment,
    pool: Option<Pool>,
    metrics: Arc<JobMetrics>,
    storage: Option<CheckpointStorage>,
    savepoint_dir: Option<CheckpointStorage>,
    /// How the run leases its job directory, when it checkpoints.
    lease: Option<LeaseConfig>,
    view: Option<Arc<JobView>>,
    /// The supervisor once it runs, or why nothing was deployed.
    started: mpsc::Sender<Result<Addr<JobSupervisor>, JobError>>,
    outcome: mpsc::Sender<Result<JobReport, JobError>>,
}

impl JobThread {
    fn run(self) {
        let system = System::new();
        let lease = match (&self.storage, &self.lease) {
            (Some(storage), Some(options)) => {
                match system.block_on(Lease::acquire(storage, options)) {
                    Ok(lease) => Some(Arc::new(lease)),
                    Err(e) => {
                        let _ = self.started.send(Err(e.into()));
                        return;
                    }
                }
            }
            _ => None,
        };
        // The supervisor's outcome passes through this thread, which ends
        // the REST API's view of the job before handing it on.
        let (supervisor_tx, outcome_rx) = mpsc::channel();
        let (view, outcome) = (self.view.clone(), self.outcome.clone());
        let arbiters = self.deploy(&system, lease.clone(), supervisor_tx);
        let _ = system.run();
        for arbiter in arbiters {
            arbiter.stop();
            let _ = arbiter.join();
        }
        let outcome_of_job = outcome_rx.try_recv().unwrap_or_else(|_| {
            Err(JobError::Runtime(
                "the runtime stopped without an outcome".into(),
            ))
        });
        if let Some(view) = &view {
            view.ended(match &outcome_of_job {
                Ok(_) => JobStatus::Finished,
                Err(JobError::Cancelled) => JobStatus::Canceled,
                Err(_) => JobStatus::Failed,
            });
        }
        if let Some(lease) = lease {
            let released = actix_rt::Runtime::new()
                .map_err(|e| e.to_string())
                .and_then(|rt| rt.block_on(lease.release()).map_err(|e| e.to_string()));
            if let Err(e) = released {
                tracing::warn!("the job directory's lease was not released ({e}); the next run takes it once it expires");
            }
        }
        // The lease is free for the next run while a client that stopped
        // the job reads how its savepoint went.
        if let Some(view) = view {
            view.shutdown();
        }
        let _ = outcome.send(outcome_of_job);
    }

    /// Starts the arbiters, the lease's renewal and the supervisor on
    /// `system`; returns the arbiters, to stop once the system has.
    fn deploy(
        self,
        system: &actix::SystemRunner,
        lease: Option<Arc<Lease>>,
        outcome: mpsc::Sender<Result<JobReport, JobError>>,
    ) -> Vec<Arbiter> {
        let storage = self.storage.map(|storage| match &lease {
            Some(lease) => storage.fenced(lease.clone()),
            None => storage,
        });
        let mut arbiters: Vec<Arbiter> = (0..self.threads).map(|_| Arbiter::new()).collect();
        let handles = arbiters.iter().map(Arbiter::handle).collect();
        let links = self.placement.spreads().then(|| {
            arbiters.push(Arbiter::new());
            arbiters.last().expect("just pushed").handle()
        });
        let (job, placement, pool, metrics) = (self.job, self.placement, self.pool, self.metrics);
        let (savepoint_dir, started) = (self.savepoint_dir, self.started);
        // A thread of its own: a supervisor busy restoring, or a slow
        // store, must not hold a renewal back past the time to live.
        let renewal = lease.map(|lease| {
            let renewing = Arbiter::new();
            let handle = renewing.handle();
            arbiters.push(renewing);
            (handle, lease)
        });
        system.block_on(async move {
            let supervisor = JobSupervisor::new(
                job,
                Hosts {
                    arbiters: handles,
                    workers: Workers { placement, links },
                    pool,
                },
                metrics,
                outcome,
                storage,
                savepoint_dir,
            )
            .start();
            if let Some((renewing, lease)) = renewal {
                renewing.spawn(renew(lease, supervisor.clone().recipient()));
            }
            let _ = started.send(Ok(supervisor));
        });
        arbiters
    }
}

/// Renews `lease` for as long as the job's system runs, when
/// [`next_renewal`] says. While no renewal lands for half the time to
/// live, `_metadata` writes and deletions fail, naming why; once a newer
/// run took the directory over, `supervisor` ends the run.
async fn renew(lease: Arc<Lease>, supervisor: actix::Recipient<LeaseTakenOver>) {
    // At once: the lease counts from before its taking's slow calls.
    let mut due = actix_rt::time::Instant::now();
    loop {
        actix_rt::time::sleep_until(due).await;
        let started = actix_rt::time::Instant::now();
        let renewal = match lease.renew().await {
            Ok(()) => Renewal::Landed,
            Err(e @ StorageError::Fenced { .. }) => {
                supervisor.do_send(LeaseTakenOver(e));
                Renewal::TakenOver
            }
            Err(e) => {
                tracing::warn!("renewing the lease failed, trying again soon: {e}");
                Renewal::Failed
            }
        };
        let now = actix_rt::time::Instant::now();
        match next_renewal(lease.ttl(), started.into_std(), now.into_std(), renewal) {
            Some(next) => due = next.into(),
            None => return,
        }
    }
}

/// `job.run()`: deploys on a default runtime, one arbiter per core.
pub trait RunJob {
    /// Deploys the job; see [`Runtime::run`].
    fn run(self) -> Result<JobHandle, JobError>;
}

impl RunJob for Job {
    fn run(self) -> Result<JobHandle, JobError> {
        Runtime::default().run(self)
    }
}
