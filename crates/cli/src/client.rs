//! `tidemark savepoint`, `stop` and `checkpoints`, and what `rescale`
//! shares with them: clients of a running
//! job's REST API (`run --http`), like `flink savepoint` and `flink stop`.
//! They speak Flink's REST API, so they work against a Flink JobManager
//! as well.

use super::CliError;
use clap::Args;
use serde_json::{json, Value};
use std::fmt::Write;
use std::time::{Duration, Instant};
use tidemark_actors::http::HttpToken;

/// Where the job is.
#[derive(Clone, Debug, Args)]
pub struct Connect {
    /// The job's REST API, as `run --http` serves it (`http://127.0.0.1:8081`).
    #[arg(long)]
    pub url: String,
    /// The job's id (32 hex characters) [default: the one running job].
    #[arg(long)]
    pub job: Option<String>,
    /// A file holding the API's token (the job's --http-token-file), sent
    /// as `Authorization: Bearer TOKEN`.
    #[arg(long, value_name = "FILE")]
    pub http_token_file: Option<std::path::PathBuf>,
    /// The CA certificates (PEM) an `https://` URL's certificate must
    /// chain to (the job's --http-tls-cert).
    #[arg(long, value_name = "FILE")]
    pub http_ca: Option<std::path::PathBuf>,
    /// Send the token over plain HTTP to a host beyond loopback: only on a
    /// network you trust.
    #[arg(long)]
    pub insecure: bool,
}

/// `tidemark savepoint` and `tidemark stop`.
#[derive(Clone, Debug, Args)]
pub struct SavepointArgs {
    /// The job.
    #[command(flatten)]
    pub connect: Connect,
    /// Where the savepoint goes, a path or URL [default: the job's
    /// --savepoint-dir].
    #[arg(long)]
    pub target: Option<String>,
    /// How long to wait for the savepoint.
    #[arg(long, default_value = "10min", value_parser = crate::config::values::flag_duration)]
    pub timeout: Duration,
}

/// `tidemark checkpoints`.
#[derive(Clone, Debug, Args)]
pub struct CheckpointsArgs {
    /// The job.
    #[command(flatten)]
    pub connect: Connect,
}

/// Whether the authority and path after a URL's `scheme://` name this
/// machine.
fn loopback(rest: &str) -> bool {
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// TLS that trusts the CA certificates in `ca`, which an `https://` URL
/// needs: a job's certificate is its operator's, not a public CA's.
fn trusting(ca: Option<&std::path::Path>) -> Result<ureq::tls::TlsConfig, CliError> {
    let usage = |problem: String| CliError::Usage {
        argument: "--http-ca".into(),
        problem,
    };
    let ca = ca.ok_or_else(|| {
        usage("an https:// URL needs the CA certificates its server's chains to".into())
    })?;
    let roots = tidemark_actors::tls::ca_certificates(ca)
        .map_err(|e| usage(e.to_string()))?
        .iter()
        .map(|der| ureq::tls::Certificate::from_der(der.as_ref()).to_owned())
        .collect();
    Ok(ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(roots)))
        .unversioned_rustls_crypto_provider(tidemark_actors::tls::provider())
        .build())
}

/// A client of one job's REST API.
pub(crate) struct Client {
    agent: ureq::Agent,
    url: String,
    /// The `Authorization` header every request carries, if any.
    authorization: Option<String>,
}

