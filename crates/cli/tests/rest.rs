//! The `tidemark` binary's REST API as clients reach it. Stop-with-
//! savepoint as Flink's own `flink stop` drives it: the client learns the
//! savepoint's location even when it first asks after the stop has ended
//! the job, because the process keeps serving until the outcome was read.
//! A server beyond loopback: refused without a token or in the clear
//! (unless told the network is trusted), with one it answers only
//! requests that present it, and over TLS its clients check its
//! certificate.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

/// A `tidemark run wordcount --http …` process, slow enough to be stopped
/// long before its input ends.
struct Job {
    child: Child,
    base: String,
    jid: String,
    agent: ureq::Agent,
    /// The `Authorization` header its requests carry.
    authorization: Option<String>,
    dir: tempfile::TempDir,
    savepoints: PathBuf,
}

/// `tidemark run wordcount` at a limited rate, with checkpoints and a
/// savepoint directory under `dir`, and `extra` arguments.
fn wordcount(dir: &Path, extra: &[&str]) -> Command {
    wordcount_of(
        dir,
        &["--records=40000000", "--keys=3000", "--rate=200000"],
        extra,
    )
}

/// [`wordcount`] of the `size` given (records, keys, rate).
fn wordcount_of(dir: &Path, size: &[&str], extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidemark"));
    command
        .args(["run", "wordcount", "--parallelism=2", "--json"])
        .args(size)
        .args(["--checkpoint-interval=200ms"])
        .arg(format!("--checkpoint-dir={}", dir.join("ck").display()))
        .arg(format!(
            "--savepoint-dir={}",
            dir.join("savepoints").display()
        ))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

impl Job {
    /// Serves on loopback, where no token is needed.
    fn start() -> Job {
        Job::start_with(&["--http=0"], None)
    }

    /// `extra` names where to serve; requests carry `authorization`.
    fn start_with(extra: &[&str], authorization: Option<String>) -> Job {
        Job::launch(|dir| wordcount(dir, extra), authorization)
    }

    /// Runs the command `run` makes for a directory of its own, and waits
    /// for the job to run and complete a checkpoint.
    fn launch(run: impl FnOnce(&Path) -> Command, authorization: Option<String>) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let savepoints = dir.path().join("savepoints");
        let mut child = run(dir.path()).spawn().unwrap();
        // A server on every address is reached here through loopback.
        let base = announced_address(child.stderr.take().unwrap()).replace("0.0.0.0", "127.0.0.1");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let mut job = Job {
            child,
            base,
            jid: String::new(),
            agent,
            authorization,
            dir,
            savepoints,
        };
        job.jid = eventually("the job to run", || {
            let overview = job.get("/v1/jobs/overview").ok()?;
            let listed = &overview["jobs"][0];
            (listed["state"] == "RUNNING").then(|| listed["jid"].as_str().unwrap().to_owned())
        });
        // A stop completes only with a savepoint, which waits for the
        // first checkpoint's deployment: let one complete.
        eventually("a completed checkpoint", || {
            let counts = job.get(&format!("/v1/jobs/{}/checkpoints", job.jid)).ok()?;
            (counts["counts"]["completed"].as_u64()? > 0).then_some(())
        });
        job
    }

    /// GETs `path` with `authorization`: its status and body.
    fn request(&self, path: &str, authorization: Option<&str>) -> Result<(u16, String), String> {
        let mut request = self.agent.get(format!("{}{path}", self.base));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let mut response = request.call().map_err(|e| format!("GET {path}: {e}"))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        Ok((status, text))
    }

    fn answer(&self, path: &str, authorization: Option<&str>) -> (u16, String) {
        self.request(path, authorization).unwrap()
    }

    /// GETs `path` as the job's clients do, as JSON.
    fn get(&self, path: &str) -> Result<Value, String> {
        let (_, text) = self.request(path, self.authorization.as_deref())?;
        serde_json::from_str(&text).map_err(|e| format!("GET {path}: {text:?}: {e}"))
    }

    /// Waits for the process to exit and returns its JSON report.
    fn report(mut self) -> Value {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "tidemark run exited with {status}");
        let mut stdout = String::new();
        std::io::Read::read_to_string(&mut self.child.stdout.take().unwrap(), &mut stdout).unwrap();
        serde_json::from_str(stdout.lines().last().expect("a report")).unwrap()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The REST API's address, from the line stderr names it on; the rest of
/// stderr is drained on a thread so that the process never blocks on it.
fn announced_address(stderr: ChildStderr) -> String {
    let mut lines = BufReader::new(stderr).lines();
    let prefix = "tidemark: the job's REST API and page are at ";
    let base = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix(prefix)
                .map(|a| a.trim_end_matches('/').to_owned())
        })
        .expect("stderr names the REST API's address");
    std::thread::spawn(move || lines.for_each(drop));
    base
}

