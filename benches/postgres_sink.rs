//! What the exactly-once PostgreSQL sink writes, side by side in one run
//! against one server: wordcount (p=2, `--emit updates`, so every record
//! is a row upserted) through the sink with 1 s checkpoints, against the
//! same rows upserted by two connections of this process in autocommit,
//! one statement per row (what a plain client does) and one statement per
//! 8,192 rows (the sink's batching without its transactions).
//!
//! TIDEMARK_BENCH_POSTGRES=postgres://postgres@127.0.0.1:5432/postgres cargo bench --bench postgres_sink
//!
//! The server needs `max_prepared_transactions` > 0. `TIDEMARK_BENCH_RECORDS`
//! (default 2,000,000) and `TIDEMARK_BENCH_REPS` (default 3) change the
//! size; the one-row-per-statement baseline writes a tenth of the records.

mod common;

use common::{env_or, median};
use std::collections::HashMap;
use std::time::Instant;
use tidemark_cli::{self as cli, RunArgs};

const KEYS: u64 = 100_000;
const BATCH: usize = 8192;

/// The sink's rows/s: wordcount's updates into `table`.
fn sink(url: &str, table: &str, records: u64) -> f64 {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let client = connect(url).await;
        let drop = format!("DROP TABLE IF EXISTS {table}");
        client.batch_execute(&drop).await.expect("dropped");
    });
    let dir = tempfile::tempdir().expect("a temporary directory");
    let args = vec![
        "wordcount".to_string(),
        format!("--records={records}"),
        format!("--keys={KEYS}"),
        "--parallelism=2".into(),
        "--emit=updates".into(),
        "--checkpoint-interval=1s".into(),
        format!("--checkpoint-dir={}", dir.path().display()),
        format!("--sink={url}?table={table}&mode=upsert"),
    ];
    let report = cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("wordcount runs");
    report.throughput_rps
}

/// Wordcount's updates, `(key, count)`, split over two writers by key as
/// its two sink subtasks get them.
fn updates(records: u64) -> [Vec<(i64, i64)>; 2] {
    let mut counts: HashMap<u64, i64> = HashMap::new();
    let mut out = [Vec::new(), Vec::new()];
    for i in 0..records {
        let key = tidemark::model::rng::splitmix64(i) % KEYS;
        let count = counts.entry(key).or_insert(0);
        *count += 1;
        out[(key % 2) as usize].push((key as i64, *count));
    }
    out
}

/// Rows/s of two connections upserting `rows` in autocommit, `batch` rows
/// per statement.
fn autocommit(url: &str, table: &str, rows: [Vec<(i64, i64)>; 2], batch: usize) -> f64 {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let setup = connect(url).await;
        setup
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (key bigint PRIMARY KEY, count bigint NOT NULL)"
            ))
            .await
            .expect("the table");
        let total: usize = rows.iter().map(Vec::len).sum();
        let start = Instant::now();
        let writers = rows.map(|rows| {
            let (url, table) = (url.to_owned(), table.to_owned());
            tokio::spawn(async move {
                let client = connect(&url).await;
                let upsert = client
                    .prepare(&format!(
                        "INSERT INTO {table} (key, count) SELECT * FROM UNNEST($1::bigint[], $2::bigint[]) ON CONFLICT (key) DO UPDATE SET count = EXCLUDED.count"
                    ))
                    .await
                    .expect("the statement");
                for chunk in rows.chunks(batch) {
                    // One statement may not update a row twice: the latest
                    // of each key, as the sink keeps.
                    let latest: HashMap<i64, i64> = chunk.iter().copied().collect();
                    let (keys, counts): (Vec<i64>, Vec<i64>) = latest.into_iter().unzip();
                    client.execute(&upsert, &[&keys, &counts]).await.expect("upserted");
                }
            })
        });
        for writer in writers {
            writer.await.expect("the writer");
        }
        total as f64 / start.elapsed().as_secs_f64()
    })
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the server answers");
    tokio::spawn(connection);
    client
}

fn main() {
    let Ok(url) = std::env::var("TIDEMARK_BENCH_POSTGRES") else {
        eprintln!("set TIDEMARK_BENCH_POSTGRES=postgres://USER@HOST:PORT/DB (max_prepared_transactions > 0)");
        return;
    };
    let records = env_or("TIDEMARK_BENCH_RECORDS", 2_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let (mut sinks, mut batched, mut single) = (vec![], vec![], vec![]);
    for _ in 0..reps {
        sinks.push(sink(&url, "bench_sink", records));
        batched.push(autocommit(&url, "bench_batched", updates(records), BATCH));
        single.push(autocommit(&url, "bench_single", updates(records / 10), 1));
    }
    let (sinks, batched, single) = (median(sinks), median(batched), median(single));
    println!(
        "PostgreSQL upserts, {records} wordcount updates over {KEYS} keys, p=2, {reps} runs each (medians)"
    );
    println!(
        "exactly-once sink, 1 s checkpoints: {:.0} rows/s; autocommit one row per statement: {:.0} rows/s (ratio {:.2}); autocommit {BATCH} rows per statement: {:.0} rows/s (ratio {:.2})",
        sinks,
        single,
        sinks / single,
        batched,
        sinks / batched
    );
}
