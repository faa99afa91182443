//! Async I/O against a synchronous call: `run enrich` asks an HTTP echo
//! service (actix-web, one worker, in this process) for every record with
//! up to 1, 100 and 1,000 requests in flight per subtask, side by side with
//! a synchronous `map` that asks the same service for each record with a
//! blocking client (ureq), at p=2.
//!
//! cargo bench --bench async_io
//!
//! `TIDEMARK_BENCH_RECORDS` (default 200,000) sets the async runs' records;
//! the synchronous one reads a tenth of them. `TIDEMARK_BENCH_REPS`
//! (default 3) the rounds, whose medians are printed.

mod common;

use common::{env_or, median};
use tidemark::dataflow::source::Items;
use tidemark_actors::prelude::*;
use tidemark_cli::topologies::enrich::{self, value_of};
use tidemark_cli::RunArgs;

/// Records/s of `run enrich` with `in_flight` requests per subtask.
fn asynchronous(service: &str, records: u64, in_flight: u64) -> f64 {
    let args = [
        "enrich".to_string(),
        format!("--records={records}"),
        "--keys=100000".into(),
        "--parallelism=2".into(),
        "--checkpoint-interval=off".into(),
        format!("--in-flight={in_flight}"),
        format!("--service={service}"),
    ];
    let report =
        tidemark_cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("enrich runs");
    report.records_in as f64 / report.elapsed_s
}

/// Records/s of a synchronous map asking the service for each record.
fn synchronous(service: &str, records: u64) -> f64 {
    let keys = std::sync::Arc::new((0..records).collect::<Vec<u64>>());
    let agent = ureq::Agent::new_with_defaults();
    let service = service.to_owned();
    let enriched = Job::builder("sync-enrich")
        .parallelism(2)
        .source("keys", move |ctx| Items::new(keys.clone(), ctx))
        .rebalance()
        .map(move |key: u64| {
            let url = format!("{service}/enrich/{key}?record={key}");
            let body = agent
                .get(&url)
                .call()
                .expect("the service answers")
                .body_mut()
                .read_to_string()
                .expect("a text answer");
            let value: u64 = body.trim().parse().expect("a number");
            assert_eq!(value, value_of(key));
            value
        });
    common::into_discard(enriched)
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 200_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let service = enrich::service().expect("the echo service starts");
    let mut rounds: Vec<[f64; 4]> = Vec::new();
    for _ in 0..reps {
        rounds.push([
            synchronous(&service, records / 10),
            asynchronous(&service, records / 10, 1),
            asynchronous(&service, records, 100),
            asynchronous(&service, records, 1000),
        ]);
    }
    let of = |i: usize| median(rounds.iter().map(|r| r[i]).collect());
    let sync = of(0);
    println!("enriching records through an HTTP echo service, p=2, {reps} rounds, medians");
    println!("| calls | records/s | vs synchronous map |");
    println!("| --- | --- | --- |");
    for (i, calls) in [
        "synchronous map (ureq)",
        "async, 1 in flight",
        "async, 100 in flight",
        "async, 1,000 in flight",
    ]
    .iter()
    .enumerate()
    {
        println!("| {calls} | {:.0} | {:.2}x |", of(i), of(i) / sync);
    }
}
