//! A Kafka-API broker for the length of a test run: nisshi (formerly
//! tansu), from crates.io (Apache Kafka itself is not installable from the
//! registries CI reaches), with its in-memory storage engine, on a free
//! loopback port. `cargo install` builds it once into the shared target
//! directory.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nisshi the tests were written against: the one release on crates.io
/// with transactions (tansu 0.6 has no `EndTxn`, nisshi 0.8 refuses
/// transactional ids), which the Kafka sink's exactly-once rests on. It
/// declares Rust 1.96 but builds with 1.95 (`--ignore-rust-version`).
const NISSHI: &str = "0.7.0";
/// How long the broker may take to listen after it was started.
const STARTUP: Duration = Duration::from_secs(60);

/// Where `cargo install` puts nisshi: beside the builds, so that every
/// clone and CI run on the machine reuses it.
fn install_root() -> PathBuf {
    crate::target_dir()
        .join("tools")
        .join(format!("nisshi-{NISSHI}"))
}

/// The nisshi binary, installed first if it is not.
pub fn nisshi() -> Result<PathBuf, String> {
    let root = install_root();
    let binary = root.join("bin").join("nisshi");
    if binary.is_file() {
        return Ok(binary);
    }
    eprintln!(
        "cargo xtask: installing the Kafka-API broker nisshi {NISSHI} \
         (about 15 minutes on 2 cores, once)"
    );
    let mut install = crate::cargo();
    // Built in a temporary directory that cargo deletes, not among the
    // project's builds.
    install.env_remove("CARGO_TARGET_DIR").args([
        "install",
        "nisshi",
        "--locked",
        "--ignore-rust-version",
        "--version",
        NISSHI,
        "--no-default-features",
        "--features",
        "dynostore",
        "--root",
    ]);
    install.arg(&root);
    let code = crate::status(install)?;
    if code != std::process::ExitCode::SUCCESS || !binary.is_file() {
        return Err(format!("cargo install nisshi {NISSHI} failed"));
    }
    Ok(binary)
}

/// A running broker; stopped when dropped.
pub struct KafkaBroker {
    child: Child,
    address: String,
    log: PathBuf,
}

impl KafkaBroker {
    /// Starts nisshi; fails with its output if it does not listen within a
    /// minute.
    pub fn start(nisshi: &Path) -> Result<Self, String> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port for the Kafka broker: {e}"))?
            .port();
        let address = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!("tidemark-nisshi-{port}.log"));
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let url = format!("tcp://{address}");
        let child = Command::new(nisshi)
            .args([
                "broker",
                "--cluster-id",
                "tidemark-ci",
                "--storage-engine",
                "memory://nisshi/",
            ])
            .args(["--listener-url", &url, "--advertised-listener-url", &url])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", nisshi.display()))?;
        let mut broker = KafkaBroker {
            child,
            address,
            log,
        };
        let deadline = Instant::now() + STARTUP;
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if let Ok(Some(status)) = broker.child.try_wait() {
                return Err(broker.failure(&format!("exited ({status})")));
            }
            if Instant::now() > deadline {
                return Err(broker.failure(&format!("did not listen within {STARTUP:?}")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(broker)
    }

    fn failure(&self, what: &str) -> String {
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("the Kafka broker (nisshi) {what}:\n{output}")
    }

    /// Points the Kafka test cases at this broker; they fail rather than
    /// skip if they cannot reach it.
    pub fn configure(&self, cargo: &mut Command) {
        cargo
            .env("TIDEMARK_TEST_KAFKA", &self.address)
            .env("TIDEMARK_REQUIRE_KAFKA", "1");
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
