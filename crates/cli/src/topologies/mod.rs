//! The example topologies of `tidemark run`: keyed counting, event-time
//! windows, an interval join, over generated records, files or Kafka,
//! rules broadcast to a keyed count, records enriched by an HTTP service
//! through async requests, and a timer set per record.

pub mod enrich;
pub mod join;
pub mod rules;
pub mod timers;
pub mod windows;
pub mod wordcount;
