#![warn(missing_docs)]
//! Tidemark's actix shells. This crate owns everything that needs threads,
//! mailboxes or a clock: the subtask, channel-endpoint and job-supervisor
//! actors, the runtime that spreads them over a pool of arbiters, the job
//! handle, worker processes, REST and metrics. The `tidemark` command line
//! and its example topologies are the `tidemark-cli` crate. Every
//! decision of the protocols lives in the core crate, `tidemark-core`; the actors
//! feed its state machines and carry out what they return.
//!
//! Features `rocksdb` and `s3` (both default) forward to the core crate's:
//! without them the runtime runs heap state on local or in-memory storage
//! and compiles neither RocksDB nor an HTTP client.
//!
//! ```no_run
//! use tidemark_actors::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let numbers = std::sync::Arc::new((0..1000u64).collect::<Vec<_>>());
//! let report = Job::builder("doubles")
//!     .source("numbers", move |ctx| tidemark_core::dataflow::source::Items::new(numbers.clone(), ctx))
//!     .map(|n: u64| n * 2)
//!     .sink("print", |_| tidemark_actors::sinks::Discard)
//!     .build()
//!     .run()?
//!     .wait()?;
//! println!("{} records", report.records_in);
//! # Ok(()) }
//! ```

mod checkpoint;
mod clock;
mod cluster;
mod control;
mod dataflow;
pub mod http;
mod job;
mod messages;
pub mod metrics;
pub mod runtime;
pub mod sinks;
pub mod tls;

pub use cluster::remote::{Distributed, WorkerSet};
pub use cluster::{election, worker};
pub use runtime::{JobControl, JobError, JobHandle, JobReport, RunJob, Runtime, Savepoint};

/// What an embedding application needs in scope.
pub mod prelude {
    pub use crate::runtime::{JobHandle, RunJob, Runtime};
    pub use tidemark_core::{
        AllKeys, BroadcastContext, BroadcastProcessFunction, BroadcastStates, Collector, Job,
        KeyedBroadcastProcessFunction, KeyedContext, KeyedProcessFunction, MapStateDescriptor,
        ReduceFunction, ReducingState, Sink, SinkContext, Source, SourceContext, SourceStatus,
        StateRegistrar, UserError, ValueState,
    };
}
