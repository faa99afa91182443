//! Connectors: where a job's records come from and go to outside it.
//!
//! - [`files`]: files on any object store (a local directory, `s3://`,
//!   an in-memory or registered store), read by a split source: each file,
//!   or byte range of a large one, is a split read exactly once across
//!   failures, restarts and rescales.
//! - [`kafka`]: a topic's partitions as splits, and a sink that delivers
//!   at least once or, by transactions, exactly once.
//! - [`postgres`]: an exactly-once sink into a PostgreSQL table, by
//!   two-phase commit (prepared transactions), in upsert or append mode.
//! - [`rows`]: records as rows of a table, with every feature or none.
//!
//! Each system is a cargo feature, so that an embedding that needs none
//! compiles none of them.

#[cfg(feature = "files")]
pub mod files;
#[cfg(any(feature = "files", feature = "kafka", feature = "postgres"))]
mod io;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod rows;
