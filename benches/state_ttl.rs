//! State TTL: what it costs and what it saves.
//!
//! - Throughput: `run wordcount` with `--state-ttl=1h` (every count
//!   stamped, none expiring) against without, side by side, on the heap and
//!   on RocksDB, interleaved, each run in a child process.
//! - Size: a state of `TIDEMARK_BENCH_KEYS` keys (default 10,000,000) with
//!   a TTL, 90 % of which expire: the bytes of a full heap snapshot, and
//!   the SST files a RocksDB checkpoint references before and after a
//!   compaction, against the state before any expired.
//!
//! cargo bench --bench state_ttl
//!
//! `TIDEMARK_BENCH_RECORDS` (default 20,000,000) and `TIDEMARK_BENCH_REPS`
//! (default 3) set the wordcount runs, whose medians are printed.

mod common;

use common::{env_or, median, run_in_child};
use std::time::Duration;
use tidemark::dataflow::task::KeyedSnapshot;
use tidemark::model::ids::{CheckpointId, SubtaskIndex};
use tidemark::model::key_group::KeyGroupRange;
use tidemark::state::{KeyedContext, KeyedStateBackend, StateRegistrar, StateTtlConfig};
use tidemark::StateBackend;

/// Records/s of wordcount on `state`, with `ttl` if any.
fn wordcount(records: u64, state: &str, ttl: Option<&str>) -> f64 {
    let mut args = vec![
        "wordcount".to_string(),
        format!("--records={records}"),
        "--keys=1000000".into(),
        "--parallelism=2".into(),
        "--checkpoint-interval=off".into(),
        format!("--state={state}"),
        "--json".into(),
    ];
    args.extend(ttl.map(|ttl| format!("--state-ttl={ttl}")));
    let run = run_in_child(&args);
    run.number("/records_in") / run.number("/elapsed_s")
}

/// The bytes a snapshot of `backend` holds: a heap snapshot encoded, or
/// the SST files of a native checkpoint.
fn snapshot_bytes(backend: &mut KeyedStateBackend<u64>, id: u64) -> u64 {
    match backend.snapshot(CheckpointId(id)).expect("a snapshot") {
        KeyedSnapshot::Heap(snapshot) => {
            let mut out = Vec::new();
            snapshot.write(&mut out);
            out.len() as u64
        }
        KeyedSnapshot::Native(pending) => {
            let native = pending.wait().expect("the native checkpoint is made");
            std::fs::remove_dir_all(&native.dir).expect("the checkpoint's directory");
            native
                .files
                .iter()
                .filter(|f| f.is_shared())
                .map(|f| f.size)
                .sum()
        }
    }
}

/// Snapshot bytes of `keys` counts with a 1 s TTL: all live, then with
/// 90 % expired, then (RocksDB) after a compaction.
fn sizes(config: &StateBackend, keys: u64) -> [u64; 3] {
    let range = KeyGroupRange::for_subtask(128, 1, SubtaskIndex(0));
    let mut backend = KeyedStateBackend::new(config, "bench", range, 128);
    let ttl = StateTtlConfig::new(Duration::from_secs(1)).cleanup_incrementally(0);
    // A value state: a reducing state's adds to keys its cache misses are
    // merge operands, and a value a compaction merges is filtered by the
    // next compaction only.
    let count = StateRegistrar::new(&mut backend).value_with_ttl::<u64>("count", ttl);
    let add = |backend: &mut KeyedStateBackend<u64>, keys: std::ops::Range<u64>| {
        for key in keys {
            *KeyedContext::new(backend, &key)
                .value(&count)
                .get_or_default() += 1;
        }
    };
    backend.set_time(1_000);
    add(&mut backend, 0..keys);
    backend.set_time(1_500);
    add(&mut backend, 0..keys / 10);
    let live = snapshot_bytes(&mut backend, 1);
    backend.set_time(2_100);
    let expired = snapshot_bytes(&mut backend, 2);
    let compacted = match &mut backend {
        KeyedStateBackend::Embedded(rocks) => {
            rocks.compact().expect("a compaction");
            snapshot_bytes(&mut backend, 3)
        }
        KeyedStateBackend::Heap(_) => expired,
    };
    [live, expired, compacted]
}

fn main() {
    if common::child_runs() {
        return;
    }
    let records = env_or("TIDEMARK_BENCH_RECORDS", 20_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let keys = env_or("TIDEMARK_BENCH_KEYS", 10_000_000);
    println!("wordcount, {records} records, 1,000,000 keys, p=2, {reps} rounds, medians");
    println!("| state | without TTL, records/s | --state-ttl=1h, records/s | ratio |");
    println!("| --- | --- | --- | --- |");
    for state in ["heap", "rocksdb"] {
        let (mut without, mut with) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            without.push(wordcount(records, state, None));
            with.push(wordcount(records, state, Some("1h")));
        }
        let (without, with) = (median(without), median(with));
        println!(
            "| {state} | {without:.0} | {with:.0} | {:.2}x |",
            with / without
        );
    }
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    println!();
    println!("a snapshot of {keys} counts with a TTL, 90 % of them expired");
    println!("| state | all live, MiB | 90 % expired, MiB | after compaction, MiB | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    let local = tempfile::tempdir().expect("a temporary directory");
    let rocks = tidemark::rocksdb::RocksDb::backend(Some(local.path().to_owned()), None);
    for (name, config) in [("heap", StateBackend::Heap), ("rocksdb", rocks)] {
        let [live, expired, compacted] = sizes(&config, keys);
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.2}x |",
            mib(live),
            mib(expired),
            mib(compacted),
            compacted as f64 / live as f64
        );
    }
}
