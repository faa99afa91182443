//! The example topologies of `tidemark run`: keyed counting, event-time
//! windows, an interval join, over generated records, files or Kafka, and
//! rules broadcast to a keyed count.

pub mod join;
pub mod rules;
pub mod windows;
pub mod wordcount;
