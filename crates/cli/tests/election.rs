//! Leader election over a Kubernetes Lease. One in-memory API server
//! answers as Kubernetes does (a create of an existing Lease and a replace
//! of a stale version are refused with 409), so candidates race as they
//! would against a cluster:
//! - against kube's mock client, each candidate's client a `tower_test`
//!   mock, on tokio's paused clock, so every schedule is exact;
//! - and with drivers of the `tidemark` binary, whose kubeconfig points at
//!   the same server over HTTP: a standby takes over a SIGKILLed leader's
//!   job exactly once, and a finished job is not run again.

use tidemark_testkit as common;

use http::{Request, Response, StatusCode};
use k8s_openapi::api::coordination::v1::Lease;
use kube::client::Body;
use kube::Client;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark_actors::election::{ElectionError, LeaseElection, FINISHED};
use tidemark_core::cluster::election::ElectionTiming;
use tokio::time::Instant;

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/jobs/leases";
const NAME: &str = "wordcount-driver";

/// How the API server treats one candidate's requests.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// Never answers (the candidate is cut off from the API).
    Hang,
    /// Answers 500.
    Fail,
    /// Answers 403 (no RBAC for Leases).
    Forbid,
}

#[derive(Default)]
struct Server {
    lease: Option<Lease>,
    version: u64,
    faults: HashMap<&'static str, Fault>,
    /// Successful writes: who, and who the Lease names after.
    writes: Vec<(String, Option<String>)>,
}

type Shared = Arc<Mutex<Server>>;

fn marked_finished(lease: &Lease) -> bool {
    let annotations = lease.metadata.annotations.as_ref();
    annotations
        .and_then(|a| a.get(FINISHED))
        .map(String::as_str)
        == Some("true")
}

/// An API server's answer: its status and JSON body.
type Answer = (StatusCode, Vec<u8>);

fn status(code: StatusCode, reason: &str) -> Answer {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("{reason} (test server)"), "reason": reason, "code": code.as_u16(),
    });
    (code, serde_json::to_vec(&body).unwrap())
}

impl Server {
    fn answer(&mut self, who: &str, method: &str, path: &str, body: &[u8]) -> Answer {
        let named = path == format!("{PATH}/{NAME}");
        match (method, named) {
            ("GET", true) => match &self.lease {
                Some(lease) => (StatusCode::OK, serde_json::to_vec(lease).unwrap()),
                None => status(StatusCode::NOT_FOUND, "NotFound"),
            },
            ("POST", false) if path == PATH => {
                if self.lease.is_some() {
                    return status(StatusCode::CONFLICT, "AlreadyExists");
                }
                self.store(who, body, StatusCode::CREATED)
            }
            ("PUT", true) => {
                let sent: Lease = serde_json::from_slice(body).unwrap();
                let current = self
                    .lease
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone());
                if current.is_none() {
                    return status(StatusCode::NOT_FOUND, "NotFound");
                }
                if sent.metadata.resource_version != current {
                    return status(StatusCode::CONFLICT, "Conflict");
                }
                self.store(who, body, StatusCode::OK)
            }
            _ => status(StatusCode::NOT_FOUND, "NotFound"),
        }
    }

    fn store(&mut self, who: &str, body: &[u8], code: StatusCode) -> Answer {
        let mut lease: Lease = serde_json::from_slice(body).unwrap();
        self.version += 1;
        lease.metadata.resource_version = Some(self.version.to_string());
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        self.writes.push((who.to_string(), holder));
        self.lease = Some(lease.clone());
        (code, serde_json::to_vec(&lease).unwrap())
    }

    /// Gives the Lease to `holder`, as its own write would.
    fn hand_over(&mut self, holder: &str) {
        let mut lease = self.lease.clone().expect("a Lease to hand over");
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(holder.to_string());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        let body = serde_json::to_vec(&lease).unwrap();
        self.store(holder, &body, StatusCode::OK);
    }

    fn holder(&self) -> Option<String> {
        self.lease.as_ref()?.spec.as_ref()?.holder_identity.clone()
    }
}

/// A candidate whose client talks to `server`, with client-go's timings.
fn candidate(server: &Shared, who: &'static str) -> LeaseElection {
    timed_candidate(server, who, ElectionTiming::default())
}