impl Client {
    pub(crate) fn new(connect: &Connect) -> Result<Self, CliError> {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)));
        let (scheme, rest) = connect.url.split_once("://").unwrap_or(("", &connect.url));
        let https = scheme.eq_ignore_ascii_case("https");
        if https {
            config = config.tls_config(trusting(connect.http_ca.as_deref())?);
        }
        let agent = config.build().into();
        let token = HttpToken::read_optional(connect.http_token_file.as_deref()).map_err(|e| {
            CliError::Usage {
                argument: "--http-token-file".into(),
                problem: e.to_string(),
            }
        })?;
        if token.is_some() && !https && !connect.insecure && !loopback(rest) {
            return Err(CliError::Usage {
                argument: "--url".into(),
                problem: format!("{} would carry the token in the clear: use https:// (with --http-ca), or --insecure on a network you trust", connect.url),
            });
        }
        Ok(Client {
            agent,
            url: connect.url.trim_end_matches('/').to_owned(),
            authorization: token.map(|t| t.bearer()),
        })
    }

    pub(crate) fn fail(&self, problem: impl std::fmt::Display) -> CliError {
        CliError::Rest {
            url: self.url.clone(),
            problem: problem.to_string(),
        }
    }

    fn authorized<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.authorization {
            Some(value) => request.header("authorization", value),
            None => request,
        }
    }

    /// Sends a request and reads a JSON answer; an error status becomes
    /// the errors the server gave.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.url);
        let response = match (method, body) {
            ("GET", _) => self.authorized(self.agent.get(&url)).call(),
            ("PUT", Some(body)) => self
                .authorized(self.agent.put(&url))
                .header("content-type", "application/json")
                .send(body.to_string()),
            (_, Some(body)) => self
                .authorized(self.agent.post(&url))
                .header("content-type", "application/json")
                .send(body.to_string()),
            (_, None) => self.authorized(self.agent.post(&url)).send_empty(),
        };
        let mut response = response.map_err(|e| self.fail(format!("cannot reach it: {e}")))?;
        let status = response.status();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| self.fail(format!("cannot read its answer: {e}")))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| {
            self.fail(format!(
                "{method} {path} answered {status} with no JSON ({e})"
            ))
        })?;
        if status.is_success() {
            return Ok(value);
        }
        let errors: Vec<&str> = value["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        Err(self.fail(format!("{method} {path}: {status}: {}", errors.join("; "))))
    }

    /// The job asked for, or the one job running.
    pub(crate) fn job(&self, job: Option<&str>) -> Result<String, CliError> {
        if let Some(job) = job {
            return Ok(job.to_owned());
        }
        let overview = self.call("GET", "/jobs/overview", None)?;
        let running: Vec<&str> = overview["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j["state"] == "RUNNING")
            .filter_map(|j| j["jid"].as_str())
            .collect();
        match running.as_slice() {
            [one] => Ok((*one).to_owned()),
            [] => Err(self.fail("no job is running there")),
            _ => Err(self.fail(format!(
                "several jobs run there; name one with --job: {}",
                running.join(", ")
            ))),
        }
    }
}

