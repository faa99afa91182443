//! `cargo xtask`: the README's commands, made to work on a machine that has
//! nothing but the Rust toolchain. Before cargo starts the long build
//! (RocksDB's bundled C++), it checks what that build and the tests need,
//! installs what is missing through the system's package manager when it may
//! (root, or sudo without a password, on Debian or Ubuntu), and otherwise
//! stops at once saying exactly what to install and how.
//!
//! - `cargo xtask setup`: install the build's and the tests' prerequisites.
//! - `cargo xtask run ARGS`: `tidemark run ARGS`, built with `cargo run
//!   --release -p tidemark-cli`.
//! - `cargo xtask test ARGS`: check formatting, lints (default features
//!   and none, as a heap-only embedding builds) and docs with warnings
//!   denied; start a local S3 server (moto), PostgreSQL servers and a
//!   Kafka-API broker (nisshi, installed once with `cargo install`) and a
//!   ZooKeeper server on free loopback ports, point the S3, PostgreSQL,
//!   Kafka and ZooKeeper test cases at them,
//!   `cargo test --workspace ARGS`, stop the servers.
//! - `cargo xtask sim [--seeds N] [--seed S] [--trace]`: the deterministic
//!   simulator of whole jobs over seeds `0..N` (10,000 by default), or
//!   seed `S` alone, `--trace` printing its events.

mod kafka;
mod postgres;
mod prerequisites;
mod s3;
mod zookeeper;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask setup | run [ARGS...] | test [ARGS...]
       | sim [--seeds N] [--seed S] [--trace]

  setup   install what the build and the tests need (a C++ compiler,
          libclang for RocksDB's bindings, moto's S3 server, PostgreSQL,
          the Kafka-API broker nisshi, ZooKeeper, Chromium, Flink's command
          line and a Java runtime)
  run     tidemark run ARGS (cargo run --release -p tidemark-cli -- run ARGS)
  test    cargo fmt --check, cargo clippy and cargo doc with warnings
          denied, then cargo test --workspace ARGS, with the S3 cases
          against a local moto server, the PostgreSQL cases against
          local PostgreSQL servers, the Kafka cases against nisshi and
          the ZooKeeper cases against a local ZooKeeper
  sim     the deterministic simulator of whole jobs over seeds 0..N
          (10,000 by default) or seed S alone; --trace prints its events";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => ("", &[][..]),
    };
    let result = match command {
        "setup" => prerequisites::ensure(prerequisites::Purpose::Test)
            .and_then(|()| kafka::nisshi())
            .map(|_| ExitCode::SUCCESS),
        "run" => run(rest),
        "test" => test(rest),
        "sim" => sim(rest),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("cargo xtask {command}: {e}");
        ExitCode::FAILURE
    })
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    prerequisites::ensure(prerequisites::Purpose::Build)?;
    announce_first_build("release", "the release build", 30);
    let mut cargo = cargo();
    cargo
        .args(["run", "--release", "-p", "tidemark-cli", "--", "run"])
        .args(args);
    status(cargo)
}

fn test(args: &[String]) -> Result<ExitCode, String> {
    prerequisites::ensure(prerequisites::Purpose::Test)?;
    prerequisites::ensure_lint_tools()?;
    announce_first_build("debug", "the test build", 20);
    prune_stale_builds(&target_dir().join("debug"));
    for check in CHECKS {
        let mut cargo = cargo();
        cargo.args(check.args).envs(check.env.iter().copied());
        let code = status(cargo)?;
        if code != ExitCode::SUCCESS {
            eprintln!("cargo xtask test: `cargo {}` failed", check.args.join(" "));
            return Ok(code);
        }
    }
    let nisshi = kafka::nisshi()?;
    let server = s3::MotoServer::start()?;
    let postgres = postgres::Servers::start()?;
    let broker = kafka::KafkaBroker::start(&nisshi)?;
    let zookeeper = zookeeper::ZooKeeperServer::start()?;
    let mut cargo = cargo();
    cargo.args(["test", "--workspace"]).args(args);
    server.configure(&mut cargo);
    postgres.configure(&mut cargo);
    broker.configure(&mut cargo);
    zookeeper.configure(&mut cargo);
    // Installed above: the page's test and Flink's command line's must not
    // skip.
    cargo.env("TIDEMARK_REQUIRE_CHROMIUM", "1");
    cargo.env("TIDEMARK_REQUIRE_FLINK_CLI", "1");
    cargo.env("TIDEMARK_FLINK_CLI", prerequisites::flink_cli());
    let code = status(cargo);
    drop((server, postgres, broker, zookeeper));
    code
}

/// Runs the simulator's test over the seeds asked for; a failing seed
/// prints the `cargo xtask sim --seed S` that replays it.
fn sim(args: &[String]) -> Result<ExitCode, String> {
    let mut cargo = cargo();
    cargo.args([
        "test",
        "-p",
        "tidemark-core",
        "--lib",
        "testkit::sim::tests::every_seed_keeps_every_invariant",
        "--",
        "--exact",
        "--nocapture",
    ]);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<String, String> {
            let value = args.next().ok_or(format!("{arg} needs a number"))?;
            value
                .parse::<u64>()
                .map_err(|_| format!("{arg}: `{value}` is not a number"))?;
            Ok(format!("TIDEMARK_SIM_{name}={value}"))
        };
        let setting = match arg.as_str() {
            "--seeds" => number("SEEDS")?,
            "--seed" => number("SEED")?,
            "--trace" => "TIDEMARK_SIM_TRACE=1".to_owned(),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        };
        let (name, value) = setting.split_once('=').expect("NAME=value");
        cargo.env(name, value);
    }
    status(cargo)
}

