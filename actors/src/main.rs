use clap::Parser;
use tidemark_actors::cli::{self, Cli, Command};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Cli { command } = Cli::parse();
    match command {
        Command::Run(args) => match cli::run(&args) {
            Ok(report) if args.json => println!(
                "{}",
                serde_json::to_string(&report).expect("the report is plain data")
            ),
            Ok(report) => println!(
                "{:?}: {} records in {:.3} s, {:.0} records/s at parallelism {}",
                report.topology,
                report.records_in,
                report.elapsed_s,
                report.throughput_rps,
                report.parallelism
            ),
            Err(e) => {
                eprintln!("tidemark: {e}");
                std::process::exit(e.exit_code());
            }
        },
    }
}
