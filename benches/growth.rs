//! How the cost of jobs (p=2) grows with their state. First wordcount:
//! throughput with checkpoints off and every second, checkpoint duration
//! p50, the state a checkpoint references, what one uploads (p50), and
//! peak memory, at 100,000, 1,000,000 and 10,000,000 keys, for heap state
//! and for RocksDB with incremental checkpoints (its default write-back
//! cache of 1,048,576 values per subtask). Then the event-time operators on
//! the heap at the same keys: tumbling, sliding and session windows and the
//! interval join, with the timers their checkpoints held. Last, timers
//! falling due all at once: 10,000,000 keys in 100 s tumbling windows
//! that each hold as many records, over two windows' records, so that the
//! first window's end makes most keys' timers due at once (fewer keys run
//! out of records before a checkpoint comes), with unaligned checkpoints
//! every 500 ms on the heap and RocksDB: how long a checkpoint takes while
//! they fire. Then timers held: `run timers` with a keyed event-time timer
//! per record (as many keys as records), held until the input ends, then
//! all fired, against the same records whose timers fire as the watermark
//! passes.
//! Prints the Markdown tables docs/cost-of-state.md shows.
//!
//! cargo bench --bench growth [-- wordcount | time | due | timers]
//!
//! With `wordcount`, `time`, `due` or `timers`, only that table.
//!
//! Every run is a child process of its own, so that peak memory belongs to
//! one configuration. `TIDEMARK_BENCH_RECORDS` (default 100,000,000) sets
//! the records of a wordcount run, which has at least ten per key;
//! `TIDEMARK_BENCH_TIME_RECORDS` (default 20,000,000) those of the others
//! but the timers', whose records (and timers) `TIDEMARK_BENCH_TIMERS`
//! sets (default 10,000,000).

mod common;

use common::{child_runs, env_or, run_in_child, ChildRun};

const KEYS: [u64; 3] = [100_000, 1_000_000, 10_000_000];

const BACKENDS: [(&str, &[&str]); 2] = [
    ("heap", &[]),
    ("RocksDB incremental", &["--state=rocksdb", "--incremental"]),
];

/// The event-time jobs: name, and the arguments that pick them.
const TIME_JOBS: [(&str, &[&str]); 4] = [
    ("windows tumbling 1 s", &["windows", "--window=tumbling:1s"]),
    (
        "windows sliding 10 s / 1 s",
        &["windows", "--window=sliding:10s/1s"],
    ),
    (
        "windows session 100 ms",
        &["windows", "--window=session:100ms"],
    ),
    ("join ±20 ms", &["join"]),
];

/// `tidemark run` of `job` at `keys` and p=2, checkpoints off and every
/// second.
fn off_and_on(job: &[&str], records: u64, keys: u64) -> (ChildRun, ChildRun) {
    let run = |interval: &str| {
        let mut args: Vec<String> = job.iter().map(|a| a.to_string()).collect();
        args.extend([
            format!("--records={records}"),
            format!("--keys={keys}"),
            "--parallelism=2".to_string(),
            format!("--checkpoint-interval={interval}"),
        ]);
        run_in_child(&args)
    };
    (run("off"), run("1s"))
}

fn main() {
    if child_runs() {
        return;
    }
    let only = |table: &str| {
        let args: Vec<String> = std::env::args().collect();
        let any = args
            .iter()
            .any(|a| ["wordcount", "time", "due", "timers"].contains(&a.as_str()));
        !any || args.iter().any(|a| a == table)
    };
    if only("wordcount") {
        wordcount_table();
    }
    if only("time") {
        time_table();
    }
    if only("due") {
        due_table();
    }
    if only("timers") {
        timers_table();
    }
}

fn wordcount_table() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 100_000_000);
    println!("wordcount p=2, {records} records or ten per key, one run per cell");
    println!(
        "| state | keys | M records/s, checkpoints off | M records/s, 1 s checkpoints | ratio | checkpoint p50 ms | state MB | upload p50 MB | peak RSS MiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (backend, extra) in BACKENDS {
        for keys in KEYS {
            let job: Vec<&str> = ["wordcount"].iter().chain(extra).copied().collect();
            let (off, on) = off_and_on(&job, records.max(10 * keys), keys);
            let (off_rps, on_rps) = (off.number("/throughput_rps"), on.number("/throughput_rps"));
            println!(
                "| {backend} | {keys} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.0} |",
                off_rps / 1e6,
                on_rps / 1e6,
                on_rps / off_rps,
                on.number("/checkpoint_duration_ms/p50"),
                on.number("/checkpointed_bytes_full") / 1e6,
                on.number("/bytes_uploaded_per_checkpoint/p50") / 1e6,
                off.peak_rss_mib.max(on.peak_rss_mib),
            );
        }
    }
}