/// A cargo command the tests run after, which must pass without warnings.
struct Check {
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

/// The gates before the tests: formatting, lints of every target with the
/// default features, lints of the libraries and the binary with none (what
/// a heap-only embedding compiles: dev-dependencies would turn RocksDB back
/// on), and the docs.
const CHECKS: [Check; 4] = [
    Check {
        args: &["fmt", "--all", "--check"],
        env: &[],
    },
    Check {
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    Check {
        args: &[
            "clippy",
            "--workspace",
            "--no-default-features",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    Check {
        args: &["doc", "--workspace", "--no-deps"],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
];

/// The workspace's root: commands run there wherever `cargo xtask` was
/// started from. It is read from `cargo run`'s environment, not compiled
/// in: clones at other paths share one target directory, and cargo may
/// reuse an xtask binary built in another clone.
fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .expect("xtask lies inside the workspace")
        .to_owned()
}

/// Where cargo builds: `CARGO_TARGET_DIR`, else the workspace's `target`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    command
}

/// Says how long a build will take before it starts, when RocksDB has
/// never been compiled into the target directory for `profile`.
fn announce_first_build(profile: &str, what: &str, minutes: u32) {
    let target = target_dir();
    let built = std::fs::read_dir(target.join(profile).join("build"))
        .map(|dirs| {
            dirs.flatten().any(|d| {
                d.file_name()
                    .to_string_lossy()
                    .starts_with("librocksdb-sys-")
            })
        })
        .unwrap_or(false);
    if !built {
        eprintln!(
            "cargo xtask: the first build compiles RocksDB's bundled C++ for {what}: about \
             {minutes} minutes on 2 cores; later builds take seconds"
        );
    }
}

/// Runs `command` and passes its exit code on.
fn status(mut command: Command) -> Result<ExitCode, String> {
    let status = command
        .status()
        .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// How long a test binary or incremental cache may go unwritten before
/// the test command deletes it.
const STALE: std::time::Duration = std::time::Duration::from_secs(3 * 24 * 3600);

/// Deletes what the shared target directory keeps of builds nobody made
/// for days: test and bench executables (a new one for every change of a
/// package, hundreds of MB each with debug info) and incremental caches.
/// Clones that share the directory let them grow without bound (77 GB
/// filled this machine's disk once); cargo rebuilds whatever it still
/// needs.
fn prune_stale_builds(profile: &std::path::Path) {
    let stale = |entry: &std::fs::DirEntry| {
        entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > STALE))
    };
    let mut freed = 0u64;
    let entries = |dir: &str| {
        std::fs::read_dir(profile.join(dir))
            .into_iter()
            .flatten()
            .flatten()
    };
    for entry in entries("deps") {
        // Executables have no extension; libraries and metadata have one.
        let executable = entry.path().extension().is_none() && entry.path().is_file();
        if executable && stale(&entry) {
            freed += entry.metadata().map_or(0, |m| m.len());
            let _ = std::fs::remove_file(entry.path());
        }
    }
    for entry in entries("incremental") {
        if stale(&entry) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    if freed > 0 {
        eprintln!(
            "cargo xtask: deleted {} MB of test binaries unbuilt for 3 days",
            freed >> 20
        );
    }
}

#[cfg(test)]
mod tests {
    use super::workspace_root;

    /// The command in the code block that follows `label` in README.md.
    fn readme_command(readme: &str, label: &str) -> String {
        let mut lines = readme.lines().skip_while(|l| *l != label).skip(1);
        lines
            .find(|l| !l.trim().is_empty() && !l.starts_with("```"))
            .unwrap_or_else(|| panic!("README.md has no command after {label:?}"))
            .trim()
            .to_owned()
    }

    #[test]
    fn ci_runs_exactly_the_readme_test_command_and_the_readme_commands_are_xtasks() {
        let root = workspace_root();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let run = readme_command(&readme, "Run the main job, wordcount:");
        let test = readme_command(&readme, "Run the tests:");
        assert!(run.starts_with("cargo xtask run "), "{run}");
        assert_eq!(test, "cargo xtask test");
        let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
        let last = ci
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap()
            .trim();
        assert_eq!(
            last, test,
            ".ci/run must end with the README's test command"
        );
        let commands: Vec<&str> = ci
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert_eq!(
            commands,
            [
                "set -euo pipefail",
                "cd \"$(dirname \"$0\")/..\"",
                "export CARGO_TARGET_DIR=\"${CARGO_TARGET_DIR:-/var/tmp/tidemark-target}\"",
                test.as_str(),
            ],
            ".ci/run runs nothing a newcomer would not"
        );
    }

    #[test]
    fn only_executables_and_caches_unwritten_for_days_are_pruned() {
        let profile = std::env::temp_dir().join(format!("xtask-prune-{}", std::process::id()));
        let (deps, incremental) = (profile.join("deps"), profile.join("incremental"));
        std::fs::create_dir_all(&deps).unwrap();
        std::fs::create_dir_all(incremental.join("old-cache")).unwrap();
        let long_ago = std::time::SystemTime::now() - super::STALE * 2;
        for name in ["old-test", "new-test", "libold.rlib"] {
            let file = std::fs::File::create(deps.join(name)).unwrap();
            if name != "new-test" {
                file.set_modified(long_ago).unwrap();
            }
        }
        std::fs::File::open(incremental.join("old-cache"))
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        super::prune_stale_builds(&profile);
        let left = (
            deps.join("old-test").exists(),
            deps.join("new-test").exists(),
            deps.join("libold.rlib").exists(),
            incremental.join("old-cache").exists(),
        );
        std::fs::remove_dir_all(&profile).unwrap();
        assert_eq!(
            left,
            (false, true, true, false),
            "old test, new test, library, cache"
        );
    }
}
