//! Checkpoints over the data plane: the coordinator actor, the shell of the
//! core's `JobCheckpoints` that triggers the subtasks and collects their
//! acknowledgements, and the reading of what an attempt restores from.

pub mod coordinator;
pub mod restore;
