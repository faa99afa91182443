//! The `tidemark` command line: `run` an example topology, `inspect` a
//! checkpoint or savepoint, `cleanup` a job's checkpoint directory, and
//! `savepoint`, `stop` and `checkpoints` against a running job.

use tidemark_cli::{cleanup, client, inspect, rescale, worker, Cli, Command};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        // A span's close shows how long a checkpoint or snapshot phase
        // took (`RUST_LOG=tidemark_actors=debug`).
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(std::io::stderr)
        .init();
    let Cli { command } = Cli::try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let outcome = match command {
        Command::Run(args) => tidemark_cli::run(&args).map(|report| {
            if args.json {
                print_json(&report);
            } else {
                println!(
                    "{:?}: {} records in {:.3} s, {:.0} records/s at parallelism {}",
                    report.topology,
                    report.records_in,
                    report.elapsed_s,
                    report.throughput_rps,
                    report.parallelism
                );
            }
        }),
        Command::Savepoint(args) => client::savepoint(&args, false)
            .map(|location| println!("Savepoint completed. Path: {location}")),
        Command::Stop(args) => client::savepoint(&args, true)
            .map(|location| println!("Savepoint completed. Path: {location}")),
        Command::Checkpoints(args) => client::checkpoints(&args).map(|table| print!("{table}")),
        Command::Rescale(args) => rescale::rescale(&args).map(|done| println!("{done}")),
        Command::Worker(args) => worker::worker(&args),
        Command::Cleanup(args) => cleanup::cleanup(&args).map(|sweep| println!("{sweep}")),
        Command::Inspect(args) => inspect::inspect(&args).map(|inspection| {
            if args.json {
                print_json(&inspection);
            } else {
                print!("{inspection}");
            }
        }),
    };
    if let Err(e) = outcome {
        eprintln!("tidemark: {e}");
        std::process::exit(e.exit_code());
    }
}

/// One line of JSON on standard output.
fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string(value).expect("reports are plain data")
    );
}
