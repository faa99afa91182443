//! The example topologies of `tidemark run`: keyed counting, event-time
//! windows, an interval join, over generated records, files or Kafka,
//! rules broadcast to a keyed count, and records enriched by an HTTP
//! service through async requests.

pub mod enrich;
pub mod join;
pub mod rules;
pub mod windows;
pub mod wordcount;
