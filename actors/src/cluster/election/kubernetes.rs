//! Leader election of a job's drivers over a Kubernetes `Lease`
//! (`coordination.k8s.io/v1`): the IO around [`tidemark_core::cluster::election`]'s
//! rules. Every write replaces the version it read, so the API server's
//! optimistic concurrency decides races; a job that ran to its end marks
//! the Lease with [`FINISHED`] so that a standby does not run it again.

use super::ElectionError;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::time::Duration;
use tidemark_core::cluster::election::{ElectionTiming, Elector, LeaderRecord, Next};
use tidemark_storage::lease::now_ms;
use tokio::time::Instant;

/// The Lease's annotation saying that the job ran to its end under its
/// holder.
pub const FINISHED: &str = "tidemark.io/finished";

/// One driver's part in the election over one Lease.
pub struct LeaseElection {
    api: Api<Lease>,
    lease: String,
    name: String,
    elector: Elector,
    start: Instant,
    /// The Lease as last read or written: the version the next write
    /// replaces.
    read: Option<Lease>,
    /// The holder last reported waiting on, so a wait is logged once.
    waiting_on: Option<String>,
}

impl LeaseElection {
    /// A candidate named `identity` for Lease `name` in `namespace` (the
    /// client's default namespace when `None`: in a pod, its own).
    pub fn new(
        client: Client,
        namespace: Option<&str>,
        name: &str,
        identity: &str,
        timing: ElectionTiming,
    ) -> Self {
        let namespace = namespace.unwrap_or(client.default_namespace()).to_string();
        LeaseElection {
            api: Api::namespaced(client, &namespace),
            lease: format!("{namespace}/{name}"),
            name: name.to_string(),
            elector: Elector::new(identity, timing),
            start: Instant::now(),
            read: None,
            waiting_on: None,
        }
    }

    /// A client from the environment: the pod's service account in a pod,
    /// the kubeconfig elsewhere.
    pub async fn client() -> Result<Client, ElectionError> {
        Client::try_default()
            .await
            .map_err(|e| ElectionError::NoCluster(e.to_string()))
    }

