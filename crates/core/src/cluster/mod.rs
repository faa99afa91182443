//! How a job runs as a whole: its lifecycle ([`lifecycle::JobLifecycle`]:
//! booting, deploying, running, restarting, finished), restart
//! strategies, failure-injection schedules, which attempt a worker
//! process hosts and which links it takes, the frames of links between
//! workers, the rules of leader election between a job's drivers and
//! of rescaling a running job.

pub mod attempts;
pub mod election;
pub mod fault;
pub mod lifecycle;
pub mod links;
pub mod rescale;
pub mod restart;
pub mod wire;
