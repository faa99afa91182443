//! Where `tidemark run`'s topologies write (`--sink`): discard, files of
//! any store, PostgreSQL or Kafka, through the connectors crate.

use std::sync::Arc;
use tidemark_actors::sinks::Discard;
use tidemark_connectors::files::sink::{FileSink, FileSinkConfig};
#[cfg(feature = "kafka")]
use tidemark_connectors::kafka::{KafkaSink, KafkaSinkOptions};
#[cfg(feature = "postgres")]
use tidemark_connectors::postgres::{PostgresOptions, PostgresSink};
use tidemark_connectors::rows::Row;
use tidemark_core::{Data, Job, Stream};

/// Where a topology's exactly-once files go: a directory of any store, and
/// the run that names them (the same in every process of one run, so that
/// a relaunched worker recognises what its predecessor left).
#[derive(Clone, Debug)]
pub struct Output {
    /// The directory and the files' format.
    pub config: FileSinkConfig,
    /// The run's part of the file names.
    pub run: String,
}

/// Where a topology's results go (`--sink`).
#[derive(Clone, Debug, Default)]
pub enum Target {
    /// Nowhere: [`Discard`].
    #[default]
    Discard,
    /// Exactly-once files ([`FileSink`]).
    Files(Output),
    /// An exactly-once PostgreSQL table ([`PostgresSink`]).
    #[cfg(feature = "postgres")]
    Postgres(Arc<PostgresOptions>),
    /// A Kafka topic, at least or exactly once ([`KafkaSink`]).
    #[cfg(feature = "kafka")]
    Kafka(Arc<KafkaSinkOptions>),
}

impl Target {
    /// `discard`; `postgres://…?table=NAME[&mode=upsert|append]`;
    /// `kafka://HOST:PORT/TOPIC[?delivery=exactly-once]`; or a
    /// directory of files (a path, `file://`, `s3://` or `memory://`, with
    /// [`FileSinkConfig::from_url`]'s options), named after the run `run`.
    pub fn from_url(url: &str, run: &str) -> Result<Self, String> {
        if url == "discard" {
            return Ok(Target::Discard);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            return Ok(Target::Postgres(Arc::new(
                url.parse().map_err(|e| format!("{e}"))?,
            )));
            #[cfg(not(feature = "postgres"))]
            return Err(
                "this tidemark was built without PostgreSQL (cargo feature `postgres`)".into(),
            );
        }
        if url.starts_with("kafka://") {
            #[cfg(feature = "kafka")]
            return Ok(Target::Kafka(Arc::new(
                KafkaSinkOptions::from_url(url).map_err(|e| e.to_string())?,
            )));
            #[cfg(not(feature = "kafka"))]
            return Err("this tidemark was built without Kafka (cargo feature `kafka`)".into());
        }
        if let Some((scheme, _)) = url
            .split_once("://")
            .filter(|(s, _)| !["file", "s3", "memory"].contains(s))
        {
            return Err(format!(
                "a sink is discard, postgres://, kafka://, a directory, file://, s3:// or memory://; {scheme}:// is not supported yet"
            ));
        }
        Ok(Target::Files(Output {
            config: FileSinkConfig::from_url(url).map_err(|e| e.to_string())?,
            run: run.to_owned(),
        }))
    }
}

/// Ends `stream` in `target`: the example topologies' sinks.
pub fn sink_into<T>(stream: Stream<T>, target: &Target) -> Job
where
    T: Data + Row,
{
    match target {
        Target::Discard => stream.sink("discard", |_| Discard),
        Target::Files(Output { config, run }) => {
            let (config, run) = (config.clone(), run.clone());
            stream.sink("files", move |ctx| FileSink::new(&config, &run, ctx))
        }
        #[cfg(feature = "postgres")]
        Target::Postgres(options) => {
            let options = options.clone();
            stream.sink("postgres", move |ctx| {
                PostgresSink::new(options.clone(), ctx)
            })
        }
        #[cfg(feature = "kafka")]
        Target::Kafka(options) => {
            let options = options.clone();
            stream.sink("kafka", move |ctx| KafkaSink::new(options.clone(), ctx))
        }
    }
    .build()
}

/// Names the output files of a new run after the current time, so that
/// processes writing into one directory do not collide.
pub fn run_name() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}
