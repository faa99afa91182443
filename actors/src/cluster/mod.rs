//! Running a job's attempts, in this process or over worker processes: the
//! supervisor that deploys, watches and restarts them, the building of a
//! process's share of subtasks, the driver's side of worker processes and
//! the worker's own, and leader election among drivers. What travels
//! between driver and workers (`control`) sits at the top, below the data
//! plane, whose subtask handles send commands through it.

pub mod deploy;
pub mod election;
pub mod remote;
pub mod supervisor;
pub mod worker;
