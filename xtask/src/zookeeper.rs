//! A ZooKeeper server for the length of a test run: the server of
//! Debian's `zookeeper` package, standalone, on a free loopback port, its
//! data in a temporary directory. Its tick is short, so that a test may
//! ask for sessions that expire within a second or two.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server may take to answer.
const STARTUP: Duration = Duration::from_secs(60);

/// The server's classpath: `ZOOKEEPER_CLASSPATH` if set, else Debian's.
pub fn classpath() -> Option<String> {
    if let Ok(classpath) = std::env::var("ZOOKEEPER_CLASSPATH") {
        return Some(classpath);
    }
    let jar = PathBuf::from("/usr/share/java/zookeeper.jar");
    jar.is_file()
        .then(|| format!("/etc/zookeeper/conf:{}", jar.display()))
}

/// A running server; stopped, and its data deleted, when dropped.
pub struct ZooKeeperServer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl ZooKeeperServer {
    pub fn start() -> Result<Self, String> {
        let classpath = classpath().ok_or("ZooKeeper's server is not installed")?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port for ZooKeeper: {e}"))?
            .port();
        let dir = std::env::temp_dir().join(format!("tidemark-zookeeper-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).map_err(|e| format!("{}: {e}", dir.display()))?;
        // Sessions from 0.5 s (two ticks) to a minute.
        let config = format!(
            "tickTime=250\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             minSessionTimeout=500\nmaxSessionTimeout=60000\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok\n",
            dir.join("data").display()
        );
        let cfg = dir.join("zoo.cfg");
        std::fs::write(&cfg, config).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let log = std::fs::File::create(dir.join("log")).map_err(|e| e.to_string())?;
        let child = Command::new("java")
            .args(["-Xmx256m", "-cp", &classpath])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start ZooKeeper's server (java): {e}"))?;
        let mut server = ZooKeeperServer { child, dir, port };
        server.wait_until_ready()?;
        Ok(server)
    }

    /// Waits until the server says `imok` to `ruok`.
    fn wait_until_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP;
        let failure = |what: String| {
            let output = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            format!("ZooKeeper {what}:\n{output}")
        };
        loop {
            if self.answers() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(failure(format!("exited ({status})")));
            }
            if Instant::now() > deadline {
                return Err(failure(format!("did not answer within {STARTUP:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut answer = String::new();
        stream.write_all(b"ruok").is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer == "imok"
    }

    /// Points the ZooKeeper test cases at the server; they fail rather
    /// than skip if they cannot reach it.
    pub fn configure(&self, cargo: &mut Command) {
        cargo
            .env(
                "TIDEMARK_TEST_ZOOKEEPER",
                format!("127.0.0.1:{}", self.port),
            )
            .env("TIDEMARK_REQUIRE_ZOOKEEPER", "1");
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_server_answers_and_is_gone_when_dropped() {
        if classpath().is_none() {
            eprintln!("skipped: ZooKeeper is not installed");
            return;
        }
        let server = ZooKeeperServer::start().unwrap();
        assert!(server.answers());
        let (dir, port) = (server.dir.clone(), server.port);
        drop(server);
        assert!(!dir.exists());
        assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err());
    }
}
