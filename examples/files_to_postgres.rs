//! Embedding Tidemark end to end: read JSON lines of clicks
//! (`{"user": "ada", "ts": 1733400000123}`) from a directory, count each
//! user's clicks in one-second event-time windows, and upsert the counts
//! into a PostgreSQL table exactly once (two-phase commit at every
//! checkpoint; the server needs `max_prepared_transactions` > 0).
//!
//! cargo run --example files_to_postgres -- DIR 'postgres://postgres@127.0.0.1:5432/postgres'
//!
//! The table `clicks_per_second (user_name, window_start, clicks)` is
//! created if absent.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tidemark::checkpoint::CheckpointConfig;
use tidemark::connectors::files::{FileSource, FileSourceOptions, Format};
use tidemark::connectors::postgres::{
    Column, PostgresOptions, PostgresSink, Row, SqlField, SqlType, Value,
};
use tidemark::time::{Count, Timestamped, WatermarkStrategy, WindowAssigner};
use tidemark_actors::prelude::*;

/// A line of the input.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Click {
    user: String,
    ts: u64,
}

impl Timestamped for Click {
    fn timestamp(&self) -> u64 {
        self.ts
    }
}

/// A user's clicks in one window: a row of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ClicksPerSecond {
    user: String,
    window_start: i64,
    clicks: u64,
}

/// The key (user and window) first: upserted on it.
impl Row for ClicksPerSecond {
    fn columns() -> Vec<Column> {
        let column = |name, sql_type| Column { name, sql_type };
        vec![
            column("user_name", SqlType::Text),
            column("window_start", SqlType::BigInt),
            column("clicks", SqlType::BigInt),
        ]
    }

    fn key_columns() -> usize {
        2
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        out.push(self.user.value()?);
        out.push(self.window_start.value()?);
        out.push(self.clicks.value()?);
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, url] = args.as_slice() else {
        return Err("usage: files_to_postgres DIR postgres://USER@HOST:PORT/DB".into());
    };
    let clicks = FileSource::<String>::new(
        dir,
        FileSourceOptions {
            format: Format::JsonLines,
            ..FileSourceOptions::default()
        },
    )?
    .records::<Click>();
    let table: Arc<PostgresOptions> =
        Arc::new(format!("{url}?table=clicks_per_second&mode=upsert").parse()?);
    let checkpoints = std::env::temp_dir().join("tidemark-files-to-postgres");
    let report = Job::builder("files-to-postgres")
        .parallelism(2)
        .checkpointing(
            CheckpointConfig::new(checkpoints.display().to_string())
                .interval(Duration::from_secs(1)),
        )
        .split_source_with_watermarks(
            "clicks",
            WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(500)),
            clicks,
        )
        .key_by(|click: &Click| click.user.clone())
        .window(WindowAssigner::tumbling(Duration::from_secs(1)))
        .aggregate("clicks", Count, |user: &String, window, clicks, out| {
            out.collect(ClicksPerSecond {
                user: user.clone(),
                window_start: window.start,
                clicks,
            })
        })
        .sink("postgres", move |ctx| PostgresSink::new(table.clone(), ctx))
        .build()
        .run()?
        .wait()?;
    println!(
        "{} clicks counted into clicks_per_second",
        report.records_in
    );
    Ok(())
}
