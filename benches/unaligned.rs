//! Aligned against unaligned checkpoints under backpressure, side by side in
//! one run: wordcount p=2 with the counter's subtask 0 slow, so that its
//! input channels are full when the barriers arrive, and 1 s checkpoints.
//! Reports per mode the checkpoint duration, the throughput, and the most
//! in-flight batches persisted for one channel against the channel's credits.
//!
//! cargo bench --bench unaligned
//!
//! `TIDEMARK_BENCH_RECORDS` (default 4,000,000), `TIDEMARK_BENCH_SLOW_NS`
//! (default 10,000 ns per record at the slow subtask) and
//! `TIDEMARK_BENCH_REPS` (default 3) change the size.

mod common;

use common::{env_or, median};
use tidemark_cli::{self as cli, RunArgs, RunReport};

fn run(records: u64, slow_ns: u64, mode: &str) -> RunReport {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let args = [
        "wordcount".to_string(),
        format!("--records={records}"),
        "--keys=10000".to_string(),
        "--parallelism=2".to_string(),
        "--checkpoint-interval=1s".to_string(),
        format!("--checkpoint-dir={}", dir.path().display()),
        "--slow-subtask=0".to_string(),
        format!("--slow-ns={slow_ns}"),
        mode.to_string(),
    ];
    cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("wordcount runs")
}

struct Mode {
    flag: &'static str,
    duration_p50: Vec<f64>,
    duration_max: Vec<f64>,
    throughput: Vec<f64>,
    inflight_max: u64,
    batches_per_channel_max: u32,
    switched: u64,
    completed: u64,
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 4_000_000);
    let slow_ns = env_or("TIDEMARK_BENCH_SLOW_NS", 10_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let mut modes: Vec<Mode> = [
        "--mode=aligned",
        "--mode=unaligned",
        "--aligned-timeout=50ms",
    ]
    .into_iter()
    .map(|flag| Mode {
        flag,
        duration_p50: vec![],
        duration_max: vec![],
        throughput: vec![],
        inflight_max: 0,
        batches_per_channel_max: 0,
        switched: 0,
        completed: 0,
    })
    .collect();
    let mut credits = (0, 0);
    for _ in 0..reps {
        for mode in &mut modes {
            let r = run(records, slow_ns, mode.flag);
            mode.duration_p50.push(r.checkpoint_duration_ms.p50);
            mode.duration_max.push(r.checkpoint_duration_ms.max);
            mode.throughput.push(r.throughput_rps);
            mode.inflight_max = mode.inflight_max.max(r.persisted_inflight_bytes.max);
            mode.batches_per_channel_max = mode
                .batches_per_channel_max
                .max(r.persisted_inflight_batches_per_channel_max);
            mode.switched += r.checkpoints_switched_to_unaligned;
            mode.completed += r.checkpoints_completed;
            credits = (r.output_credits, r.input_credits);
        }
    }
    println!(
        "wordcount p=2, {records} records, subtask 0 of the counter at {slow_ns} ns/record, 1 s checkpoints, {reps} runs per mode (medians)"
    );
    let aligned_p50 = median(modes[0].duration_p50.clone());
    let aligned_rps = median(modes[0].throughput.clone());
    for m in &modes {
        let (p50, rps) = (median(m.duration_p50.clone()), median(m.throughput.clone()));
        println!(
            "{:<24} checkpoint p50 {:>8.1} ms (max {:>8.1}, {:.3} of aligned)  throughput {:>8.0} records/s ({:.3} of aligned)  persisted in flight max {:>9} bytes, {} batches per channel  switched {}/{}",
            m.flag,
            p50,
            median(m.duration_max.clone()),
            p50 / aligned_p50,
            rps,
            rps / aligned_rps,
            m.inflight_max,
            m.batches_per_channel_max,
            m.switched,
            m.completed
        );
    }
    println!(
        "a channel holds at most {} + {} batches by credit (output + input) plus what one call of its producer emits",
        credits.0, credits.1
    );
}