/// Triggers a savepoint (`stop`: one that ends the job) and waits for it;
/// returns its location.
pub fn savepoint(args: &SavepointArgs, stop: bool) -> Result<String, CliError> {
    let client = Client::new(&args.connect)?;
    let job = client.job(args.connect.job.as_deref())?;
    let (path, body) = if stop {
        (
            format!("/jobs/{job}/stop"),
            json!({ "targetDirectory": args.target, "drain": false }),
        )
    } else {
        (
            format!("/jobs/{job}/savepoints"),
            json!({ "target-directory": args.target, "cancel-job": false }),
        )
    };
    let triggered = client.call("POST", &path, Some(body))?;
    let Some(request) = triggered["request-id"].as_str() else {
        return Err(client.fail(format!("POST {path} answered no request-id: {triggered}")));
    };
    let deadline = Instant::now() + args.timeout;
    let status = format!("/jobs/{job}/savepoints/{request}");
    loop {
        let answer = client.call("GET", &status, None).map_err(|e| match stop {
            // The job ends with the savepoint, and its server with it.
            true => client.fail(format!(
                "the job went away before it reported the savepoint ({e}); its output tells whether it stopped"
            )),
            false => e,
        })?;
        if answer["status"]["id"] == "COMPLETED" {
            let operation = &answer["operation"];
            if let Some(location) = operation["location"].as_str() {
                return Ok(location.to_owned());
            }
            let cause = operation["failure-cause"]["stack-trace"]
                .as_str()
                .unwrap_or("no cause given");
            return Err(client.fail(format!("the savepoint failed: {cause}")));
        }
        if Instant::now() >= deadline {
            return Err(client.fail(format!(
                "the savepoint did not complete within {}",
                humantime::format_duration(args.timeout)
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The job's checkpoint history as a table, newest first.
pub fn checkpoints(args: &CheckpointsArgs) -> Result<String, CliError> {
    let client = Client::new(&args.connect)?;
    let job = client.job(args.connect.job.as_deref())?;
    let stats = client.call("GET", &format!("/jobs/{job}/checkpoints"), None)?;
    Ok(table(&stats))
}

fn size(bytes: &Value) -> String {
    let b = bytes.as_u64().unwrap_or(0) as f64;
    match b {
        b if b >= 1024.0 * 1024.0 => format!("{:.1} MiB", b / 1024.0 / 1024.0),
        b if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b => format!("{b} B"),
    }
}

/// Renders Flink's `/checkpoints` answer.
fn table(stats: &Value) -> String {
    let c = &stats["counts"];
    let mut out = format!(
        "{} checkpoints: {} completed, {} failed, {} in progress, {} restored\n",
        c["total"], c["completed"], c["failed"], c["in_progress"], c["restored"]
    );
    let header = [
        "ID",
        "STATUS",
        "TYPE",
        "ACKS",
        "DURATION",
        "STATE",
        "CHECKPOINTED",
        "PATH / FAILURE",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for entry in stats["history"].as_array().into_iter().flatten() {
        let detail = entry["failure_message"]
            .as_str()
            .or(entry["external_path"].as_str())
            .unwrap_or("");
        rows.push(vec![
            entry["id"].to_string(),
            entry["status"].as_str().unwrap_or("").to_owned(),
            entry["checkpoint_type"].as_str().unwrap_or("").to_owned(),
            format!(
                "{}/{}",
                entry["num_acknowledged_subtasks"], entry["num_subtasks"]
            ),
            format!("{} ms", entry["end_to_end_duration"]),
            size(&entry["state_size"]),
            size(&entry["checkpointed_size"]),
            detail.to_owned(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_machine_is_loopback() {
        for here in [
            "127.0.0.1:8081",
            "localhost:8081/v1/jobs",
            "[::1]:8081",
            "LOCALHOST",
        ] {
            assert!(loopback(here), "{here}");
        }
        for there in [
            "192.0.2.7:8081",
            "tidemark.example:8081",
            "[2001:db8::1]:80",
            "127.0.0.1.example:80",
        ] {
            assert!(!loopback(there), "{there}");
        }
    }

    #[test]
    fn the_table_lists_the_history_with_sizes_and_failures() {
        let stats = json!({
            "counts": {"total": 2, "completed": 1, "failed": 1, "in_progress": 0, "restored": 0},
            "history": [
                {"id": 2, "status": "FAILED", "checkpoint_type": "CHECKPOINT", "num_acknowledged_subtasks": 1,
                 "num_subtasks": 4, "end_to_end_duration": 10, "state_size": 0, "checkpointed_size": 0,
                 "failure_message": "declined by op-1#0"},
                {"id": 1, "status": "COMPLETED", "checkpoint_type": "SAVEPOINT", "num_acknowledged_subtasks": 4,
                 "num_subtasks": 4, "end_to_end_duration": 250, "state_size": 3145728, "checkpointed_size": 2048,
                 "external_path": "file:///sp/savepoint-1"},
            ],
        });
        let table = table(&stats);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "2 checkpoints: 1 completed, 1 failed, 0 in progress, 0 restored"
        );
        assert!(lines[1].starts_with("ID  STATUS"), "{table}");
        assert!(
            lines[2].contains("FAILED")
                && lines[2].contains("1/4")
                && lines[2].ends_with("declined by op-1#0")
        );
        assert!(
            lines[3].contains("3.0 MiB")
                && lines[3].contains("2.0 KiB")
                && lines[3].ends_with("file:///sp/savepoint-1")
        );
    }
}