fn timed_candidate(server: &Shared, who: &'static str, timing: ElectionTiming) -> LeaseElection {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = server.clone();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        let mut unanswered = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let body = body.collect_bytes().await.unwrap();
            let mut server = server.lock().unwrap();
            let (code, body) = match server.faults.get(who) {
                Some(Fault::Hang) => {
                    unanswered.push(respond);
                    continue;
                }
                Some(Fault::Fail) => status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
                Some(Fault::Forbid) => status(StatusCode::FORBIDDEN, "Forbidden"),
                None => server.answer(who, parts.method.as_str(), parts.uri.path(), &body),
            };
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = code;
            respond.send_response(response);
        }
    });
    LeaseElection::new(
        Client::new(service, "default"),
        Some("jobs"),
        NAME,
        who,
        timing,
    )
}

const RETRY: Duration = Duration::from_secs(2);
const DEADLINE: Duration = Duration::from_secs(10);
const LEASE: Duration = Duration::from_secs(15);

/// Runs `election`'s acquisition in the background, reporting when it led.
fn stand_by(mut election: LeaseElection) -> tokio::task::JoinHandle<(Instant, LeaseElection)> {
    tokio::spawn(async move {
        election.acquire().await.unwrap();
        (Instant::now(), election)
    })
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_a_dead_leader_only_after_the_lease_lapses() {
    let server = Shared::default();
    let mut a = candidate(&server, "a");
    a.acquire().await.unwrap();
    let leader = tokio::spawn(async move { a.keep().await });
    let b = stand_by(candidate(&server, "b"));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!leader.is_finished(), "a leads on");
    assert!(!b.is_finished(), "b must not lead while a renews");
    assert_eq!(server.lock().unwrap().holder().as_deref(), Some("a"));
    let renewals = server.lock().unwrap().writes.len();
    assert!(
        renewals >= 25,
        "a renews every retry period: {renewals} writes in 60 s"
    );

    // a dies without giving the Lease up.
    leader.abort();
    let died = Instant::now();
    let (led, _b) = b.await.unwrap();
    let waited = led - died;
    // a's last renewal was at most a retry period before it died, and it
    // would have stopped leading a renew deadline after that: b comes later.
    assert!(waited > DEADLINE, "b took over {waited:?} after a died");
    assert!(waited >= LEASE - RETRY, "b waited only {waited:?}");
    assert!(waited <= LEASE + 2 * RETRY, "b waited {waited:?}");
    let server = server.lock().unwrap();
    let spec = server.lease.as_ref().unwrap().spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(spec.lease_duration_seconds, Some(15));
}

#[tokio::test(start_paused = true)]
async fn a_leader_cut_off_from_the_api_stops_leading_before_anybody_else_leads() {
    for fault in [Fault::Hang, Fault::Fail] {
        let server = Shared::default();
        let mut a = candidate(&server, "a");
        a.acquire().await.unwrap();
        let b = stand_by(candidate(&server, "b"));
        tokio::time::sleep(Duration::from_secs(7)).await;
        let cut = Instant::now();
        server.lock().unwrap().faults.insert("a", fault);
        let lost = a.keep().await;
        let stopped = Instant::now();
        assert!(
            matches!(&lost, ElectionError::Lost { why, .. } if why.contains("renew deadline")),
            "{lost}"
        );
        assert!(
            stopped - cut <= DEADLINE,
            "a led {:?} after it was cut off",
            stopped - cut
        );
        assert!(lost.to_string().contains("jobs/wordcount-driver"), "{lost}");
        let (led, _b) = b.await.unwrap();
        assert!(
            led > stopped,
            "b led at {led:?}, before a stopped at {stopped:?}"
        );
        assert_eq!(server.lock().unwrap().holder().as_deref(), Some("b"));
    }
}

