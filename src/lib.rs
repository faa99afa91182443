//! Tidemark in one dependency: a fault-tolerant stream runtime with Flink's
//! checkpointing, as an actix actor system an application embeds.
//!
//! This crate only gathers the others, so that an application names one:
//! the IO-free core (`tidemark-core`: the checkpoint protocol's state
//! machines, the job model and builder, time, keyed state), checkpoint
//! storage over `object_store` ([`storage`], `tidemark-storage`) and the
//! actix runtime that runs jobs (`tidemark-actors`, with its prelude).
//! Paths such as `tidemark::checkpoint::CheckpointConfig` are the core's.
//!
//! Features, both on by default: `rocksdb` (the RocksDB state backend,
//! which compiles RocksDB's C++) and `s3` (`s3://` checkpoint storage, with
//! object_store's S3 client and HTTP stack). An application that keeps its
//! state on the heap and its checkpoints in local files or in memory
//! depends on `tidemark` with `default-features = false` and compiles
//! neither RocksDB nor an HTTP client.

pub use tidemark_actors as actors;
pub use tidemark_connectors as connectors;
pub use tidemark_core::*;
/// RocksDB as the embedded store of keyed state (`rocksdb` feature).
#[cfg(feature = "rocksdb")]
pub use tidemark_rocksdb as rocksdb;
pub use tidemark_storage as storage;

/// README.md's Rust snippets, compiled (and run unless marked `no_run`) as
/// doc tests, so that the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/jobs.md's Rust snippets, doc tests as README.md's are.
#[cfg(doctest)]
#[doc = include_str!("../docs/jobs.md")]
pub struct JobsDocDoctests;

/// docs/configuration.md's Rust snippets, doc tests as README.md's are.
#[cfg(doctest)]
#[doc = include_str!("../docs/configuration.md")]
pub struct ConfigurationDocDoctests;
