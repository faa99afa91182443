//! The enrich topology, Flink's async I/O: wordcount's generated records,
//! each enriched by a request to an HTTP service with many requests in
//! flight, and a sink of `index,key,value` lines. Without `--service`, the
//! topology starts its own service (actix-web, on a loopback port of the
//! process), which answers `GET /enrich/KEY?record=INDEX` with
//! [`value_of`]`(KEY)`.

use crate::sinks::{sink_into, Target};
use crate::topologies::wordcount::{Generator, Keys, Records};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use tidemark_connectors::rows::{Column, Row, SqlField, SqlType, Value};
use tidemark_core::dataflow::async_io::{AsyncFunction, AsyncWait, LocalFuture};
use tidemark_core::job::JobConfig;
use tidemark_core::model::rng::splitmix64;
use tidemark_core::{Job, UserError};

/// The job's name, from which its id and checkpoint directory follow.
pub const JOB_NAME: &str = "enrich";

/// What the service answers for `key`.
pub fn value_of(key: u64) -> u64 {
    splitmix64(key ^ 0x656e_7269_6368) % 1_000_000
}

/// A generated record: its index and wordcount's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Numbered {
    /// Record i of the input.
    pub index: u64,
    /// Its key.
    pub key: u64,
}

/// The records of [`Keys`] with their indices.
#[derive(Clone, Copy, Debug)]
pub struct NumberedKeys(pub Keys);

impl Records for NumberedKeys {
    type Record = Numbered;
    fn record(&self, i: u64) -> Numbered {
        Numbered {
            index: i,
            key: self.0.record(i),
        }
    }
}

/// A record with what the service answered for its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enriched {
    /// The record's index.
    pub index: u64,
    /// Its key.
    pub key: u64,
    /// The service's answer.
    pub value: u64,
}

/// Columns `index`, `key` and `value`; the index is the key in upsert
/// mode.
impl Row for Enriched {
    fn columns() -> Vec<Column> {
        let column = |name, sql_type| Column { name, sql_type };
        vec![
            column("index", SqlType::BigInt),
            column("key", SqlType::BigInt),
            column("value", SqlType::BigInt),
        ]
    }

    fn key_columns() -> usize {
        1
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        out.push(self.index.value()?);
        out.push(self.key.value()?);
        out.push(self.value.value()?);
        Ok(())
    }
}

/// Requests a record's value from the service.
pub struct Lookup {
    client: reqwest::Client,
    service: String,
}

impl Lookup {
    /// A client of `service` (`http://HOST:PORT`).
    pub fn new(service: &str) -> Self {
        Lookup {
            client: reqwest::Client::new(),
            service: service.trim_end_matches('/').to_owned(),
        }
    }
}

impl AsyncFunction<Numbered, Enriched> for Lookup {
    fn invoke(&self, record: Numbered) -> LocalFuture<Result<Vec<Enriched>, UserError>> {
        // The record's index names the request, for the service's logs.
        let url = format!(
            "{}/enrich/{}?record={}",
            self.service, record.key, record.index
        );
        let request = self.client.get(url);
        Box::pin(async move {
            let response = request.send().await?.error_for_status()?;
            let value = response.text().await?.trim().parse()?;
            Ok(vec![Enriched {
                index: record.index,
                key: record.key,
                value,
            }])
        })
    }
}

/// The enrich topology's parameters: generator → async requests → sink.
#[derive(Clone, Debug)]
pub struct Enrich {
    /// Records generated over all source subtasks.
    pub records: u64,
    /// Wordcount's keys.
    pub keys: Keys,
    /// The service, `http://HOST:PORT`; `None` starts one in the process.
    pub service: Option<String>,
    /// How the requests are made.
    pub settings: AsyncWait,
    /// Where the enriched records go.
    pub sink: Target,
}

impl Enrich {
    /// The job, named [`JOB_NAME`], with operator uids `generator` and
    /// `enrich` (what savepoints match).
    pub fn job(&self, config: JobConfig) -> Result<Job, std::io::Error> {
        let service = match &self.service {
            Some(url) => url.clone(),
            None => service()?,
        };
        let enriched = Job::builder(JOB_NAME)
            .config(config)
            .split_source(
                "generator",
                Generator::of(self.records, NumberedKeys(self.keys)),
            )
            .uid("generator")
            .async_wait("enrich", self.settings, move || Lookup::new(&service))
            .uid("enrich");
        Ok(sink_into(enriched, &self.sink))
    }
}

/// The process's own service, started on first use: its URL.
pub fn service() -> Result<String, std::io::Error> {
    static SERVICE: OnceLock<String> = OnceLock::new();
    if let Some(url) = SERVICE.get() {
        return Ok(url.clone());
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let serve = move || -> std::io::Result<()> {
        actix_web::rt::System::new().block_on(
            actix_web::HttpServer::new(|| {
                actix_web::App::new().route("/enrich/{key}", actix_web::web::get().to(answer))
            })
            .workers(1)
            .listen(listener)?
            .run(),
        )
    };
    std::thread::Builder::new()
        .name("enrich-service".into())
        .spawn(move || {
            if let Err(e) = serve() {
                tracing::error!("the enrich service stopped: {e}");
            }
        })?;
    Ok(SERVICE.get_or_init(|| url).clone())
}

/// `GET /enrich/KEY`: [`value_of`]`(KEY)`.
async fn answer(key: actix_web::web::Path<u64>) -> String {
    value_of(key.into_inner()).to_string()
}