    /// `namespace/name` of the Lease.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Waits until this driver leads; retries what may pass (an API that
    /// does not answer, a lost race) every retry period.
    pub async fn acquire(&mut self) -> Result<(), ElectionError> {
        let timing = self.elector.timing();
        loop {
            // A request the API never answers is one failed attempt.
            let round = tokio::time::timeout(timing.renew_deadline, self.round()).await;
            if let Some(next) = round.unwrap_or(Ok(None))? {
                match next {
                    Next::Create(_) | Next::Update(_) if self.elector.leads(self.now()) => {
                        tracing::info!(lease = %self.lease, identity = self.elector.identity(), "leading");
                        return Ok(());
                    }
                    Next::Finished { holder } => {
                        return Err(ElectionError::Finished {
                            record: self.record(),
                            holder: holder.unwrap_or_default(),
                        })
                    }
                    Next::Wait { holder, .. } if self.waiting_on.as_ref() != Some(&holder) => {
                        tracing::info!(lease = %self.lease, %holder, "standing by: another driver leads");
                        self.waiting_on = Some(holder);
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(timing.retry_period).await;
        }
    }

    /// Renews every retry period for as long as this driver leads, and
    /// says why it stopped: it returns by the renew deadline of the last
    /// renewal that was written, however long the API takes to answer and
    /// wherever the deadline falls between two attempts.
    pub async fn keep(&mut self) -> ElectionError {
        const LAPSED: &str = "the Lease could not be renewed within the renew deadline";
        loop {
            let Some(until) = self.elector.leads_until() else {
                return self.lost("it was not leading");
            };
            let (deadline, retry) = (self.start + until, self.elector.timing().retry_period);
            let renewal = async {
                tokio::time::sleep(retry).await;
                self.round().await
            };
            let renewed = tokio::time::timeout_at(deadline, renewal).await;
            match renewed {
                Err(_) => return self.lost(LAPSED),
                Ok(Err(e)) => return e,
                Ok(Ok(Some(Next::Wait { holder, .. }))) => {
                    return self.lost(&format!("{holder} holds it now"))
                }
                Ok(Ok(Some(Next::Finished { holder }))) => {
                    return self.lost(&format!(
                        "it is marked finished under {}",
                        holder.unwrap_or_default()
                    ))
                }
                Ok(_) if !self.elector.leads(self.now()) => return self.lost(LAPSED),
                Ok(_) => {}
            }
        }
    }

    fn lost(&self, why: &str) -> ElectionError {
        ElectionError::Lost {
            record: self.record(),
            why: why.to_string(),
        }
    }

    /// Gives the Lease up if this driver still leads, so that a standby
    /// takes over at once, or, when the job ran to its end, marks it
    /// finished so that none runs the job again. A write that fails is
    /// tried again on the Lease as read anew until this driver's leadership
    /// runs out: a finished mark that is not written lets a standby run the
    /// job again.
    pub async fn release(&mut self, finished: bool) -> Result<(), ElectionError> {
        let Some(until) = self.elector.leads_until() else {
            return Ok(());
        };
        let given_up = tokio::time::timeout_at(self.start + until, self.give_up(finished)).await;
        match given_up {
            Ok(given_up) => given_up,
            Err(_) if finished => Err(self.not_marked()),
            // The Lease lapses on its own within its duration.
            Err(_) => Ok(()),
        }
    }

    async fn give_up(&mut self, finished: bool) -> Result<(), ElectionError> {
        loop {
            let began = self.now();
            let Some(record) = self.elector.release(began, now_ms(), finished) else {
                return if finished {
                    Err(self.not_marked())
                } else {
                    Ok(())
                };
            };
            let base = self.read.clone();
            let Err(failed) = self.write(base, &record, began).await else {
                return Ok(());
            };
            if let Some(fatal) = self.judge(failed, true) {
                return Err(fatal);
            }
            tokio::time::sleep(self.elector.timing().retry_period / 4).await;
            // A renewal of this driver's may have gone through unseen: read
            // the version to replace (and whether it still leads) anew.
            if let Ok(current) = self.api.get_opt(&self.name).await {
                let record = current.as_ref().map(record_of);
                self.elector.next(record.as_ref(), self.now(), now_ms());
                self.read = current;
            }
        }
    }

    fn not_marked(&self) -> ElectionError {
        ElectionError::NotMarkedFinished {
            record: self.record(),
        }
    }

    /// The Lease, as errors name it.
    fn record(&self) -> String {
        format!("Lease {}", self.lease)
    }

    /// Reads the Lease and writes what the rules say; `None` when a
    /// failure that may pass (logged) stopped it.
    async fn round(&mut self) -> Result<Option<Next>, ElectionError> {
        let began = self.now();
        let current = match self.api.get_opt(&self.name).await {
            Ok(current) => current,
            Err(e) => return self.judge(e, false).map_or(Ok(None), Err),
        };
        let record = current.as_ref().map(record_of);
        let next = self.elector.next(record.as_ref(), self.now(), now_ms());
        let replacing = matches!(next, Next::Update(_));
        let written = match &next {
            // A Create's `current` is `None`: the write creates the Lease.
            Next::Create(record) | Next::Update(record) => self.write(current, record, began).await,
            Next::Wait { .. } | Next::Finished { .. } => {
                self.read = current;
                return Ok(Some(next));
            }
        };
        match written {
            Ok(()) => Ok(Some(next)),
            Err(e) => self.judge(e, replacing).map_or(Ok(None), Err),
        }
    }

    /// Writes `record` over `base`, the Lease as read (creates it when there
    /// is none), and tells the rules what was written: a renewal counts from
    /// `began`, before the request was sent.
    async fn write(
        &mut self,
        base: Option<Lease>,
        record: &LeaderRecord,
        began: Duration,
    ) -> Result<(), kube::Error> {
        let (params, creating) = (PostParams::default(), base.is_none());
        let lease = lease_of(base, &self.name, record);
        let written = if creating {
            self.api.create(&params, &lease).await?
        } else {
            self.api.replace(&self.name, &params, &lease).await?
        };
        self.elector.written(record_of(&written), began, self.now());
        self.read = Some(written);
        Ok(())
    }

    /// `None` for what may pass (logged); the error for what will not.
    /// `replacing`: the request replaced the Lease, and a 404 means it was
    /// deleted since it was read, which the next attempt mends.
    fn judge(&self, e: kube::Error, replacing: bool) -> Option<ElectionError> {
        let lease = self.lease.clone();
        match e {
            kube::Error::Api(status) if matches!(status.code, 401 | 403) => {
                Some(ElectionError::Forbidden {
                    lease,
                    message: status.message,
                })
            }
            // A namespace that does not exist, an API without Leases, a
            // Lease the API cannot take: asking again changes nothing.
            kube::Error::Api(status)
                if matches!(status.code, 400 | 404 | 405 | 422)
                    && !(replacing && status.code == 404) =>
            {
                Some(ElectionError::Api {
                    lease,
                    message: format!("{} ({})", status.message, status.code),
                })
            }
            e => {
                tracing::warn!(%lease, error = %e, "a Lease request failed; trying again");
                None
            }
        }
    }
}

fn micro_time(ms: u64) -> Option<MicroTime> {
    Timestamp::from_millisecond(i64::try_from(ms).ok()?)
        .ok()
        .map(MicroTime)
}

fn millis(time: &Option<MicroTime>) -> u64 {
    time.as_ref()
        .map_or(0, |t| u64::try_from(t.0.as_millisecond()).unwrap_or(0))
}

/// What a Lease says, in the election's terms.
fn record_of(lease: &Lease) -> LeaderRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    let finished = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FINISHED))
        .is_some_and(|v| v == "true");
    LeaderRecord {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        lease_duration_secs: spec
            .lease_duration_seconds
            .and_then(|s| u32::try_from(s).ok())
            .unwrap_or(0),
        acquire_ms: millis(&spec.acquire_time),
        renew_ms: millis(&spec.renew_time),
        transitions: spec
            .lease_transitions
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(0),
        finished,
        version: lease.metadata.resource_version.clone().unwrap_or_default(),
    }
}

/// `base` (the Lease as read, which carries the version the write
/// replaces) saying `record`.
fn lease_of(base: Option<Lease>, name: &str, record: &LeaderRecord) -> Lease {
    let mut lease = base.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    let annotations = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if record.finished {
        annotations.insert(FINISHED.to_string(), "true".to_string());
    } else {
        annotations.remove(FINISHED);
    }
    lease.spec = Some(LeaseSpec {
        holder_identity: record.holder.clone(),
        lease_duration_seconds: i32::try_from(record.lease_duration_secs).ok(),
        acquire_time: micro_time(record.acquire_ms),
        renew_time: micro_time(record.renew_ms),
        lease_transitions: i32::try_from(record.transitions).ok(),
        ..lease.spec.unwrap_or_default()
    });
    lease
}
