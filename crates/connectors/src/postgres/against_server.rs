//! The sink against a real PostgreSQL server (`cargo xtask test` starts
//! one and sets `TIDEMARK_TEST_POSTGRES`), driven call by call as a sink
//! subtask's checkpoints drive it, with crashes as dropped sinks.

use super::*;
use std::sync::Arc;
use tidemark_core::model::ids::{CheckpointId, SubtaskIndex};
use tidemark_core::{Sink, SinkContext};

/// The server's URL in `var`; `None` skips the test, unless
/// `TIDEMARK_REQUIRE_POSTGRES` says the PostgreSQL cases must run.
fn server(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) => Some(url),
        Err(_) => {
            let required =
                std::env::var("TIDEMARK_REQUIRE_POSTGRES").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "TIDEMARK_REQUIRE_POSTGRES is set but {var} is not"
            );
            eprintln!("skipped: {var} is not set (cargo xtask test sets it)");
            None
        }
    }
}

fn options(url: &str, table: &str, mode: &str) -> Arc<PostgresOptions> {
    // A lock wait the sink should never get into fails the test instead
    // of hanging it.
    let url = format!("{url}?table={table}&mode={mode}&options=-c%20lock_timeout%3D10s");
    Arc::new(url.parse().unwrap())
}

fn sink(
    options: &Arc<PostgresOptions>,
    subtask: u32,
    parallelism: u32,
) -> PostgresSink<(String, u64)> {
    PostgresSink::new(
        options.clone(),
        SinkContext {
            subtask: SubtaskIndex(subtask),
            parallelism,
            attempt: tidemark_core::model::ids::Attempt::default(),
        },
    )
}

fn write(sink: &mut PostgresSink<(String, u64)>, rows: &[(&str, u64)]) {
    let mut records = rows.iter().map(|(k, c)| (k.to_string(), *c)).collect();
    sink.write(&mut records).unwrap();
}

/// A client of the server, to look at what readers see.
struct Reader {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Reader {
    /// Connects, and drops what an earlier run of the test left of `table`
    /// and its sink's transactions.
    fn new(url: &str, table: &str) -> Self {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let client = runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client
        });
        let reader = Reader { runtime, client };
        for name in reader.prepared(table) {
            reader.execute(&format!("ROLLBACK PREPARED '{name}'"));
        }
        reader.execute(&format!("DROP TABLE IF EXISTS {table}"));
        reader
    }

    fn execute(&self, statement: &str) {
        self.runtime
            .block_on(self.client.batch_execute(statement))
            .unwrap();
    }

    /// Committed rows, sorted.
    fn rows(&self, table: &str) -> Vec<(String, i64)> {
        let query = format!("SELECT key, count FROM {table} ORDER BY key, count");
        let rows = self
            .runtime
            .block_on(self.client.query(&query, &[]))
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }

    /// The prepared transactions of the sink of `table`.
    fn prepared(&self, table: &str) -> Vec<String> {
        let rows = self
            .runtime
            .block_on(self.client.query(
                "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, $1) ORDER BY gid",
                &[&format!("tidemark-postgres-{table}:")],
            ))
            .unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }
}

fn expect(rows: &[(&str, i64)]) -> Vec<(String, i64)> {
    rows.iter().map(|(k, c)| (k.to_string(), *c)).collect()
}

#[test]
fn rows_appear_only_when_their_checkpoint_completes() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    let table = "appear_at_commit";
    let reader = Reader::new(&url, table);
    let options = options(&url, table, "append");
    let mut s = sink(&options, 0, 1);
    s.restore(None).unwrap();
    write(&mut s, &[("a", 1), ("b", 1)]);
    s.pre_commit(CheckpointId(1)).unwrap();
    write(&mut s, &[("a", 2)]);
    assert_eq!(reader.rows(table), expect(&[]));
    assert_eq!(
        reader.prepared(table),
        [format!("tidemark-postgres-{table}:0:1")]
    );
    s.commit(CheckpointId(1)).unwrap();
    assert_eq!(reader.rows(table), expect(&[("a", 1), ("b", 1)]));
    assert!(reader.prepared(table).is_empty());
    s.finish().unwrap();
    assert_eq!(reader.rows(table), expect(&[("a", 1), ("a", 2), ("b", 1)]));
}

