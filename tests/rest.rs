//! A running job operated over its REST API (`run --http`) with a real HTTP
//! client: Flink's shapes and field names, checkpoints, savepoints and stop
//! triggered over HTTP and restored exactly once, errors that leave the job
//! running, Prometheus metrics that parse, the requests Flink's own
//! command line sends, and the page rendered in headless Chromium.

use tidemark_testkit as common;

use common::assert_updates_exactly_once;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tidemark_cli::{self as cli, CliError, RunArgs, RunReport};

const RECORDS: u64 = 400_000;
const KEYS: u64 = 1_000;
const SEED: u64 = 17;

/// A client of the job's API.
struct Api {
    agent: ureq::Agent,
    base: String,
}

impl Api {
    fn new(port: u16) -> Self {
        Api {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(30)))
                .build()
                .into(),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    fn answer(
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<(u16, String), ureq::Error> {
        let mut response = response?;
        let status = response.status().as_u16();
        Ok((status, response.body_mut().read_to_string()?))
    }

    fn try_get(&self, path: &str) -> Result<(u16, String), ureq::Error> {
        Self::answer(self.agent.get(format!("{}{path}", self.base)).call())
    }

    fn json(path: &str, (status, text): (u16, String)) -> (u16, Value) {
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: {status} {text:?}: {e}"));
        (status, value)
    }

    fn get(&self, path: &str) -> (u16, Value) {
        Self::json(path, self.try_get(path).unwrap())
    }

    fn ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let response = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(body);
        Self::json(path, Self::answer(response).unwrap())
    }

    fn patch(&self, path: &str) -> (u16, Value) {
        let response = self
            .agent
            .patch(format!("{}{path}", self.base))
            .send_empty();
        Self::json(path, Self::answer(response).unwrap())
    }

    /// Polls an asynchronous operation until it completed.
    fn completed(&self, path: &str) -> Value {
        eventually(path, || {
            let answer = self.ok(path);
            (answer["status"]["id"] == "COMPLETED").then(|| answer["operation"].clone())
        })
    }
}

/// Polls `check` until it gives a value; the deadline only bounds a hang.
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A job running on a thread of this test, as `tidemark run` runs it.
struct Running {
    api: Api,
    job: JoinHandle<Result<RunReport, CliError>>,
    jid: String,
}

fn start(args: Vec<String>) -> Running {
    let port = free_port();
    let mut args = args;
    args.push(format!("--http=127.0.0.1:{port}"));
    let args = RunArgs::parse(args).unwrap();
    let job = std::thread::spawn(move || cli::run(&args));
    let api = Api::new(port);
    let jid = eventually("the REST API", || {
        let (_, text) = api.try_get("/v1/jobs/overview").ok()?;
        let overview: Value = serde_json::from_str(&text).ok()?;
        overview["jobs"][0]["jid"].as_str().map(str::to_owned)
    });
    Running { api, job, jid }
}

/// Wordcount at p=2 at a limited rate; a flag of `extra` replaces the
/// default of the same name.
fn wordcount(dirs: &Dirs, extra: &[&str]) -> Vec<String> {
    topology(&["wordcount", "--emit=updates"], dirs, extra)
}

/// Windows (1 s tumbling windows of event time) at p=2 at a limited rate,
/// 5 records a millisecond of event time: event time goes about as fast as
/// the clock. A flag of `extra` replaces the default of the same name.
fn windows(dirs: &Dirs, extra: &[&str]) -> Vec<String> {
    topology(
        &["windows", &format!("--events-per-ms={EVENTS_PER_MS}")],
        dirs,
        extra,
    )
}

const EVENTS_PER_MS: u64 = 5;

