//! Tidemark's core: everything about running a fault-tolerant stream job that
//! can be decided without threads, clocks or sockets. It owns the model (ids,
//! the `JobGraph`, key groups, batches and channel events), the typed job
//! builder and the operator chains it produces, keyed state and its backends,
//! and the protocols as sans-IO state machines: credit-based flow control, the
//! input gate, the checkpoint coordinator and the barrier handler, with the
//! checkpoint formats and storage they hand their results to, restore
//! planning, restart strategies and failure-injection schedules. It does not
//! own actors, timers or threads: the
//! `tidemark-actors` crate wraps each state machine in an actix actor and
//! carries out what it decides.

pub mod batch;
pub mod channel;
pub mod checkpoint;
pub mod error;
pub mod event;
pub mod fault;
pub mod gate;
pub mod graph;
pub mod ids;
pub mod job;
pub mod key_group;
pub mod operator;
pub mod rate;
pub mod restart;
pub mod rng;
pub mod sink;
pub mod source;
pub mod split;
pub mod state;
pub mod storage;
pub mod task;

pub use batch::{Batch, BatchLimits, Data};
pub use checkpoint::coordinator::MasterHook;
pub use error::{TaskError, UserError};
pub use job::{Job, JobBuilder, JobConfig, KeyedStream, Stream};
pub use operator::{Collector, KeyedProcessFunction};
pub use sink::{Sink, SinkContext};
pub use source::{Source, SourceContext, SourceStatus};
pub use state::{
    AllKeys, Key, KeyedContext, ListState, MapState, StateBackend, StateRegistrar, ValueState,
};