/// Polls `check` until it gives a value; the deadline only bounds a hang.
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn savepoint_written(location: &str, savepoints: &Path) {
    let dir = Path::new(location.strip_prefix("file://").unwrap_or(location));
    assert!(dir.starts_with(savepoints), "{location}");
    assert!(
        dir.join("_metadata").is_file(),
        "{location} has no _metadata"
    );
}

#[test]
fn a_stops_outcome_is_served_after_the_stop_ended_the_job() {
    let job = Job::start();
    let target = format!("file://{}", job.savepoints.display());
    let mut response = job
        .agent
        .post(format!("{}/v1/jobs/{}/stop", job.base, job.jid))
        .header("content-type", "application/json")
        .send(format!(
            r#"{{"targetDirectory": "{target}", "drain": false}}"#
        ))
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let accepted: Value =
        serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
    let trigger = accepted["request-id"].as_str().unwrap().to_owned();
    // The client asks only once the job has ended, as a slow client would.
    eventually("the stop to end the job", || {
        match job.get(&format!("/v1/jobs/{}", job.jid)) {
            Ok(job) => (job["state"] == "FINISHED").then_some(()),
            Err(e) => panic!("the REST API went away before the stop's outcome was read: {e}"),
        }
    });
    let path = format!("/v1/jobs/{}/savepoints/{trigger}", job.jid);
    let outcome = job.get(&path).unwrap();
    assert_eq!(outcome["status"]["id"], "COMPLETED", "{outcome}");
    let location = outcome["operation"]["location"]
        .as_str()
        .unwrap()
        .to_owned();
    savepoint_written(&location, &job.savepoints);
    let report = job.report();
    assert_eq!(report["savepoints_completed"], 1, "{report}");
}

