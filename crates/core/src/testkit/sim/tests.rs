//! The simulator over many seeds, and over rules broken on purpose to show
//! it catches them. `TIDEMARK_SIM_SEEDS` sets how many seeds (10,000 by
//! default), `TIDEMARK_SIM_SEED` replays one and `TIDEMARK_SIM_TRACE`
//! prints its events: `cargo xtask sim` sets them.

use super::{run, Failure, Report};
use crate::checkpoint::job_checkpoints::BrokenRule;
use std::ops::Range;

/// The seeds this run covers.
fn seeds() -> Range<u64> {
    let var = |name| std::env::var(name).ok().map(|v: String| v.parse::<u64>());
    match (var("TIDEMARK_SIM_SEED"), var("TIDEMARK_SIM_SEEDS")) {
        (Some(seed), _) => {
            let seed = seed.expect("TIDEMARK_SIM_SEED is a number");
            seed..seed + 1
        }
        (None, Some(count)) => 0..count.expect("TIDEMARK_SIM_SEEDS is a number"),
        (None, None) => 0..10_000,
    }
}

/// Runs `seeds` with `broken` on two threads; the failures, by seed.
fn run_all(seeds: Range<u64>, broken: BrokenRule) -> (Report, Vec<Failure>) {
    let threads = 2;
    let trace = std::env::var_os("TIDEMARK_SIM_TRACE").is_some();
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let seeds = seeds.clone().skip(thread).step_by(threads);
                scope.spawn(move || {
                    seeds
                        .map(|seed| run(seed, broken, trace))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulation thread"))
            .collect()
    });
    let mut total = Report::default();
    let mut failures = Vec::new();
    for result in results {
        match result {
            Ok(report) => {
                total.steps += report.steps;
                total.completed += report.completed;
                total.restores += report.restores;
                total.faults += report.faults;
                total.driver_kills += report.driver_kills;
                total.worker_kills += report.worker_kills;
                total.stops += report.stops;
            }
            Err(failure) => failures.push(failure),
        }
    }
    failures.sort_by_key(|f| f.seed);
    (total, failures)
}

#[test]
fn every_seed_keeps_every_invariant() {
    let seeds = seeds();
    let (total, failures) = run_all(seeds.clone(), BrokenRule::None);
    println!(
        "simulated seeds {seeds:?}: {} steps, {} checkpoints completed, {} restores, \
         {} faults injected ({} power losses of the driver, {} workers killed), \
         {} stops with a savepoint resumed",
        total.steps,
        total.completed,
        total.restores,
        total.faults,
        total.driver_kills,
        total.worker_kills,
        total.stops
    );
    for failure in failures.iter().take(5) {
        println!(
            "{failure}\n  replay: cargo xtask sim --seed {}",
            failure.seed
        );
    }
    assert!(failures.is_empty(), "{} seeds failed", failures.len());
    // The runs did what they are for.
    if seeds.end - seeds.start >= 100 {
        assert!(total.restores > 0 && total.faults > 0 && total.completed > 0);
        assert!(total.worker_kills > 0 && total.stops > 0);
    }
}

/// The first seed of the default range that catches `rule` broken.
fn caught(rule: BrokenRule) -> Failure {
    (0..10_000)
        .step_by(500)
        .find_map(|start| run_all(start..start + 500, rule).1.into_iter().next())
        .unwrap_or_else(|| panic!("{rule:?} went unnoticed over 10,000 seeds"))
}

#[test]
fn completing_before_the_metadata_is_written_is_caught() {
    // Found as a duplicate in the output, or as a checkpoint whose
    // metadata failed and whose state went with it.
    let failure = caught(BrokenRule::CompleteBeforeMetadata);
    let reason = &failure.reason;
    assert!(
        ["not exactly once", "does not restore", "was deleted"]
            .iter()
            .any(|found| reason.contains(found)),
        "{failure}"
    );
    println!("{failure}");
}

#[test]
fn deleting_a_shared_file_a_retained_checkpoint_references_is_caught() {
    let failure = caught(BrokenRule::DeleteReferencedSharedFiles);
    assert!(failure.reason.contains("was deleted"), "{failure}");
    println!("{failure}");
}
