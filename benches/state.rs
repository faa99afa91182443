//! Keyed state throughput of one subtask: the wordcount counter
//! (`get_or_default() += 1` on a `u64` value state), on the heap and on
//! RocksDB, then the synchronous part of a snapshot of what it built and,
//! on the heap, its encoding (the asynchronous part's CPU work).
//!
//! cargo bench --bench state
//!
//! Keys are `splitmix64(i) % keys`, uniform, or skewed: nine records in ten
//! on a hot tenth of a percent of the keys. Set `TIDEMARK_BENCH_RECORDS`
//! (10,000,000) and `TIDEMARK_BENCH_KEYS` (1,000,000) to change the size,
//! and `TIDEMARK_BENCH_CACHE` to a list of RocksDB write-back cache sizes
//! in entries (default: the backend's default, and 1, which is no cache). `TIDEMARK_BENCH_FILTER` runs only the
//! configurations whose name contains it.

mod common;

use common::env_or;
use std::time::Instant;
use tidemark::dataflow::task::KeyedSnapshot;
use tidemark::model::ids::{CheckpointId, SubtaskIndex};
use tidemark::model::key_group::KeyGroupRange;
use tidemark::model::rng::splitmix64;
use tidemark::state::{KeyedStateBackend, StateBackend};
use tidemark::{KeyedContext, StateRegistrar};

#[derive(Clone, Copy)]
enum Keys {
    Uniform,
    Skewed,
}

fn key(keys: Keys, n: u64, i: u64) -> u64 {
    let r = splitmix64(i);
    match keys {
        Keys::Uniform => r % n,
        Keys::Skewed if !r.is_multiple_of(10) => (r >> 8) % (n / 1000).max(1),
        Keys::Skewed => (r >> 8) % n,
    }
}

fn run(name: &str, mut backend: KeyedStateBackend<u64>, keys: Keys, records: u64, n: u64) {
    if !std::env::var("TIDEMARK_BENCH_FILTER").map_or(true, |f| name.contains(&f)) {
        return;
    }
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    backend.restore(&Default::default()).expect("opens");
    let started = Instant::now();
    for i in 0..records {
        let key = key(keys, n, i);
        *KeyedContext::new(&mut backend, &key)
            .value(&count)
            .get_or_default() += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let snapshot = backend.snapshot(CheckpointId(1)).expect("snapshots");
    let sync_ms = started.elapsed().as_secs_f64() * 1e3;
    let rate = records as f64 / elapsed;
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    match snapshot {
        KeyedSnapshot::Heap(heap) => {
            let started = Instant::now();
            let mut encoded = Vec::new();
            heap.write(&mut encoded);
            let encode_ms = started.elapsed().as_secs_f64() * 1e3;
            println!(
                "{name:<22} {rate:>12.0} records/s   snapshot sync {sync_ms:>7.1} ms, encoded {:.1} MiB in {encode_ms:.1} ms",
                mib(encoded.len() as u64),
            );
        }
        KeyedSnapshot::Native(pending) => {
            let native = pending.wait().expect("the native checkpoint is made");
            let made_ms = started.elapsed().as_secs_f64() * 1e3;
            println!(
                "{name:<22} {rate:>12.0} records/s   snapshot sync {sync_ms:>7.1} ms, made {made_ms:.1} ms after the barrier, {} files, {:.1} MiB",
                native.files.len(),
                mib(native.files.iter().map(|f| f.size).sum()),
            );
            std::fs::remove_dir_all(native.dir).expect("removes the snapshot");
        }
    }
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 10_000_000);
    let n = env_or("TIDEMARK_BENCH_KEYS", 1_000_000);
    let default_cache = StateBackend::DEFAULT_CACHE_ENTRIES;
    let caches: Vec<usize> = std::env::var("TIDEMARK_BENCH_CACHE")
        .unwrap_or_else(|_| format!("{default_cache},1"))
        .split(',')
        .map(|c| c.trim().parse().expect("cache sizes are numbers"))
        .collect();
    let range = KeyGroupRange::for_subtask(128, 1, SubtaskIndex(0));
    let dir = tempfile::tempdir().expect("a temporary directory");
    println!("one subtask, {records} records over {n} keys");
    for (keys, label) in [(Keys::Uniform, "uniform"), (Keys::Skewed, "skewed")] {
        let heap = KeyedStateBackend::new(&StateBackend::Heap, "bench", range, 128);
        run(&format!("heap, {label}"), heap, keys, records, n);
        for &cache in &caches {
            let rocksdb =
                tidemark::rocksdb::RocksDb::backend(Some(dir.path().to_owned()), Some(cache));
            let backend = KeyedStateBackend::new(&rocksdb, "bench", range, 128);
            run(
                &format!("rocksdb/{cache}, {label}"),
                backend,
                keys,
                records,
                n,
            );
        }
    }
}
