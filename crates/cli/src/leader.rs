//! `run --leader-lease` and `run --zookeeper-quorum`: the job runs only
//! while this driver leads, through a Kubernetes Lease or ZooKeeper. The
//! election keeps its own thread and runtime, so that it goes on whatever
//! the job's threads do.

use super::CliError;
use crate::config::Options;
use futures::future::Either;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use tidemark_actors::election::{
    CheckpointPointer, ElectionError, LeaseElection, ZooKeeperConfig, ZooKeeperElection,
};
use tidemark_actors::metrics::JobMetrics;
use tidemark_actors::runtime::JobControl;
use tidemark_core::cluster::election::ElectionTiming;
use tidemark_core::model::ids::CheckpointId;
use tidemark_storage::CheckpointStorage;
use tokio::sync::oneshot;

/// This driver's leadership, from the moment it leads.
pub struct Leadership {
    /// Told at the job's end whether it ran to its end.
    done: oneshot::Sender<bool>,
    /// The job to cancel when leadership is lost, once there is one.
    job: Arc<Mutex<Watched>>,
    thread: JoinHandle<Result<(), ElectionError>>,
}

#[derive(Default)]
struct Watched {
    control: Option<JobControl>,
    /// Where the job's latest completed checkpoint is read from.
    metrics: Option<Arc<JobMetrics>>,
    lost: bool,
}

impl Watched {
    /// The job's latest completed checkpoint, if it has one.
    fn latest(&self) -> Option<(CheckpointId, String)> {
        let metrics = self.metrics.as_ref()?;
        let stats = tidemark_core::checkpoint::stats::lock(&metrics.checkpoint_stats);
        let latest = stats.latest_completed()?;
        Some((latest.id, latest.external_path.clone()?))
    }
}

/// The election, over whichever service the options name; one per
/// driver, so its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Election {
    Lease(LeaseElection),
    ZooKeeper(ZooKeeperElection),
}

/// What to elect over, read from the options on the caller's thread.
enum Service {
    Lease {
        namespace: Option<String>,
        name: String,
        timing: ElectionTiming,
    },
    ZooKeeper(ZooKeeperConfig),
}

impl Service {
    /// The service `options` elect through (they elect: validated).
    fn of(options: &Options) -> Service {
        if let Some(name) = options.leader_lease.clone() {
            return Service::Lease {
                namespace: options.leader_namespace.clone(),
                name,
                timing: options.election_timing(),
            };
        }
        Service::ZooKeeper(ZooKeeperConfig {
            quorum: options.zookeeper_quorum.clone().unwrap_or_default(),
            root: options.zookeeper_root.clone(),
            cluster_id: options.cluster_id.clone(),
            session_timeout: options.zookeeper_session_timeout,
            connection_timeout: options.zookeeper_connection_timeout,
        })
    }
}

impl Election {
    async fn open(service: Service, identity: &str) -> Result<Election, ElectionError> {
        match service {
            Service::Lease {
                namespace,
                name,
                timing,
            } => {
                let client = LeaseElection::client().await?;
                let election =
                    LeaseElection::new(client, namespace.as_deref(), &name, identity, timing);
                Ok(Election::Lease(election))
            }
            Service::ZooKeeper(config) => Ok(Election::ZooKeeper(ZooKeeperElection::new(
                config, identity,
            ))),
        }
    }

    fn record(&self) -> String {
        match self {
            Election::Lease(election) => format!("Lease {}", election.lease()),
            Election::ZooKeeper(election) => election.record(),
        }
    }

    /// Waits until this driver leads, and checks that it can restore what
    /// the service says the job has committed.
    async fn acquire(&mut self, storage: Option<&CheckpointStorage>) -> Result<(), ElectionError> {
        match self {
            // A Lease records no checkpoint to check.
            Election::Lease(election) => election.acquire().await,
            Election::ZooKeeper(election) => {
                election.acquire().await?;
                match storage {
                    Some(storage) => election.check_latest(storage).await,
                    None => Ok(()),
                }
            }
        }
    }