/// `run` of a topology (its name and flags of its own) at p=2 at a limited
/// rate; a flag of `extra` replaces the default of the same name.
fn topology(own: &[&str], dirs: &Dirs, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = own
        .iter()
        .chain(&["--parallelism=2", "--rate=5000"])
        .map(|s| s.to_string())
        .collect();
    args.extend([
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={SEED}"),
        format!("--checkpoint-dir={}", dirs.checkpoints.display()),
        format!("--output={}", dirs.output.display()),
    ]);
    let name = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
    args.retain(|a| !extra.iter().any(|e| name(e) == name(a)));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

struct Dirs {
    _root: tempfile::TempDir,
    checkpoints: PathBuf,
    output: PathBuf,
    savepoints: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let dirs = Dirs {
        checkpoints: root.path().join("checkpoints"),
        output: root.path().join("output"),
        savepoints: root.path().join("savepoints"),
        _root: root,
    };
    std::fs::create_dir_all(&dirs.output).unwrap();
    dirs
}

fn assert_summary(summary: &Value, name: &str) {
    for field in ["min", "max", "avg", "p50", "p90", "p95", "p99", "p999"] {
        assert!(
            summary[name][field].is_number(),
            "summary.{name}.{field}: {summary}"
        );
    }
}

fn local(location: &str) -> PathBuf {
    PathBuf::from(location.strip_prefix("file://").unwrap_or(location))
}

#[test]
fn checkpoints_savepoints_and_stop_over_http_restore_exactly_once() {
    let dirs = dirs();
    // Only manual checkpoints: the statistics must then match the report.
    let running = start(wordcount(
        &dirs,
        &[
            "--checkpoint-interval=off",
            &format!("--savepoint-dir={}", dirs.savepoints.display()),
        ],
    ));
    let (api, jid) = (&running.api, running.jid.clone());
    assert_eq!(jid.len(), 32);
    assert!(jid
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));

    let job = api.ok(&format!("/jobs/{jid}"));
    assert_eq!(job["state"], "RUNNING");
    let vertices = job["vertices"].as_array().unwrap().clone();
    assert_eq!(vertices.len(), 2);
    assert!(vertices
        .iter()
        .all(|v| v["parallelism"] == 2 && v["id"].as_str().unwrap().len() == 32));

    // Two checkpoints by hand, by Flink's manual trigger.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, triggered) = api.post(
            &format!("/jobs/{jid}/checkpoints"),
            r#"{"checkpointType":"FULL"}"#,
        );
        assert_eq!(status, 202, "{triggered}");
        let request = triggered["request-id"].as_str().unwrap();
        let done = api.completed(&format!("/jobs/{jid}/checkpoints/{request}"));
        ids.push(done["checkpointId"].as_u64().unwrap());
    }
    assert!(ids[0] < ids[1]);

    let stats = api.ok(&format!("/jobs/{jid}/checkpoints"));
    assert_eq!(
        stats["counts"],
        json!({"restored": 0, "total": 2, "in_progress": 0, "completed": 2, "failed": 0})
    );
    for name in [
        "state_size",
        "end_to_end_duration",
        "checkpointed_size",
        "processed_data",
        "persisted_data",
        "alignment_buffered",
    ] {
        assert_summary(&stats["summary"], name);
    }
    let history = stats["history"].as_array().unwrap();
    assert_eq!(
        history
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [ids[1], ids[0]]
    );
    let latest = &stats["latest"]["completed"];
    assert_eq!(latest["id"].as_u64(), Some(ids[1]));
    // Flink's web UI shows where the latest checkpoint is from this.
    assert_eq!(
        latest["external_path"], history[0]["external_path"],
        "{latest}"
    );
    assert!(latest["external_path"].is_string(), "{latest}");
    for c in history {
        assert_eq!(c["status"], "COMPLETED");
        assert_eq!(c["is_savepoint"], false);
        assert_eq!(c["checkpoint_type"], "CHECKPOINT");
        assert_eq!(
            (
                c["num_subtasks"].as_u64(),
                c["num_acknowledged_subtasks"].as_u64()
            ),
            (Some(4), Some(4))
        );
        assert!(c["state_size"].as_u64().unwrap() > 0, "{c}");
        assert!(
            c["latest_ack_timestamp"].as_u64().unwrap() >= c["trigger_timestamp"].as_u64().unwrap()
        );
        let path = c["external_path"].as_str().unwrap();
        assert!(path.ends_with(&format!("/chk-{}", c["id"])), "{path}");
    }
    let max_duration = history
        .iter()
        .map(|c| c["end_to_end_duration"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(
        stats["summary"]["end_to_end_duration"]["max"].as_u64(),
        Some(max_duration)
    );

    // Per operator and per subtask.
    let detail = api.ok(&format!("/jobs/{jid}/checkpoints/details/{}", ids[1]));
    assert_eq!(detail["id"].as_u64(), Some(ids[1]));
    let tasks = detail["tasks"].as_object().unwrap();
    assert_eq!(tasks.len(), 2);
    let mut state = 0;
    for vertex in &vertices {
        let vid = vertex["id"].as_str().unwrap();
        assert_eq!(tasks[vid]["num_acknowledged_subtasks"], 2);
        assert_eq!(
            tasks[vid]["id"].as_u64(),
            Some(ids[1]),
            "Flink's task entry carries the checkpoint id"
        );
        let per = api.ok(&format!(
            "/jobs/{jid}/checkpoints/details/{}/subtasks/{vid}",
            ids[1]
        ));
        let subtasks = per["subtasks"].as_array().unwrap();
        assert_eq!(subtasks.len(), 2);
        for (i, s) in subtasks.iter().enumerate() {
            assert_eq!(s["index"], i);
            assert_eq!(s["status"], "completed");
            assert!(
                s["ack_timestamp"].as_u64().unwrap()
                    >= detail["trigger_timestamp"].as_u64().unwrap()
            );
            for field in ["sync", "async"] {
                assert!(s["checkpoint"][field].is_u64(), "{s}");
            }
            for field in ["buffered", "processed", "persisted", "duration"] {
                assert!(s["alignment"][field].is_u64(), "{s}");
            }
            assert!(s["start_delay"].is_u64() && s["unaligned_checkpoint"] == false);
            state += s["state_size"].as_u64().unwrap();
        }
    }
    assert_eq!(
        Some(state),
        detail["state_size"].as_u64(),
        "subtasks add up to the checkpoint"
    );
    let config = api.ok(&format!("/jobs/{jid}/checkpoints/config"));
    assert_eq!(
        (config["mode"].as_str(), config["max_concurrent"].as_u64()),
        (Some("exactly_once"), Some(1))
    );

    // Bad requests: Flink's error shape, and the job goes on.
    let job_dir = dirs
        .checkpoints
        .join(tidemark_actors::runtime::job_id("wordcount").to_string());
    let checkpoints_dir = format!("file://{}/savepoints", job_dir.display());
    for (method, path, body, status) in [
        ("GET", "/jobs/not-a-job".to_owned(), "", 400),
        ("GET", format!("/jobs/{}", "0".repeat(32)), "", 404),
        (
            "GET",
            format!("/jobs/{jid}/checkpoints/details/abc"),
            "",
            400,
        ),
        (
            "GET",
            format!("/jobs/{jid}/checkpoints/details/999999"),
            "",
            404,
        ),
        (
            "GET",
            format!(
                "/jobs/{jid}/checkpoints/details/{}/subtasks/{}",
                ids[0],
                "f".repeat(32)
            ),
            "",
            404,
        ),
        (
            "GET",
            format!("/jobs/{jid}/savepoints/{}", "a".repeat(32)),
            "",
            404,
        ),
        ("GET", "/no/such/thing".to_owned(), "", 404),
        ("POST", format!("/jobs/{jid}/savepoints"), "{", 400),
        (
            "POST",
            format!("/jobs/{jid}/savepoints"),
            r#"{"cancel-job": "yes"}"#,
            400,
        ),
        (
            "POST",
            format!("/jobs/{jid}/savepoints"),
            r#"{"formatType": "NATIVE"}"#,
            400,
        ),
        (
            "POST",
            format!("/jobs/{jid}/savepoints"),
            &*format!(r#"{{"target-directory": "{checkpoints_dir}"}}"#),
            400,
        ),
        (
            "POST",
            format!("/jobs/{jid}/stop"),
            r#"{"drain": true}"#,
            400,
        ),
        (
            "POST",
            format!("/jobs/{jid}/checkpoints"),
            r#"{"checkpointType": "SOMETIMES"}"#,
            400,
        ),
        ("PATCH", format!("/jobs/{jid}?mode=suspend"), "", 400),
    ] {
        let (got, errors) = match method {
            "GET" => api.get(&path),
            "POST" => api.post(&path, body),
            _ => api.patch(&path),
        };
        assert_eq!(got, status, "{method} {path} {body}: {errors}");
        let message = errors["errors"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path}: {errors}"));
        assert!(!message.is_empty());
    }
    // A page whose domain was rebound to 127.0.0.1 is refused.
    let rebound = {
        use std::io::{Read, Write};
        let mut stream =
            std::net::TcpStream::connect(api.base.trim_start_matches("http://")).unwrap();
        write!(stream, "GET /jobs/overview HTTP/1.1\r\nHost: attacker.example:8081\r\nConnection: close\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");
    // A form or text from another site's page cannot act on the job.
    let response = api
        .agent
        .post(format!("{}/jobs/{jid}/stop", api.base))
        .header("content-type", "text/plain")
        .send("{}");
    assert_eq!(Api::answer(response).unwrap().0, 415);
    let foreign = api.post(
        &format!("/jobs/{jid}/savepoints"),
        r#"{"target-directory": "memory://elsewhere/sp"}"#,
    );
    assert_eq!(
        foreign.0, 400,
        "a store the job does not use: {}",
        foreign.1
    );
    let forbidden = api
        .post(
            &format!("/jobs/{jid}/savepoints"),
            &format!(r#"{{"target-directory": "{checkpoints_dir}"}}"#),
        )
        .1;
    assert!(
        forbidden["errors"][0]
            .as_str()
            .unwrap()
            .contains("inside the job's checkpoint directory"),
        "{forbidden}"
    );
    assert_eq!(
        api.ok(&format!("/jobs/{jid}"))["state"],
        "RUNNING",
        "bad requests leave the job running"
    );

    // Metrics parse as Prometheus text.
    let (status, text) = api.try_get("/metrics").unwrap();
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let sample = |name: &str, label: Option<(&str, &str)>| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => panic!("{name} is neither counter nor gauge"),
            })
            .sum()
    };
    assert!(sample("tidemark_records_in_total", None) > 0.0);
    assert!(sample("tidemark_records_out_total", None) > 0.0);
    assert_eq!(
        sample("tidemark_checkpoints", Some(("status", "completed"))),
        2.0
    );
    assert!(sample("tidemark_checkpoint_last_state_size_bytes", None) > 0.0);
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric == "tidemark_backpressured_seconds_total"));

    // A savepoint elsewhere, then a stop with a savepoint, both over HTTP.
    let elsewhere = dirs.savepoints.with_file_name("elsewhere");
    let (status, triggered) = api.post(
        &format!("/v1/jobs/{jid}/savepoints"),
        &json!({"target-directory": format!("file://{}", elsewhere.display()), "cancel-job": false}).to_string(),
    );
    assert_eq!(status, 202, "{triggered}");
    let savepoint = api.completed(&format!(
        "/v1/jobs/{jid}/savepoints/{}",
        triggered["request-id"].as_str().unwrap()
    ));
    let savepoint = local(savepoint["location"].as_str().unwrap());
    assert!(
        savepoint.starts_with(&elsewhere) && savepoint.join("_metadata").is_file(),
        "{}",
        savepoint.display()
    );
    let stats = api.ok(&format!("/jobs/{jid}/checkpoints"));
    let latest = &stats["latest"]["savepoint"];
    assert_eq!(latest["checkpoint_type"], "SAVEPOINT");
    let path = latest["external_path"]
        .as_str()
        .unwrap_or_else(|| panic!("{latest}"));
    assert!(local(path).starts_with(&elsewhere), "{path}");

    let (status, triggered) = api.post(
        &format!("/v1/jobs/{jid}/stop"),
        r#"{"targetDirectory": null, "drain": false, "formatType": "CANONICAL", "triggerId": null}"#,
    );
    assert_eq!(status, 202, "{triggered}");
    let stopped = api.completed(&format!(
        "/v1/jobs/{jid}/savepoints/{}",
        triggered["request-id"].as_str().unwrap()
    ));
    let stopped = local(stopped["location"].as_str().unwrap());
    assert!(
        stopped.starts_with(&dirs.savepoints),
        "{}",
        stopped.display()
    );
    let report = running.job.join().unwrap().unwrap();
    assert_eq!(
        report.checkpoints_completed, 2,
        "the report counts what the statistics did"
    );
    assert_eq!(report.savepoints_completed, 2);
    assert!(report.records_in < RECORDS, "stopped before the end");

    // The stop committed its output; a restore of its savepoint finishes
    // the job exactly once.
    let mut resume = wordcount(&dirs, &[&format!("--restore={}", stopped.display())]);
    resume.retain(|a| !a.starts_with("--rate="));
    cli::run(&RunArgs::parse(resume).unwrap()).unwrap();
    assert_updates_exactly_once(
        &dirs.output,
        RECORDS,
        KEYS,
        SEED,
        "stopped over HTTP, then restored",
    );
}