#[tokio::test(start_paused = true)]
async fn candidates_racing_for_an_absent_lease_elect_exactly_one() {
    let server = Shared::default();
    let candidates: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|who| stand_by(candidate(&server, who)))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let led: Vec<_> = candidates.iter().map(|c| c.is_finished()).collect();
    assert_eq!(led.iter().filter(|l| **l).count(), 1, "{led:?}");
    let server = server.lock().unwrap();
    assert_eq!(server.writes.len(), 1, "one create went through");
    let winner = ["a", "b", "c"][led.iter().position(|l| *l).unwrap()];
    assert_eq!(server.holder().as_deref(), Some(winner));
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_at_once_and_a_finished_job_is_not_run_again() {
    let server = Shared::default();
    let mut a = candidate(&server, "a");
    a.acquire().await.unwrap();
    let b = stand_by(candidate(&server, "b"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.release(false).await.unwrap();
    let released = Instant::now();
    let (led, mut b) = b.await.unwrap();
    assert!(led - released <= RETRY, "b took {:?}", led - released);

    b.release(true).await.unwrap();
    let lease = server.lock().unwrap().lease.clone().unwrap();
    assert!(marked_finished(&lease));
    let refused = candidate(&server, "c").acquire().await.unwrap_err();
    assert!(
        matches!(&refused, ElectionError::Finished { holder, .. } if holder == "b"),
        "{refused}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_stops_at_its_deadline_even_between_two_attempts() {
    // Attempts every 4 s, a 10 s deadline: the deadline after the last
    // renewal (8 s) falls at 18 s, between the attempts at 16 and 20 s.
    let timing = ElectionTiming {
        retry_period: Duration::from_secs(4),
        ..ElectionTiming::default()
    };
    let server = Shared::default();
    let mut a = timed_candidate(&server, "a", timing);
    let start = Instant::now();
    a.acquire().await.unwrap();
    let leader = tokio::spawn(async move { (a.keep().await, Instant::now()) });
    tokio::time::sleep(Duration::from_secs(9)).await;
    server.lock().unwrap().faults.insert("a", Fault::Fail);
    let (lost, at) = leader.await.unwrap();
    assert!(matches!(lost, ElectionError::Lost { .. }), "{lost}");
    assert_eq!(at - start, Duration::from_secs(18));
}

#[tokio::test(start_paused = true)]
async fn a_candidate_without_rights_on_leases_is_told_which_it_needs() {
    let server = Shared::default();
    server.lock().unwrap().faults.insert("a", Fault::Forbid);
    let refused = candidate(&server, "a").acquire().await.unwrap_err();
    let message = refused.to_string();
    assert!(
        matches!(refused, ElectionError::Forbidden { .. }),
        "{message}"
    );
    assert!(
        message.contains("jobs/wordcount-driver") && message.contains("coordination.k8s.io"),
        "{message}"
    );
}

/// Serves `server` over HTTP on loopback, as a cluster's API server.
fn serve_http(server: Shared) -> std::net::SocketAddr {
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    let (bound, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let http = HttpServer::new(move || {
                let server = server.clone();
                App::new().default_service(web::to(
                    move |request: HttpRequest, body: web::Bytes| {
                        let server = server.clone();
                        async move {
                            let (code, body) = server.lock().unwrap().answer(
                                "driver",
                                request.method().as_str(),
                                request.path(),
                                &body,
                            );
                            HttpResponse::build(
                                actix_web::http::StatusCode::from_u16(code.as_u16()).unwrap(),
                            )
                            .content_type("application/json")
                            .body(body)
                        }
                    },
                ))
            })
            .workers(1)
            .bind("127.0.0.1:0")
            .unwrap();
            bound.send(http.addrs()[0]).unwrap();
            http.run().await.unwrap();
        })
    });
    address.recv().unwrap()
}

const RECORDS: u64 = 600_000;
const KEYS: u64 = 1_000;
const SEED: u64 = 5;

