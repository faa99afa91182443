//! moto's S3 server on a free loopback port for the length of a test run,
//! with a bucket the S3 test cases write under.

use crate::prerequisites::python;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BUCKET: &str = "tidemark-ci";
/// How long moto may take to answer after it was started.
const STARTUP: Duration = Duration::from_secs(60);

/// A running moto server; stopped when dropped.
pub struct MotoServer {
    child: Child,
    endpoint: String,
    log: std::path::PathBuf,
}

impl MotoServer {
    /// Starts moto and creates the bucket; fails with moto's output if it
    /// does not answer within a minute.
    pub fn start() -> Result<Self, String> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port for the S3 server: {e}"))?
            .port();
        let log = std::env::temp_dir().join(format!("tidemark-moto-{port}.log"));
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start moto: {e}"))?;
        let mut server = MotoServer {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + STARTUP;
        loop {
            match create_bucket(port) {
                Ok(()) => return Ok(server),
                Err(e) if Instant::now() > deadline => {
                    return Err(server.failure(&format!("did not answer within {STARTUP:?}: {e}")))
                }
                Err(_) => {}
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(server.failure(&format!("exited ({status})")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn failure(&self, what: &str) -> String {
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("the S3 server (moto) {what}:\n{output}")
    }

    /// Points the S3 test cases at this server; they fail rather than skip
    /// if they cannot reach it.
    pub fn configure(&self, cargo: &mut Command) {
        cargo
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ALLOW_HTTP", "true")
            .env("TIDEMARK_TEST_S3", format!("s3://{BUCKET}/checkpoints"))
            .env("TIDEMARK_REQUIRE_S3", "1");
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `PUT /BUCKET`: creates the bucket, and proves the server answers.
fn create_bucket(port: u16) -> Result<(), String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    match status_code(&response) {
        Some(200) => Ok(()),
        _ => Err(response.lines().next().unwrap_or("no answer").to_owned()),
    }
}

/// The status code of an HTTP/1.x response.
fn status_code(response: &str) -> Option<u16> {
    let mut parts = response.lines().next()?.split_whitespace();
    parts.next()?.starts_with("HTTP/1.").then_some(())?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::status_code;

    #[test]
    fn reads_the_status_of_a_response() {
        assert_eq!(
            status_code("HTTP/1.1 200 OK\r\nServer: x\r\n\r\n"),
            Some(200)
        );
        assert_eq!(status_code("HTTP/1.0 409 Conflict\r\n"), Some(409));
        assert_eq!(status_code("SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code(""), None);
    }
}