/// Requirements no job can run at are refused with the reason, and leave
/// the job as it was; asking for the parallelism it runs at is no rescale.
#[test]
fn requirements_no_job_can_run_at_are_refused_and_change_nothing() {
    let job = Job::start();
    let path = format!("/v1/jobs/{}/resource-requirements", job.jid);
    let asked = job.get(&path).unwrap();
    let vertex = asked.as_object().unwrap().keys().next().unwrap().clone();
    let bounds = |lower: u32, upper: u32| serde_json::json!({ &vertex: {"parallelism": {"lowerBound": lower, "upperBound": upper}} });
    let unknown = format!("{:032x}", 7);
    let refused = [
        (
            serde_json::json!({}),
            400,
            "does not specify resource requirements",
        ),
        (bounds(3, 2), 400, "above the upper bound"),
        (bounds(1, 1000), 400, "max parallelism"),
        (bounds(0, 0), 400, "parallelism 0"),
        (
            serde_json::json!({ &unknown: {"parallelism": {"lowerBound": 1, "upperBound": 2}} }),
            404,
            "has no vertex",
        ),
    ];
    for (body, status, reason) in refused {
        let (got, text) = job.put(&path, body.clone());
        assert_eq!(got, status, "{body}: {text}");
        assert!(text.contains(reason), "{body}: {text}");
    }
    assert_eq!(job.get(&path).unwrap(), asked, "nothing changed");
    let history = job.get(&format!("/v1/jobs/{}/rescales/history", job.jid));
    assert_eq!(history.unwrap(), serde_json::json!([]));
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["rescale", "--url", &job.base, "--parallelism=2"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert_eq!(said.trim(), "the job already runs at parallelism 2");
}

#[test]
fn a_job_rescaled_five_times_while_failing_commits_every_update_once() {
    rescaled_five_times_while_failing(&[]);
}

#[test]
fn a_job_over_worker_processes_rescaled_five_times_while_failing_commits_every_update_once() {
    rescaled_five_times_while_failing(&["--workers=2"]);
}

/// Five rescales of a running job (with `extra` arguments) with failures
/// injected, each carried out from a checkpoint: three by `tidemark
/// rescale`, two by Flink's `PUT /jobs/{id}/resource-requirements`. The
/// job ends with every update committed exactly once, the history holds
/// every rescale as completed, and the job's vertices report each
/// parallelism in turn.
fn rescaled_five_times_while_failing(extra: &[&str]) {
    const RECORDS: u64 = 4_000_000;
    const KEYS: u64 = 3_000;
    let records = format!("--records={RECORDS}");
    let keys = format!("--keys={KEYS}");
    let size = [records.as_str(), &keys, "--seed=7", "--rate=400000"];
    let mut job = Job::launch(
        |dir| {
            let output = format!("--output={}", dir.join("out").display());
            let mut flags = vec!["--http=0", "--emit=updates", &output, "--inject-failures=3"];
            flags.extend_from_slice(extra);
            wordcount_of(dir, &size, &flags)
        },
        None,
    );
    let parallelisms = [3, 1, 4, 2, 3];
    for (i, p) in parallelisms.into_iter().enumerate() {
        if i % 2 == 0 {
            let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
                .args(["rescale", "--url", &job.base, &format!("--parallelism={p}")])
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            let complaint = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "rescale to {p}: {said}{complaint}");
            assert!(
                said.starts_with(&format!("rescaled to parallelism {p} in ")),
                "{said}"
            );
        } else {
            job.require_parallelism(p);
        }
        eventually("the vertices at the new parallelism", || {
            let vertices = job.get(&format!("/v1/jobs/{}", job.jid)).ok()?["vertices"].clone();
            let all = vertices.as_array()?.iter().all(|v| v["parallelism"] == p);
            all.then_some(())
        });
    }
    let history = job
        .get(&format!("/v1/jobs/{}/rescales/history", job.jid))
        .unwrap();
    let states: Vec<&Value> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["terminalState"])
        .collect();
    let completed = Value::from("COMPLETED");
    assert_eq!(states, vec![&completed; parallelisms.len()], "{history}");
    let summary = job
        .get(&format!("/v1/jobs/{}/rescales/summary", job.jid))
        .unwrap();
    assert_eq!(summary["rescalesCounts"]["completed"], 5, "{summary}");
    let took = &summary["completedRescalesDurationStatsInMillis"];
    let (min, max) = (took["min"].as_u64().unwrap(), took["max"].as_u64().unwrap());
    assert!(0 < min && min <= max, "{summary}");
    // The newest: from 2 to 3, its pause the span the job restarted.
    let uuid = history[0]["rescaleUuid"].as_str().unwrap();
    let details = job
        .get(&format!("/v1/jobs/{}/rescales/details/{uuid}", job.jid))
        .unwrap();
    for vertex in details["vertices"].as_object().unwrap().values() {
        assert_eq!(vertex["preRescaleParallelism"], 2, "{details}");
        assert_eq!(vertex["postRescaleParallelism"], 3, "{details}");
    }
    assert_eq!(
        details["schedulerStates"][1]["state"], "Restarting",
        "{details}"
    );
    let output = job.dir.path().join("out");
    let dir = std::mem::replace(&mut job.dir, tempfile::tempdir().unwrap());
    let report = job.report();
    assert!(report["restarts"].as_u64().unwrap() >= 3, "{report}");
    let context = format!("five live rescales {extra:?}");
    tidemark_testkit::assert_updates_exactly_once(&output, RECORDS, KEYS, 7, &context);
    drop(dir);
}

impl Job {
    /// PUTs `body` as JSON to `path`: the status and the answer.
    fn put(&self, path: &str, body: Value) -> (u16, String) {
        let mut response = self
            .agent
            .put(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        let text = response.body_mut().read_to_string().unwrap();
        (response.status().as_u16(), text)
    }

    /// Asks every vertex for parallelism `p` over Flink's REST API, and
    /// waits for the rescale to complete.
    fn require_parallelism(&self, p: u32) {
        let job = self.get(&format!("/v1/jobs/{}", self.jid)).unwrap();
        let requirements: serde_json::Map<String, Value> = job["vertices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let bounds = serde_json::json!({"parallelism": {"lowerBound": 1, "upperBound": p}});
                (v["id"].as_str().unwrap().to_owned(), bounds)
            })
            .collect();
        let path = format!("/v1/jobs/{}/resource-requirements", self.jid);
        let (status, body) = self.put(&path, Value::Object(requirements));
        assert_eq!(status, 200, "{body}");
        let asked = self.get(&path).unwrap();
        assert!(
            asked
                .as_object()
                .unwrap()
                .values()
                .all(|v| v["parallelism"]["upperBound"] == p),
            "{asked}"
        );
        eventually("the rescale to complete", || {
            let history = self
                .get(&format!("/v1/jobs/{}/rescales/history", self.jid))
                .ok()?;
            (history[0]["terminalState"] == "COMPLETED").then_some(())
        });
    }
}

