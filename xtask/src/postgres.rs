//! PostgreSQL servers for the length of a test run: a cluster that
//! `initdb` makes in a temporary directory, on a free loopback port, run by
//! the system's `postgres` user when this is root (PostgreSQL refuses
//! root). The sink's server has `max_prepared_transactions` set for its
//! two-phase commit; a second keeps PostgreSQL's default of 0, so that a
//! test sees the error a user with a stock server would.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a new cluster may take to accept connections.
const STARTUP: Duration = Duration::from_secs(60);

/// The directory of PostgreSQL's server programs: `PG_BIN` if set, else
/// the newest of Debian's `/usr/lib/postgresql/N/bin`, else `PATH`'s.
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return Some(dir.into());
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let on_path = Command::new("initdb")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    on_path.then(PathBuf::new)
}

/// A running server; stopped, and its cluster deleted, when dropped.
pub struct PostgresServer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PostgresServer {
    /// Makes a cluster and starts it with `max_prepared_transactions`.
    pub fn start(max_prepared_transactions: u32) -> Result<Self, String> {
        let bin = bin_dir().ok_or("PostgreSQL's initdb is not installed")?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port for PostgreSQL: {e}"))?
            .port();
        // initdb makes the directory, owned by whoever runs it.
        let dir = std::env::temp_dir().join(format!("tidemark-postgres-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        let log = dir.with_extension("log");
        let data = dir.to_string_lossy().into_owned();
        let initdb = as_server_user(&bin.join("initdb"))
            .args([
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-locale",
                "-E",
                "UTF8",
                "--no-sync",
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !initdb.status.success() {
            return Err(format!(
                "initdb failed ({}): {}",
                initdb.status,
                String::from_utf8_lossy(&initdb.stderr)
            ));
        }
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let settings = [
            format!("max_prepared_transactions={max_prepared_transactions}"),
            "listen_addresses=127.0.0.1".into(),
            "unix_socket_directories=".into(),
            "max_connections=200".into(),
            "fsync=off".into(),
            "synchronous_commit=off".into(),
            "full_page_writes=off".into(),
        ];
        let mut postgres = as_server_user(&bin.join("postgres"));
        postgres.args(["-D", &data, "-p", &port.to_string()]);
        for setting in &settings {
            postgres.args(["-c", setting]);
        }
        let child = postgres
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start postgres: {e}"))?;
        let mut server = PostgresServer { child, dir, port };
        server.wait_until_ready(&bin, &log)?;
        Ok(server)
    }

    fn wait_until_ready(&mut self, bin: &Path, log: &Path) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP;
        let failure = |what: String| {
            let output = std::fs::read_to_string(log).unwrap_or_default();
            format!("PostgreSQL {what}:\n{output}")
        };
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .map_err(|e| format!("cannot run pg_isready: {e}"))?;
            if ready.success() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(failure(format!("exited ({status})")));
            }
            if Instant::now() > deadline {
                return Err(failure(format!(
                    "did not accept connections within {STARTUP:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("log"));
    }
}

/// `program` as the `postgres` user when this is root, else as this user.
fn as_server_user(program: &Path) -> Command {
    if !crate::prerequisites::is_root() {
        return Command::new(program);
    }
    let mut command = Command::new("runuser");
    command.args(["-u", "postgres", "--"]).arg(program);
    command
}

/// The servers of a test run, and what tells the tests where they are.
pub struct Servers {
    sink: PostgresServer,
    stock: PostgresServer,
}

impl Servers {
    pub fn start() -> Result<Self, String> {
        Ok(Servers {
            sink: PostgresServer::start(64)?,
            stock: PostgresServer::start(0)?,
        })
    }

    /// Points the PostgreSQL test cases at the servers; they fail rather
    /// than skip if they cannot reach them.
    pub fn configure(&self, cargo: &mut Command) {
        cargo
            .env("TIDEMARK_TEST_POSTGRES", self.sink.url())
            .env("TIDEMARK_TEST_POSTGRES_STOCK", self.stock.url())
            .env("TIDEMARK_REQUIRE_POSTGRES", "1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_server_accepts_connections_and_is_gone_when_dropped() {
        let Some(bin) = bin_dir() else {
            eprintln!("skipped: PostgreSQL is not installed");
            return;
        };
        let server = PostgresServer::start(3).unwrap();
        let setting = Command::new(bin.join("psql"))
            .args([&server.url(), "-Atc", "SHOW max_prepared_transactions"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&setting.stdout).trim(), "3");
        let dir = server.dir.clone();
        drop(server);
        assert!(!dir.exists());
    }
}
