//! `run --leader-lease`: the job runs only while this driver leads through
//! a Kubernetes Lease. The election keeps its own thread and runtime, so
//! that renewals go on whatever the job's threads do.

use super::CliError;
use crate::config::Options;
use futures::future::Either;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use tidemark_actors::election::{ElectionError, LeaseElection};
use tidemark_actors::runtime::JobControl;
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
    lost: bool,
}

impl Leadership {
    /// Waits until this driver leads the election `options` configure.
    pub fn acquire(options: &Options, lease: &str) -> Result<Leadership, CliError> {
        let identity = options.leader_identity.clone().unwrap_or_else(|| {
            use tidemark_storage::lease::{host, run_identity};
            run_identity(&host(), std::process::id())
        });
        let (namespace, name) = (options.leader_namespace.clone(), lease.to_string());
        let timing = options.election_timing();
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
                    let client = match LeaseElection::client().await {
                        Ok(client) => client,
                        Err(e) => {
                            let _ = leading.send(Err(e));
                            return Ok(());
                        }
                    };
                    let mut election =
                        LeaseElection::new(client, namespace.as_deref(), &name, &identity, timing);
                    eprintln!(
                        "tidemark: {identity} is a candidate for leading through Lease {}",
                        election.lease()
                    );
                    if let Err(e) = election.acquire().await {
                        let _ = leading.send(Err(e));
                        return Ok(());
                    }
                    eprintln!(
                        "tidemark: {identity} leads through Lease {}",
                        election.lease()
                    );
                    let _ = leading.send(Ok(()));
                    let keep = Box::pin(election.keep());
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
                    election.release(finished).await
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
    /// already was).
    pub fn watch(&self, control: JobControl) {
        let mut job = self.job.lock().expect("the leader's watch");
        if job.lost {
            control.cancel();
        }
        job.control = Some(control);
    }

    /// The job ended (`finished`: ran to its end): gives the Lease up, or
    /// says that leadership was lost before.
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
