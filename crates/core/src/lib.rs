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
//! equally free of IO, in groups that import only downward: [`model`]
//! (ids, the [`model::graph::JobGraph`], key groups, batches and channel
//! events, credit-based flow control and the input gate), [`time`]
//! (watermarks, timers, windows), [`cluster`] (the run's lifecycle,
//! restart strategies, failure-injection schedules, the frames of links
//! between workers and the rules of leader election), [`checkpoint`],
//! [`state`], [`dataflow`] (operators, tasks, sources and sinks) and, on
//! top, the typed job builder ([`job`]).
//!
//! Keyed state lives on the heap ([`state`]) or in an embedded store
//! behind a typed write-back cache; the store itself (RocksDB) is the
//! `tidemark-rocksdb` crate's, reached through the object-safe traits of
//! [`state::store`].
//!
//! It depends on no async runtime, object store, database, actor system or
//! HTTP stack, and reads no fact of the host (clock, entropy, cores, files,
//! environment): callers pass them in (`tests/layering.rs` holds it to
//! both). Checkpoint storage over `object_store` is `tidemark-storage`;
//! the `tidemark-actors` crate wraps each state machine in an actix actor,
//! arms its timers, moves its messages and runs the storage IO.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod cluster;
pub mod dataflow;
pub mod job;
pub mod model;
pub mod state;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod time;

pub use checkpoint::coordinator::MasterHook;
pub use dataflow::broadcast::{BroadcastProcessFunction, KeyedBroadcastProcessFunction};
pub use dataflow::error::{TaskError, UserError};
pub use dataflow::operator::{Collector, KeyedProcessFunction};
pub use dataflow::sink::{Sink, SinkContext};
pub use dataflow::source::{Source, SourceContext, SourceStatus};
pub use job::{Job, JobBuilder, JobConfig, KeyedStream, Stream};
pub use model::batch::{Batch, BatchLimits, Data};
pub use state::{
    AllKeys, BroadcastContext, BroadcastStates, Key, KeyedContext, ListState, MapState,
    MapStateDescriptor, ReduceFunction, Reducing, ReducingState, SingleValue, StateBackend,
    StateRegistrar, StateTtlConfig, StateVisibility, TtlListState, TtlMapState, UpdateType,
    ValueState,
};