/// A driver of the `tidemark` binary named `identity`, its standard error
/// in `dir/<identity>.err`.
fn driver(
    identity: &str,
    dir: &std::path::Path,
    output: &std::path::Path,
    checkpoints: &std::path::Path,
) -> std::process::Child {
    let err = std::fs::File::create(dir.join(format!("{identity}.err"))).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "run",
            "wordcount",
            "--parallelism=2",
            "--rate=100000",
            "--emit=updates",
            "--checkpoint-interval=100ms",
            "--leader-lease=wordcount-driver",
            "--leader-lease-duration=1s",
            "--leader-renew-deadline=600ms",
            "--leader-retry-period=200ms",
        ])
        .arg(format!("--records={RECORDS}"))
        .arg(format!("--keys={KEYS}"))
        .arg(format!("--seed={SEED}"))
        .arg(format!("--leader-identity={identity}"))
        .arg(format!("--output={}", output.display()))
        .arg(format!("--checkpoint-dir={}", checkpoints.display()))
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within a minute"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An API server on loopback with a kubeconfig naming it, and directories
/// for the drivers' standard error, the output and the checkpoints.
struct Cluster {
    server: Shared,
    dir: tempfile::TempDir,
    output: tempfile::TempDir,
    checkpoints: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let server = Shared::default();
        let api = serve_http(server.clone());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
                 clusters: [{{name: test, cluster: {{server: 'http://{api}'}}}}]\n\
                 users: [{{name: test, user: {{}}}}]\n\
                 contexts: [{{name: test, context: {{cluster: test, user: test, namespace: jobs}}}}]\n"
            ),
        )
        .unwrap();
        Cluster {
            server,
            dir,
            output: tempfile::tempdir().unwrap(),
            checkpoints: tempfile::tempdir().unwrap(),
        }
    }

    fn driver(&self, identity: &str) -> std::process::Child {
        driver(
            identity,
            self.dir.path(),
            self.output.path(),
            self.checkpoints.path(),
        )
    }

    fn stderr(&self, identity: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{identity}.err"))).unwrap_or_default()
    }

    /// Waits until driver `identity` (`child`) leads and its job committed
    /// output.
    fn leading(&self, identity: &str, child: &mut std::process::Child) {
        wait_for("the driver leads and commits output", || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "{identity} ended: {}",
                self.stderr(identity)
            );
            self.server.lock().unwrap().holder().as_deref() == Some(identity)
                && !common::committed_lines(self.output.path()).is_empty()
        });
    }
}

#[test]
fn a_standby_driver_takes_over_a_sigkilled_leaders_job_exactly_once() {
    let cluster = Cluster::start();
    let (server, output) = (&cluster.server, cluster.output.path());
    let stderr = |identity: &str| cluster.stderr(identity);
    let mut a = cluster.driver("a");
    cluster.leading("a", &mut a);
    let mut b = cluster.driver("b");
    wait_for("b stands by", || stderr("b").contains("is a candidate"));
    a.kill().unwrap();
    let killed = a.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&killed),
        Some(9),
        "a ended before it was killed: {}",
        stderr("a")
    );

    let status = b.wait().unwrap();
    assert!(status.success(), "b: {}", stderr("b"));
    assert!(stderr("b").contains("b leads"), "{}", stderr("b"));
    common::assert_updates_exactly_once(output, RECORDS, KEYS, SEED, "b took a's job over");
    let lease = server.lock().unwrap().lease.clone().unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert!(marked_finished(&lease));

    // The job ran to its end: a later driver does not run it again.
    let committed = common::committed_lines(output);
    let c = cluster.driver("c").wait().unwrap();
    assert!(c.success(), "c: {}", stderr("c"));
    assert!(
        stderr("c").contains("already ran to its end under leader b"),
        "{}",
        stderr("c")
    );
    assert_eq!(common::committed_lines(output), committed);
}

#[test]
fn a_leader_deposed_while_alive_cancels_its_job_stands_by_and_finishes_it_later() {
    let cluster = Cluster::start();
    let mut a = cluster.driver("a");
    cluster.leading("a", &mut a);
    // Another takes the Lease (as a driver whose clock ran fast might) and
    // never renews it: a cancels its job, stands by, leads again once the
    // Lease lapses, and restores its latest checkpoint.
    cluster.server.lock().unwrap().hand_over("x");
    let status = a.wait().unwrap();
    let stderr = cluster.stderr("a");
    assert!(status.success(), "a: {stderr}");
    assert!(
        stderr.contains("x holds it now") && stderr.contains("standing by again"),
        "{stderr}"
    );
    common::assert_updates_exactly_once(
        cluster.output.path(),
        RECORDS,
        KEYS,
        SEED,
        "a deposed and back",
    );
    let lease = cluster.server.lock().unwrap().lease.clone().unwrap();
    assert!(marked_finished(&lease));
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(2));
}
