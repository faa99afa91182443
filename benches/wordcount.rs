//! Wordcount throughput and peak memory at parallelism 1 and 2.
//!
//! cargo bench --bench wordcount
//!
//! Each measurement runs in a child process of its own, so that peak memory
//! (VmHWM) belongs to one configuration; the configurations are interleaved
//! over the repetitions so that a noisy neighbour hits both alike. Set
//! `TIDEMARK_BENCH_RECORDS` and `TIDEMARK_BENCH_REPS` to change the size.

use std::process::Command;
use tidemark_actors::cli::{self, RunArgs};

const CHILD: &str = "TIDEMARK_BENCH_CHILD";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn child(parallelism: u32, records: u64) {
    let args = RunArgs::parse([
        "wordcount".to_string(),
        format!("--records={records}"),
        "--keys=100000".to_string(),
        format!("--parallelism={parallelism}"),
        "--checkpoint-interval=off".to_string(),
    ])
    .expect("valid arguments");
    let report = cli::run(&args).expect("wordcount runs");
    println!("{} {}", report.throughput_rps, peak_rss_mib());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 50_000_000);
    if let Ok(p) = std::env::var(CHILD) {
        return child(p.parse().expect("parallelism"), records);
    }
    let reps = env_or("TIDEMARK_BENCH_REPS", 5);
    let exe = std::env::current_exe().expect("own path");
    let mut results: Vec<(u32, f64, f64)> = Vec::new();
    for _ in 0..reps {
        for p in [1u32, 2] {
            let out = Command::new(&exe)
                .env(CHILD, p.to_string())
                .output()
                .expect("child runs");
            let line = String::from_utf8_lossy(&out.stdout);
            let mut fields = line
                .split_whitespace()
                .map(|f| f.parse::<f64>().expect("number"));
            let (rps, rss) = (fields.next().expect("rps"), fields.next().expect("rss"));
            results.push((p, rps, rss));
        }
    }
    println!("wordcount, {records} records, 100000 keys, checkpoints off, {reps} runs each");
    let mut medians = Vec::new();
    for p in [1u32, 2] {
        let rps: Vec<f64> = results.iter().filter(|r| r.0 == p).map(|r| r.1).collect();
        let rss = results
            .iter()
            .filter(|r| r.0 == p)
            .map(|r| r.2)
            .fold(0.0, f64::max);
        let best = rps.iter().copied().fold(0.0, f64::max);
        let m = median(rps);
        medians.push(m);
        println!(
            "p={p}: median {:.1} M records/s, best {:.1} M records/s, peak memory {rss:.0} MiB",
            m / 1e6,
            best / 1e6
        );
    }
    println!("p=2 / p=1 (medians): {:.2}", medians[1] / medians[0]);
}
