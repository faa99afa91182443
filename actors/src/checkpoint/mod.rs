//! Checkpoints over the data plane: the coordinator actor, the shell of the
//! core's `JobCheckpoints` that triggers the subtasks and collects their
//! acknowledgements, the user's master hooks it runs, and the reading of
//! what an attempt restores from.

pub mod coordinator;
pub mod hooks;
pub mod restore;