fn time_table() {
    let records = env_or("TIDEMARK_BENCH_TIME_RECORDS", 20_000_000);
    println!();
    println!("event-time jobs on the heap, p=2, {records} records (a join's on each side), one run per cell");
    println!(
        "| job | keys | M input records/s, checkpoints off | M input records/s, 1 s checkpoints | ratio | checkpoint p50 ms | timers in a checkpoint, max | upload p50 MB | peak RSS MiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, job) in TIME_JOBS {
        for keys in KEYS {
            let (off, on) = off_and_on(job, records, keys);
            let (off_rps, on_rps) = (off.number("/throughput_rps"), on.number("/throughput_rps"));
            println!(
                "| {name} | {keys} | {:.2} | {:.2} | {:.2} | {:.1} | {:.0} | {:.1} | {:.0} |",
                off_rps / 1e6,
                on_rps / 1e6,
                on_rps / off_rps,
                on.number("/checkpoint_duration_ms/p50"),
                on.number("/timers_in_checkpoint_max"),
                // The last checkpoint may come after every window fired.
                on.number("/bytes_uploaded_per_checkpoint/p50") / 1e6,
                off.peak_rss_mib.max(on.peak_rss_mib),
            );
        }
    }
}

fn due_table() {
    println!();
    let keys = KEYS[2];
    println!("timers falling due at once: windows tumbling 100 s, {keys} keys, twice as many records, p=2, unaligned checkpoints every 500 ms, one run per cell");
    println!(
        "| state | keys | M records/s | timers in a checkpoint, max | checkpoint p50 ms | checkpoint max ms | peak RSS MiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (backend, extra) in BACKENDS {
        let mut args = vec![
            "windows".to_string(),
            // Two windows' records, at 100 records per ms: each window
            // holds about as many records as there are keys.
            "--window=tumbling:100s".to_string(),
            format!("--records={}", 2 * keys),
            format!("--keys={keys}"),
            "--parallelism=2".to_string(),
            "--checkpoint-interval=500ms".to_string(),
            "--mode=unaligned".to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let run = run_in_child(&args);
        println!(
            "| {backend} | {keys} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
            run.number("/throughput_rps") / 1e6,
            run.number("/timers_in_checkpoint_max"),
            run.number("/checkpoint_duration_ms/p50"),
            run.number("/checkpoint_duration_ms/max"),
            run.peak_rss_mib,
        );
    }
}

fn timers_table() {
    let timers = env_or("TIDEMARK_BENCH_TIMERS", 10_000_000);
    // At the default 100 records per ms: a delay past the input's end.
    let held = format!("--timer-delay={}ms", timers / 100 + 1000);
    println!();
    println!("timers held: run timers, {timers} records and keys, a timer each, p=2, 1 s checkpoints, one run per cell");
    println!(
        "| state | timers | M timers/s, held then fired | M timers/s, fired as due | timers in a checkpoint, max | checkpoint p50 ms | checkpoint max ms | upload p50 MB | upload max MB | peak RSS MiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (backend, extra) in BACKENDS {
        let run = |delay: &str| {
            let mut args = vec![
                "timers".to_string(),
                format!("--records={timers}"),
                format!("--keys={timers}"),
                delay.to_string(),
                "--parallelism=2".to_string(),
                "--checkpoint-interval=1s".to_string(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            run_in_child(&args)
        };
        let (held, due) = (run(&held), run("--timer-delay=0ms"));
        let rate = |run: &ChildRun| run.number("/timers_fired") / run.number("/elapsed_s") / 1e6;
        println!(
            "| {backend} | {timers} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} |",
            rate(&held),
            rate(&due),
            held.number("/timers_in_checkpoint_max"),
            held.number("/checkpoint_duration_ms/p50"),
            held.number("/checkpoint_duration_ms/max"),
            held.number("/bytes_uploaded_per_checkpoint/p50") / 1e6,
            held.number("/bytes_uploaded_per_checkpoint/max") / 1e6,
            held.peak_rss_mib,
        );
    }
}