/// The requests Flink 2.3's command line sends for `flink list`, `flink
/// savepoint JOBID DIR` and `flink cancel JOBID`, as recorded, replayed.
#[test]
fn flinks_recorded_cli_requests_list_savepoint_and_cancel() {
    let dirs = dirs();
    let running = start(wordcount(&dirs, &["--checkpoint-interval=200ms"]));
    let (api, jid) = (&running.api, running.jid.clone());
    let overview = api.ok("/v1/jobs/overview");
    let listed = &overview["jobs"][0];
    assert_eq!(
        (listed["jid"].as_str(), listed["state"].as_str()),
        (Some(&*jid), Some("RUNNING"))
    );
    for field in [
        "name",
        "start-time",
        "end-time",
        "duration",
        "last-modification",
    ] {
        assert!(!listed[field].is_null(), "{field}: {listed}");
    }
    for state in [
        "created",
        "scheduled",
        "deploying",
        "running",
        "finished",
        "canceling",
        "canceled",
        "failed",
        "reconciling",
        "initializing",
    ] {
        assert!(listed["tasks"][state].is_u64(), "tasks.{state}: {listed}");
    }
    let target = format!("file://{}", dirs.savepoints.display());
    let (status, triggered) = api.post(
        &format!("/v1/jobs/{jid}/savepoints"),
        &format!(r#"{{"target-directory": "{target}", "cancel-job": false, "formatType": "CANONICAL", "triggerId": null}}"#),
    );
    assert_eq!(status, 202);
    let request = triggered["request-id"].as_str().unwrap();
    assert!(
        request.len() == 32 && request.bytes().all(|b| b.is_ascii_hexdigit()),
        "{request}"
    );
    // A retry with a trigger id of the client's own triggers once.
    let retry = format!(
        r#"{{"target-directory": "{target}", "cancel-job": false, "formatType": "CANONICAL", "triggerId": "{}"}}"#,
        "b".repeat(32)
    );
    for _ in 0..2 {
        let (status, again) = api.post(&format!("/v1/jobs/{jid}/savepoints"), &retry);
        assert_eq!(
            (status, again["request-id"].as_str()),
            (202, Some(&*"b".repeat(32)))
        );
    }
    api.completed(&format!("/v1/jobs/{jid}/savepoints/{}", "b".repeat(32)));
    let done = api.completed(&format!("/v1/jobs/{jid}/savepoints/{request}"));
    let savepoints = api.ok(&format!("/jobs/{jid}/checkpoints"))["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["is_savepoint"] == true)
        .count();
    assert_eq!(savepoints, 2, "the retry took no savepoint of its own");
    let location = done["location"].as_str().unwrap();
    assert!(
        location.starts_with(&target) && local(location).join("_metadata").is_file(),
        "{location}"
    );
    let (status, _) = api.patch(&format!("/v1/jobs/{jid}?mode=cancel"));
    assert_eq!(status, 202);
    let outcome = running.job.join().unwrap();
    assert!(
        matches!(
            outcome,
            Err(CliError::Job(tidemark_actors::JobError::Cancelled))
        ),
        "{outcome:?}"
    );
}

/// The ids of a job's source vertex and of its other vertex (the windows
/// and the sink, chained).
fn source_and_windows(api: &Api, jid: &str) -> (String, String) {
    let job = api.ok(&format!("/jobs/{jid}"));
    let vertices = job["vertices"].as_array().unwrap();
    let id = |source: bool| {
        let found = vertices.iter().find(|v| v["source"] == source);
        found.unwrap_or_else(|| panic!("source {source}: {job}"))["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    (id(true), id(false))
}

/// Each subtask's `currentInputWatermark` as Flink's
/// `GET /jobs/{jobid}/vertices/{vertexid}/watermarks` serves it (under
/// `prefix`): `[{"id": "0.currentInputWatermark", "value": "1234"}, …]`.
fn watermarks(api: &Api, prefix: &str, jid: &str, vertex: &str) -> Vec<i64> {
    let path = format!("{prefix}/jobs/{jid}/vertices/{vertex}/watermarks");
    let metrics = api.ok(&path);
    let metrics = metrics
        .as_array()
        .unwrap_or_else(|| panic!("{path}: {metrics}"));
    let ids: Vec<&str> = metrics.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["0.currentInputWatermark", "1.currentInputWatermark"]);
    metrics
        .iter()
        .map(|m| m["value"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// An event-time job over REST: Flink's watermarks of each subtask, none
/// for the source (it has no input, as in Flink), advancing within the
/// event time of the input at the windows; and the history of the
/// vertices' counters, which reaches back to the job's start however late
/// it is read.
#[test]
fn an_event_time_job_serves_each_subtasks_watermark_and_its_history() {
    let dirs = dirs();
    let running = start(windows(&dirs, &["--checkpoint-interval=off"]));
    let (api, jid) = (&running.api, running.jid.clone());
    let (source, windows) = source_and_windows(api, &jid);
    assert_eq!(
        api.ok(&format!("/jobs/{jid}/vertices/{source}/watermarks")),
        json!([])
    );
    let first = eventually("a watermark at every subtask of the windows", || {
        let reached = watermarks(api, "", &jid, &windows);
        reached.iter().all(|&w| w > i64::MIN).then_some(reached)
    });
    let later = eventually("every subtask's watermark advancing", || {
        let reached = watermarks(api, "/v1", &jid, &windows);
        reached
            .iter()
            .zip(&first)
            .all(|(l, f)| l > f)
            .then_some(reached)
    });
    let event_time = (RECORDS / EVENTS_PER_MS) as i64;
    assert!(
        first
            .iter()
            .chain(&later)
            .all(|w| (0..event_time).contains(w)),
        "watermarks {first:?} then {later:?} beyond the input's event time 0..{event_time}"
    );
    let (status, unknown) = api.get(&format!(
        "/jobs/{jid}/vertices/{}/watermarks",
        "0".repeat(32)
    ));
    assert_eq!(status, 404, "{unknown}");

    let start_time = api.ok(&format!("/jobs/{jid}"))["start-time"]
        .as_u64()
        .unwrap();
    let history = eventually("a history of 3 s", || {
        let history = api.ok(&format!("/v1/jobs/{jid}/history"));
        let times: Vec<u64> = history["samples"]
            .as_array()?
            .iter()
            .map(|s| s["time"].as_u64().unwrap())
            .collect();
        (times.last()? - times[0] >= 3000).then_some(history)
    });
    assert_eq!(history["vertices"], json!([source, windows]));
    let samples = history["samples"].as_array().unwrap();
    let first_time = samples[0]["time"].as_u64().unwrap();
    assert!(
        (start_time..start_time + 3000).contains(&first_time),
        "the history starts at {first_time}, the job at {start_time}"
    );
    let out = |s: &Value| s["write-records"][0].as_u64().unwrap();
    assert!(samples
        .windows(2)
        .all(|w| { w[0]["time"].as_u64() < w[1]["time"].as_u64() && out(&w[0]) <= out(&w[1]) }));
    assert!(out(samples.last().unwrap()) > 0, "{history}");

    let (status, _) = api.patch(&format!("/jobs/{jid}?mode=cancel"));
    assert_eq!(status, 202);
    let _ = running.job.join().unwrap();
}

/// The page in headless Chromium against an event-time job with a slow
/// subtask, opened once the job ran a few seconds: the throughput and
/// backpressure charts span the run so far, each vertex with inputs shows
/// its watermark, the checkpoint history is rendered, and the subtask that
/// acknowledged last is marked.
#[test]
fn the_page_shows_the_history_and_marks_the_slow_subtask() {
    let Some(chromium) = chromium() else {
        return;
    };
    let dirs = dirs();
    let running = start(windows(
        &dirs,
        &[
            "--checkpoint-interval=100ms",
            // 1 ms a record backpressures subtask 1, so that its barrier
            // waits behind full inputs for seconds: at 20 µs it was late by
            // less than the noise of a loaded machine.
            "--slow-subtask=1",
            "--slow-ns=1000000",
            "--records=2000000",
        ],
    ));
    let (api, jid) = (&running.api, running.jid.clone());
    eventually("two completed checkpoints", || {
        (api.ok(&format!("/jobs/{jid}/checkpoints"))["counts"]["completed"].as_u64()? >= 2)
            .then_some(())
    });
    let (_, windows) = source_and_windows(api, &jid);
    eventually("a watermark at every subtask of the windows", || {
        let reached = watermarks(api, "", &jid, &windows);
        reached.iter().all(|&w| w > i64::MIN).then_some(())
    });
    let ran = eventually("6 s of running", || {
        let duration = api.ok(&format!("/jobs/{jid}"))["duration"].as_u64()?;
        (duration >= 6000).then_some(duration)
    });
    let profile = tempfile::tempdir().unwrap();
    let screenshot = dirs.output.with_file_name("page.png");
    let render = |extra: &str| {
        std::process::Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--virtual-time-budget=5000",
                "--window-size=1400,1800",
                &format!("--user-data-dir={}", profile.path().display()),
                extra,
                &running.api.base,
            ])
            .output()
            .unwrap()
    };
    let dom = render("--dump-dom");
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8(dom.stdout).unwrap();
    for chart in ["throughput-chart", "backpressure-chart"] {
        let svg = dom
            .split("<svg")
            .find(|e| e.contains(&format!("id=\"{chart}\"")))
            .and_then(|e| e.split("</svg>").next())
            .unwrap_or_else(|| panic!("no {chart}:\n{dom}"));
        assert!(
            svg.contains("class=\"axis\">−") && !svg.contains(" ms</text>"),
            "{chart}'s time axis should reach seconds back, after {ran} ms of running: {svg}"
        );
        let span: u64 = attribute(svg, "data-span-ms")
            .unwrap_or_else(|| panic!("{chart} has no time axis: {svg}"))
            .parse()
            .unwrap();
        assert!(
            span + 2500 >= ran,
            "{chart}'s time axis spans {span} ms of the {ran} ms the job ran: {svg}"
        );
    }
    let shown: Vec<i64> = dom
        .split("data-watermark=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].parse().unwrap())
        .collect();
    assert!(
        shown.len() == 1 && shown[0] >= 0,
        "the windows' watermark should be shown (the source has no input): {shown:?}\n{dom}"
    );
    assert!(
        dom.matches("data-checkpoint-id=").count() >= 2,
        "no history in the page:\n{dom}"
    );
    let row = dom
        .split("<tr")
        .find(|row| row.contains("class=\"last-ack\""))
        .unwrap_or_else(|| panic!("no subtask is marked as acknowledging last:\n{dom}"));
    assert!(
        row.contains("data-index=\"1\""),
        "the slow subtask #1 should acknowledge last: {row}"
    );
    assert!(
        row.contains("slowest"),
        "the slowest phase is not marked: {row}"
    );
    let shot = render(&format!("--screenshot={}", screenshot.display()));
    assert!(shot.status.success() && screenshot.is_file());
    api.patch(&format!("/jobs/{jid}?mode=cancel"));
    let _ = running.job.join().unwrap();
}

/// The value of `name="…"` in `element`, the first.
fn attribute<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let rest = &element[element.find(&format!("{name}=\""))? + name.len() + 2..];
    rest.get(..rest.find('"')?)
}

/// Debian's Chromium, or `None` (and a note) when it is not installed and
/// not required (`cargo xtask test` requires it).
fn chromium() -> Option<PathBuf> {
    let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf);
    if found.is_none() {
        assert!(
            std::env::var_os("TIDEMARK_REQUIRE_CHROMIUM").is_none(),
            "TIDEMARK_REQUIRE_CHROMIUM is set but Chromium is not installed"
        );
        eprintln!("SKIPPED the page test: Chromium is not installed (apt-get install chromium)");
    }
    found
}

/// `tidemark savepoint`, `checkpoints` and `stop` against a running job,
/// and what they say once it is gone.
#[test]
fn the_command_line_clients_take_a_savepoint_list_checkpoints_and_stop() {
    use tidemark_cli::client::{self, CheckpointsArgs, Connect, SavepointArgs};
    let dirs = dirs();
    let running = start(wordcount(
        &dirs,
        &[
            "--checkpoint-interval=100ms",
            &format!("--savepoint-dir={}", dirs.savepoints.display()),
        ],
    ));
    let connect = Connect {
        url: running.api.base.clone(),
        job: None,
        http_token_file: None,
        http_ca: None,
        insecure: false,
    };
    let savepoint = |target: Option<&Path>, stop: bool| {
        let args = SavepointArgs {
            connect: connect.clone(),
            target: target.map(|t| t.display().to_string()),
            timeout: Duration::from_secs(120),
        };
        client::savepoint(&args, stop)
    };
    let elsewhere = dirs.savepoints.with_file_name("by-hand");
    let taken = local(&savepoint(Some(&elsewhere), false).unwrap());
    assert!(taken.starts_with(&elsewhere) && taken.join("_metadata").is_file());
    let listing = CheckpointsArgs {
        connect: connect.clone(),
    };
    let table = client::checkpoints(&listing).unwrap();
    assert!(
        table.lines().next().unwrap().contains("completed"),
        "{table}"
    );
    assert!(
        table.contains("SAVEPOINT") && table.contains(&taken.display().to_string()),
        "{table}"
    );
    let unknown = Connect {
        url: connect.url.clone(),
        job: Some("0".repeat(32)),
        http_token_file: None,
        http_ca: None,
        insecure: false,
    };
    let wrong = client::checkpoints(&CheckpointsArgs { connect: unknown }).unwrap_err();
    assert!(
        wrong.to_string().contains("404") && wrong.to_string().contains("not found"),
        "{wrong}"
    );
    let stopped = local(&savepoint(None, true).unwrap());
    assert!(stopped.starts_with(&dirs.savepoints) && stopped.join("_metadata").is_file());
    running.job.join().unwrap().unwrap();

    let gone = client::checkpoints(&listing).unwrap_err();
    assert_eq!(gone.exit_code(), 1);
    assert!(
        gone.to_string().contains(&running.api.base)
            && gone.to_string().contains("cannot reach it"),
        "{gone}"
    );
}
