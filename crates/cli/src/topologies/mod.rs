//! The example topologies of `tidemark run`: keyed counting, event-time
//! windows and an interval join, over generated records, files or Kafka.

pub mod join;
pub mod windows;
pub mod wordcount;