/// Flink 2.3's own command line, installed by `cargo xtask test` (from
/// PyPI's `apache-flink`, with a Java runtime), named by
/// `TIDEMARK_FLINK_CLI`.
fn flink_cli() -> Option<PathBuf> {
    let cli = std::env::var_os("TIDEMARK_FLINK_CLI").map(PathBuf::from);
    if cli.is_none() {
        assert!(
            std::env::var_os("TIDEMARK_REQUIRE_FLINK_CLI").is_none(),
            "TIDEMARK_REQUIRE_FLINK_CLI is set but TIDEMARK_FLINK_CLI is not"
        );
        eprintln!("SKIPPED: Flink's command line is not installed (cargo xtask test installs it)");
    }
    cli
}

#[test]
fn flinks_own_stop_command_stops_the_job_with_a_savepoint() {
    let Some(flink) = flink_cli() else { return };
    let job = Job::start();
    let address = job.base.trim_start_matches("http://").to_owned();
    let target = format!("file://{}", job.savepoints.display());
    let out = Command::new(&flink)
        .args(["stop", "--savepointPath", &target, &job.jid, "-m", &address])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "flink stop: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let location = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Savepoint completed. Path: "))
        .unwrap_or_else(|| panic!("flink stop printed no savepoint path: {stdout}"))
        .to_owned();
    savepoint_written(&location, &job.savepoints);
    let report = job.report();
    assert_eq!(report["savepoints_completed"], 1, "{report}");
}

/// A token file in `dir`.
fn token_file(dir: &Path, token: &str) -> PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

#[test]
fn a_server_beyond_loopback_is_refused_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = wordcount(dir.path(), &["--http=0.0.0.0:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--http") && stderr.contains("--http-token-file"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing ran"
    );
}

/// Beyond loopback the token would travel in the clear without TLS: a
/// server is refused unless it has TLS or is told the network is trusted.
#[test]
fn a_server_beyond_loopback_is_refused_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "t0ken");
    let flag = format!("--http-token-file={}", token.display());
    let out = wordcount(dir.path(), &["--http=0.0.0.0:0", &flag])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--http-tls-cert") && stderr.contains("--insecure"),
        "{stderr}"
    );
    assert!(!dir.path().join("ck").exists(), "nothing ran");
}