#[test]
fn a_restore_commits_its_checkpoint_and_rolls_back_newer_transactions() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    let table = "restore_resolves";
    let reader = Reader::new(&url, table);
    let options = options(&url, table, "append");
    let mut crashed = sink(&options, 0, 1);
    crashed.restore(None).unwrap();
    write(&mut crashed, &[("a", 1)]);
    let state = crashed.pre_commit(CheckpointId(1)).unwrap();
    write(&mut crashed, &[("a", 2)]);
    crashed.pre_commit(CheckpointId(2)).unwrap();
    write(&mut crashed, &[("a", 3)]);
    drop(crashed);
    assert_eq!(reader.prepared(table).len(), 2);

    let mut restored = sink(&options, 0, 1);
    restored.restore(Some(&state)).unwrap();
    assert_eq!(reader.rows(table), expect(&[("a", 1)]));
    assert!(reader.prepared(table).is_empty());
    // A second restore from the same checkpoint finds nothing to do.
    sink(&options, 0, 1).restore(Some(&state)).unwrap();
    // A fresh start rolls back what a run left prepared.
    write(&mut restored, &[("b", 1)]);
    restored.pre_commit(CheckpointId(2)).unwrap();
    sink(&options, 0, 1).restore(None).unwrap();
    assert!(reader.prepared(table).is_empty());
    assert_eq!(reader.rows(table), expect(&[("a", 1)]));
}

#[test]
fn a_rescale_to_one_subtask_commits_the_removed_subtasks_transactions() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    let table = "rescale_resolves";
    let reader = Reader::new(&url, table);
    let options = options(&url, table, "append");
    let mut states = Vec::new();
    for subtask in 0..2 {
        let mut s = sink(&options, subtask, 2);
        s.restore(None).unwrap();
        write(&mut s, &[(&format!("k{subtask}"), 1)]);
        states.push(s.pre_commit(CheckpointId(4)).unwrap());
        write(&mut s, &[(&format!("k{subtask}"), 2)]);
        s.pre_commit(CheckpointId(5)).unwrap();
    }
    let mut one = sink(&options, 0, 1);
    one.restore(Some(&states[0])).unwrap();
    one.adopt(&states[1]).unwrap();
    assert_eq!(reader.rows(table), expect(&[("k0", 1), ("k1", 1)]));
    assert!(reader.prepared(table).is_empty());
}

#[test]
fn upsert_rows_behind_a_prepared_transaction_wait_and_survive_in_the_checkpoint() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    let table = "upsert_holds";
    let reader = Reader::new(&url, table);
    let options = options(&url, table, "upsert");
    let mut s = sink(&options, 0, 1);
    s.restore(None).unwrap();
    write(&mut s, &[("a", 1), ("b", 1), ("a", 2)]);
    s.pre_commit(CheckpointId(1)).unwrap();
    // Checkpoint 2's barrier comes before 1 completes: `a` is locked by
    // the prepared transaction, so its rows wait, into the checkpoint.
    write(&mut s, &[("a", 3)]);
    let held = s.pre_commit(CheckpointId(2)).unwrap();
    s.commit(CheckpointId(1)).unwrap();
    assert_eq!(reader.rows(table), expect(&[("a", 2), ("b", 1)]));
    write(&mut s, &[("b", 2)]);
    drop(s);

    // Restored from checkpoint 2, whose rows the sink held.
    let mut restored = sink(&options, 0, 1);
    restored.restore(Some(&held)).unwrap();
    assert_eq!(reader.rows(table), expect(&[("a", 3), ("b", 1)]));
    write(&mut restored, &[("b", 2)]);
    restored.finish().unwrap();
    assert_eq!(reader.rows(table), expect(&[("a", 3), ("b", 2)]));
    assert!(reader.prepared(table).is_empty());
}

#[test]
fn a_server_without_prepared_transactions_is_refused_naming_the_setting() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES_STOCK") else {
        return;
    };
    let options = options(&url, "refused", "upsert");
    let error = sink(&options, 0, 1).restore(None).unwrap_err().to_string();
    assert!(error.contains("max_prepared_transactions is 0"), "{error}");
    assert!(error.contains("127.0.0.1"), "{error}");
}

#[test]
fn an_unreachable_server_is_an_error_naming_it() {
    let options = Arc::new(
        "postgres://postgres@127.0.0.1:1/postgres?table=t&connect_timeout=5"
            .parse::<PostgresOptions>()
            .unwrap(),
    );
    let error = sink(&options, 0, 1).restore(None).unwrap_err().to_string();
    assert!(
        error.starts_with("cannot connect (PostgreSQL 127.0.0.1:1/postgres"),
        "{error}"
    );
}