    async fn keep(&mut self, watched: &Arc<Mutex<Watched>>) -> ElectionError {
        match self {
            Election::Lease(election) => election.keep().await,
            Election::ZooKeeper(election) => {
                election
                    .keep(|| pointer(&watched.lock().expect("the leader's watch")))
                    .await
            }
        }
    }

    async fn release(
        &mut self,
        finished: bool,
        watched: &Arc<Mutex<Watched>>,
    ) -> Result<(), ElectionError> {
        match self {
            Election::Lease(election) => election.release(finished).await,
            Election::ZooKeeper(election) => {
                let last = pointer(&watched.lock().expect("the leader's watch"));
                election.release(finished, last).await
            }
        }
    }
}

fn pointer(watched: &Watched) -> Option<CheckpointPointer> {
    let (checkpoint, path) = watched.latest()?;
    Some(CheckpointPointer { checkpoint, path })
}

impl Leadership {
    /// Waits until this driver leads the election `options` configure;
    /// `storage` is the job directory a new leader restores from.
    pub fn acquire(
        options: &Options,
        storage: Option<CheckpointStorage>,
    ) -> Result<Leadership, CliError> {
        let identity = options.leader_identity.clone().unwrap_or_else(|| {
            use tidemark_storage::lease::{host, run_identity};
            run_identity(&host(), std::process::id())
        });
        let service = Service::of(options);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::Runtime(e.to_string()))?;
        let (leading, acquired) = mpsc::channel();
        let (done, finished) = oneshot::channel::<bool>();
        let job = Arc::new(Mutex::new(Watched::default()));
        let watched = job.clone();
        let thread = std::thread::Builder::new()
            .name("tidemark-leader".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let mut election = match Election::open(service, &identity).await {
                        Ok(election) => election,
                        Err(e) => {
                            let _ = leading.send(Err(e));
                            return Ok(());
                        }
                    };
                    let record = election.record();
                    eprintln!("tidemark: {identity} is a candidate for leading through {record}");
                    if let Err(e) = election.acquire(storage.as_ref()).await {
                        // Another may lead now: this one gives its turn up.
                        let _ = election.release(false, &watched).await;
                        let _ = leading.send(Err(e));
                        return Ok(());
                    }
                    eprintln!("tidemark: {identity} leads through {record}");
                    let _ = leading.send(Ok(()));
                    let keep = Box::pin(election.keep(&watched));
                    let finished = match futures::future::select(keep, finished).await {
                        Either::Left((lost, _)) => {
                            let mut job = watched.lock().expect("the leader's watch");
                            job.lost = true;
                            if let Some(control) = &job.control {
                                control.cancel();
                            }
                            return Err(lost);
                        }
                        Either::Right((finished, _)) => finished.unwrap_or(false),
                    };
                    election.release(finished, &watched).await
                })
            })
            .map_err(|e| CliError::Runtime(e.to_string()))?;
        match acquired.recv() {
            Ok(Ok(())) => Ok(Leadership { done, job, thread }),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(CliError::Runtime(
                "the leader election's thread panicked".into(),
            )),
        }
    }

    /// Cancels `control`'s job when leadership is lost (at once if it
    /// already was), and records its checkpoints from `metrics`.
    pub fn watch(&self, control: JobControl, metrics: Arc<JobMetrics>) {
        let mut job = self.job.lock().expect("the leader's watch");
        if job.lost {
            control.cancel();
        }
        job.control = Some(control);
        job.metrics = Some(metrics);
    }

    /// The job ended (`finished`: ran to its end): gives the leadership
    /// up, or says that it was lost before.
    pub fn end(self, finished: bool) -> Result<(), CliError> {
        let _ = self.done.send(finished);
        match self.thread.join() {
            Ok(ended) => ended.map_err(CliError::from),
            Err(_) => Err(CliError::Runtime(
                "the leader election's thread panicked".into(),
            )),
        }
    }
}
