//! Tidemark's core: everything about running a fault-tolerant stream job
//! short of actors, threads and timers.
//!
//! The checkpoint protocol lives in [`checkpoint`], pure
//! and deterministic: the coordinator ([`checkpoint::coordinator`]) and the
//! barrier handler ([`checkpoint::barrier`]) are state machines that take an
//! event and the current time and return actions; the shared-state registry
//! ([`checkpoint::shared`]), the file-merging planner
//! ([`checkpoint::merging`]), restore planning ([`checkpoint::restore`]), the
//! `_metadata` format ([`checkpoint::metadata`]) and the savepoint plan
//! ([`checkpoint::savepoint`]) decide from their inputs alone. Around them,
//! equally free of IO: the model (ids, the [`graph::JobGraph`], key groups,
//! batches and channel events), credit-based flow control and the input
//! gate, the typed job builder ([`job`]) and the operator chains it
//! produces, keyed state on the heap, restart strategies,
//! failure-injection schedules and the rules of leader election between a
//! job's drivers ([`election`]).
//!
//! Keyed state lives on the heap ([`state`]) or in an embedded store
//! behind a typed write-back cache; the store itself (RocksDB) is the
//! `tidemark-rocksdb` crate's, reached through the object-safe traits of
//! [`state::store`].
//!
//! It depends on no async runtime, object store, database, actor system or
//! HTTP stack (`tests/layering.rs` holds it to that); what it still reads
//! of the host is the clock for unique tokens (`rng::unique_token`) and the
//! parallelism in `JobConfig::default`. Checkpoint storage over `object_store` is `tidemark-storage`;
//! the `tidemark-actors` crate wraps each state machine in an actix actor,
//! arms its timers, moves its messages and runs the storage IO.

#![warn(missing_docs)]

pub mod attempts;
pub mod batch;
pub mod channel;
pub mod checkpoint;
pub mod election;
pub mod error;
pub mod event;
pub mod fault;
pub mod gate;
pub mod graph;
pub mod ids;
pub mod job;
pub mod key_group;
pub mod key_hash;
pub mod lifecycle;
pub mod operator;
pub mod rate;
pub mod restart;
pub mod rng;
pub mod sink;
pub mod source;
pub mod split;
pub mod state;
pub mod task;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod time;
pub mod two_input;
pub mod wire;

pub use batch::{Batch, BatchLimits, Data};
pub use checkpoint::coordinator::MasterHook;
pub use error::{TaskError, UserError};
pub use job::{Job, JobBuilder, JobConfig, KeyedStream, Stream};
pub use operator::{Collector, KeyedProcessFunction};
pub use sink::{Sink, SinkContext};
pub use source::{Source, SourceContext, SourceStatus};
pub use state::{
    AllKeys, Key, KeyedContext, ListState, MapState, ReduceFunction, Reducing, ReducingState,
    SingleValue, StateBackend, StateRegistrar, ValueState,
};