/// With TLS the page and API are at an https:// URL; the command line's
/// clients reach it trusting the CA given, and refuse a certificate of
/// another CA or an https:// URL with no CA to check it against.
#[test]
fn beyond_loopback_over_tls_the_clients_check_the_servers_certificate() {
    use tidemark_testkit::pki::TestCa;
    let secrets = tempfile::tempdir().unwrap();
    let (ours, theirs) = (
        TestCa::new(secrets.path(), "ours"),
        TestCa::new(secrets.path(), "theirs"),
    );
    let server = ours.issue("rest");
    let token = format!(
        "--http-token-file={}",
        token_file(secrets.path(), "s3cret").display()
    );
    let (cert, key) = (
        format!("--http-tls-cert={}", server.cert.display()),
        format!("--http-tls-key={}", server.key.display()),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut child = wordcount(dir.path(), &["--http=0.0.0.0:0", &token, &cert, &key])
        .spawn()
        .unwrap();
    let base = announced_address(child.stderr.take().unwrap()).replace("0.0.0.0", "127.0.0.1");
    assert!(base.starts_with("https://"), "{base}");
    let checkpoints = |url: &str, ca: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tidemark"));
        command.args(["checkpoints", "--url", url, &token]);
        if let Some(ca) = ca {
            command.arg(format!("--http-ca={}", ca.display()));
        }
        command.output().unwrap()
    };
    eventually("the job's checkpoints over TLS", || {
        checkpoints(&base, Some(&ours.ca))
            .status
            .success()
            .then_some(())
    });
    let refused = checkpoints(&base, Some(&theirs.ca));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("certificate") || said.contains("issuer"),
        "{said}"
    );
    for scheme in ["https://", "HTTPS://"] {
        let unchecked = checkpoints(&base.replace("https://", scheme), None);
        let said = String::from_utf8_lossy(&unchecked.stderr);
        assert_eq!(unchecked.status.code(), Some(2), "{said}");
        assert!(said.contains("--http-ca"), "{said}");
    }
    // The clients send no token in the clear beyond loopback (refused
    // before they connect anywhere).
    let clear = checkpoints("http://192.0.2.7:8081", None);
    let said = String::from_utf8_lossy(&clear.stderr);
    assert_eq!(clear.status.code(), Some(2), "{said}");
    assert!(said.contains("--insecure"), "{said}");
    let plain = checkpoints(&base.replace("https://", "http://"), None);
    assert!(!plain.status.success(), "plain HTTP is not answered");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn beyond_loopback_only_requests_with_the_token_are_answered() {
    let secrets = tempfile::tempdir().unwrap();
    let token = "Zm9v-not-guessable-7";
    let file = token_file(secrets.path(), token);
    let flag = format!("--http-token-file={}", file.display());
    let bearer = format!("Bearer {token}");
    // Over plain HTTP, which beyond loopback takes --insecure.
    let job = Job::start_with(
        &["--http=0.0.0.0:0", &flag, "--insecure"],
        Some(bearer.clone()),
    );
    let jid = job.jid.clone();
    use base64::Engine;
    let basic = |user_password: &str| {
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_password);
        format!("Basic {encoded}")
    };
    // Refused: no header, another token, the token as a Basic user name.
    let wrong = [
        None,
        Some("Bearer Zm9v-not-guessable-8".to_owned()),
        Some(basic(&format!("{token}:"))),
    ];
    for authorization in &wrong {
        for path in [
            "/",
            "/v1/jobs/overview",
            &format!("/v1/jobs/{jid}/checkpoints"),
            "/metrics",
        ] {
            let (status, body) = job.answer(path, authorization.as_deref());
            assert_eq!(status, 401, "{path} with {authorization:?}: {body}");
            assert!(
                !body.contains(&jid) && !body.contains("wordcount"),
                "{path}: {body}"
            );
        }
    }
    // A refused savepoint creates nothing, not even its directory.
    let target = job.dir.path().join("refused");
    let mut response = job
        .agent
        .post(format!("{}/v1/jobs/{jid}/savepoints", job.base))
        .header("content-type", "application/json")
        .send(format!(r#"{{"target-directory": "{}"}}"#, target.display()))
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let challenges: Vec<_> = response
        .headers()
        .get_all("www-authenticate")
        .iter()
        .collect();
    assert!(
        challenges
            .iter()
            .any(|c| c.to_str().unwrap().starts_with("Basic")),
        "{challenges:?}"
    );
    assert!(!target.exists());
    let _ = response.body_mut().read_to_string();
    // Admitted: the token as bearer, or as the password a browser sends.
    for authorization in [bearer, basic(&format!("someone:{token}"))] {
        let (status, body) = job.answer("/", Some(&authorization));
        assert_eq!(status, 200, "{authorization}: {body}");
        let (status, body) = job.answer("/v1/jobs/overview", Some(&authorization));
        assert_eq!((status, body.contains(&jid)), (200, true), "{body}");
    }
    // The command line's client sends the token from its file.
    let client = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["checkpoints", "--url", &job.base])
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = client(&[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    let listed = client(&[&flag]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    // So does Flink's own, given the header in its environment.
    if let Some(flink) = flink_cli() {
        let address = job.base.trim_start_matches("http://").to_owned();
        let out = Command::new(&flink)
            .args(["list", "-r", "-m", &address])
            .env(
                "FLINK_REST_CLIENT_HEADERS",
                format!("Authorization:Bearer {token}"),
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&jid),
            "flink list: {stdout}"
        );
    }
}

/// A subtask on a worker process reports its input watermark to the
/// driver, whose REST API serves it as it does for subtasks of its own.
#[test]
fn worker_processes_report_their_subtasks_watermarks() {
    let job = Job::launch(
        |dir| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_tidemark"));
            command
                .args(["run", "windows", "--records=40000000", "--keys=1000"])
                .args(["--parallelism=2", "--rate=100000", "--workers=2"])
                .args(["--checkpoint-interval=200ms", "--http=0"])
                .arg(format!("--checkpoint-dir={}", dir.join("ck").display()))
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            command
        },
        None,
    );
    let vertices = job.get(&format!("/v1/jobs/{}", job.jid)).unwrap()["vertices"].clone();
    let ids: Vec<String> = vertices
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect();
    eventually("a watermark at every subtask behind the sources", || {
        let reported: Vec<Value> = ids
            .iter()
            .map(|id| job.get(&format!("/v1/jobs/{}/vertices/{id}/watermarks", job.jid)))
            .collect::<Result<_, _>>()
            .ok()?;
        let values: Vec<i64> = reported
            .iter()
            .flat_map(|list| list.as_array().unwrap().iter())
            .map(|m| m["value"].as_str().unwrap().parse().unwrap())
            .collect();
        (!values.is_empty() && values.iter().all(|&w| w > i64::MIN)).then_some(())
    });
}
