//! Leader election of a job's drivers: one leads and runs the job, the
//! others stand by and take over, restoring the job's latest checkpoint,
//! once it is gone. Two services can elect: a Kubernetes `Lease`
//! ([`LeaseElection`], feature `kubernetes`) and ZooKeeper, as Flink's
//! `high-availability.type: zookeeper` ([`ZooKeeperElection`], feature
//! `zookeeper`). Either way, leading alone never fences a stale leader's
//! writes: the job directory's lease (`tidemark_storage::lease`) does, by
//! epoch, and an elected leader takes it over.

#[cfg(feature = "kubernetes")]
mod kubernetes;
#[cfg(feature = "zookeeper")]
mod zookeeper;

#[cfg(feature = "kubernetes")]
pub use kubernetes::{LeaseElection, FINISHED};
#[cfg(feature = "zookeeper")]
pub use zookeeper::{CheckpointPointer, ZooKeeperConfig, ZooKeeperElection};

use thiserror::Error;
use tidemark_core::model::ids::CheckpointId;

/// Why this driver does not (or no longer) lead. `record` names what the
/// election is held over: `Lease namespace/name`, or a ZooKeeper node.
#[derive(Debug, Error)]
pub enum ElectionError {
    /// No Kubernetes API to elect over.
    #[error("leader election needs the Kubernetes API, and none was found: {0} (in a pod, the service account's; elsewhere, KUBECONFIG or ~/.kube/config)")]
    NoCluster(String),
    /// The API refused this driver the Lease.
    #[error("the Kubernetes API refused Lease {lease}: {message}; the driver's service account needs get, create and update on leases (group coordination.k8s.io) in its namespace, as in examples/kubernetes/driver.yaml")]
    Forbidden {
        /// `namespace/name`.
        lease: String,
        /// The API's words.
        message: String,
    },
    /// The API answered in a way that retrying does not mend.
    #[error("the Kubernetes API failed on Lease {lease}: {message}")]
    Api {
        /// `namespace/name`.
        lease: String,
        /// The API's words.
        message: String,
    },
    /// ZooKeeper could not be reached, or refused what the election needs.
    #[error("leader election through ZooKeeper at {quorum} failed: {message}")]
    ZooKeeper {
        /// `high-availability.zookeeper.quorum`.
        quorum: String,
        /// What went wrong.
        message: String,
    },
    /// The job already ran to its end under an earlier leader.
    #[error("the job already ran to its end under leader {holder}, as {record} says; delete {record} to run it again")]
    Finished {
        /// Where that is recorded.
        record: String,
        /// The leader it finished under.
        holder: String,
    },
    /// The job ran to its end but the election's record does not say so.
    #[error("the job ran to its end, but {record} could not be marked finished before this driver's leadership ran out; a standby may run the job again from its latest checkpoint")]
    NotMarkedFinished {
        /// Where that would have been recorded.
        record: String,
    },
    /// This driver led and no longer does.
    #[error("lost the leadership of {record}: {why}; the job was cancelled here, and the new leader restores it")]
    Lost {
        /// What the election is held over.
        record: String,
        /// What happened.
        why: String,
    },
    /// The checkpoint the election's service names as the job's latest is
    /// not where this driver would restore from.
    #[error("{service} names {checkpoint} ({directory}) as the job's latest, but {found}; restoring would lose what that checkpoint committed, so this driver does not run the job (point --checkpoint-dir at the job's checkpoints, or delete {service}'s pointer to start over)")]
    LatestCheckpointMissing {
        /// Where the pointer is kept.
        service: String,
        /// The checkpoint it names.
        checkpoint: CheckpointId,
        /// The job directory it names.
        directory: String,
        /// What this driver found instead.
        found: String,
    },
}
