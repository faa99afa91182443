//! Async I/O end to end: `tidemark run enrich` against a real HTTP service
//! (actix-web, started by each test) that answers slowly, fails or stalls;
//! the output checked from the committed files alone. And the timeout
//! handler of an async function in an embedded job.

use tidemark_testkit as common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::dataflow::async_io::{AsyncFunction, AsyncWait, LocalFuture};
use tidemark::dataflow::source::Items;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Collect;
use tidemark_cli::topologies::enrich::{value_of, Enriched, Lookup, Numbered};

const RECORDS: u64 = 40_000;
const KEYS: u64 = 1_000;

/// How the test service answers `GET /enrich/KEY`.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// Before every answer.
    latency: Duration,
    /// The first request for each record i with i % n == 0 gets a 503.
    fail_every: Option<u64>,
    /// Requests for keys k with k % n == 0 never get an answer.
    stall_every: Option<u64>,
}

/// A request for a record: `GET /enrich/KEY?record=INDEX`.
#[derive(serde::Deserialize)]
struct Request {
    record: u64,
}

/// Starts the service on a loopback port of its own; its URL and the
/// number of requests it took.
fn service(behaviour: Behaviour) -> (String, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicU64::new(0));
    let counted = requests.clone();
    let failed = Arc::new(Mutex::new(std::collections::HashSet::new()));
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            actix_web::HttpServer::new(move || {
                let (counted, failed) = (counted.clone(), failed.clone());
                actix_web::App::new().route(
                    "/enrich/{key}",
                    actix_web::web::get().to(
                        move |key: actix_web::web::Path<u64>,
                              request: actix_web::web::Query<Request>| {
                            counted.fetch_add(1, Ordering::Relaxed);
                            let record = request.record;
                            let fail = behaviour.fail_every.is_some_and(|every| {
                                record.is_multiple_of(every)
                                    && failed.lock().unwrap().insert(record)
                            });
                            answer(behaviour, key.into_inner(), fail)
                        },
                    ),
                )
            })
            .workers(2)
            .listen(listener)
            .unwrap()
            .run()
            .await
        })
    });
    (url, requests)
}

async fn answer(behaviour: Behaviour, key: u64, fail: bool) -> actix_web::HttpResponse {
    if behaviour
        .stall_every
        .is_some_and(|every| key.is_multiple_of(every))
    {
        actix_web::rt::time::sleep(Duration::from_secs(3600)).await;
    }
    if fail {
        return actix_web::HttpResponse::ServiceUnavailable().finish();
    }
    actix_web::rt::time::sleep(behaviour.latency).await;
    actix_web::HttpResponse::Ok().body(value_of(key).to_string())
}

/// `run enrich` of the service at `url` into `root/out`, at p=2 with
/// checkpoints every 50 ms; `extra` replaces flags of the same name.
fn enrich(url: &str, root: &Path, extra: &[&str]) -> Result<tidemark_cli::RunReport, String> {
    let args = vec![
        "enrich".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--service={url}"),
        "--parallelism=2".into(),
        "--rate=40000".into(),
        "--checkpoint-interval=50ms".into(),
        format!("--checkpoint-dir={}", root.join("checkpoints").display()),
        format!("--output={}", root.join("out").display()),
    ];
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    common::run_overriding(args, &extra).map_err(|e| e.to_string())
}

/// Every record's enriched line is committed under `root/out` exactly
/// once, with the service's value; ordered, each file holds its records
/// in input order.
fn assert_enriched_once(root: &Path, ordered: bool, context: &str) {
    let output = root.join("out");
    let mut seen = vec![0u32; RECORDS as usize];
    let mut last_in_file = std::collections::HashMap::new();
    for (file, line) in common::committed_lines(&output) {
        let fields: Vec<u64> = line.split(',').map(|f| f.parse().unwrap()).collect();
        let (index, key, value) = (fields[0], fields[1], fields[2]);
        assert_eq!(key, common::splitmix64(index) % KEYS, "{context}: {line}");
        assert_eq!(value, value_of(key), "{context}: {line}");
        seen[index as usize] += 1;
        let last = last_in_file.insert(file.clone(), index);
        if ordered {
            assert!(
                last < Some(index),
                "{context}: {file} has {index} after {last:?}"
            );
        }
    }
    let wrong: Vec<_> = (seen.iter().enumerate())
        .filter(|(_, n)| **n != 1)
        .take(3)
        .collect();
    assert!(wrong.is_empty(), "{context}: (index, times) {wrong:?}");
    common::assert_no_uncommitted_files(&output, context);
}

#[test]
fn enriched_records_are_emitted_once_across_failures_with_requests_in_flight() {
    // At 40,000 records/s and 5 ms a request, about 200 are in flight at
    // any time, and at every checkpoint.
    let (url, requests) = service(Behaviour {
        latency: Duration::from_millis(5),
        ..Behaviour::default()
    });
    for order in ["ordered", "unordered"] {
        let root = tempfile::tempdir().unwrap();
        let order_flag = format!("--order={order}");
        let report = enrich(&url, root.path(), &["--inject-failures=3", &order_flag])
            .unwrap_or_else(|e| panic!("{order}: {e}"));
        assert!(report.restarts >= 1, "{order}: no failure was injected");
        assert_enriched_once(root.path(), order == "ordered", order);
    }
    assert!(requests.load(Ordering::Relaxed) >= 2 * RECORDS);
}

#[test]
fn failed_requests_are_retried_and_fail_the_job_once_the_retries_are_spent() {
    let (url, _) = service(Behaviour {
        fail_every: Some(3),
        ..Behaviour::default()
    });
    let root = tempfile::tempdir().unwrap();
    let report = enrich(&url, root.path(), &["--retries=1"]).unwrap();
    assert_eq!(report.restarts, 0, "a retry was not enough");
    assert_enriched_once(root.path(), true, "retried");

    let (url, _) = service(Behaviour {
        fail_every: Some(3),
        ..Behaviour::default()
    });
    let root = tempfile::tempdir().unwrap();
    let failed = enrich(&url, root.path(), &["--retries=0", "--max-restarts=0"])
        .expect_err("a request failed without retries");
    assert!(
        failed.contains("async request failed") && failed.contains("503"),
        "{failed}"
    );
}

#[test]
fn a_stalled_request_times_out_and_fails_the_job() {
    let (url, _) = service(Behaviour {
        stall_every: Some(97),
        ..Behaviour::default()
    });
    let root = tempfile::tempdir().unwrap();
    let flags = ["--request-timeout=300ms", "--max-restarts=0"];
    let failed = enrich(&url, root.path(), &flags).expect_err("a request stalled");
    assert!(
        failed.contains("async request failed") && failed.contains("timed out"),
        "{failed}"
    );
}

/// Answers with the service, and with `u64::MAX` for a record whose
/// request timed out.
struct WithFallback(Lookup);

impl AsyncFunction<Numbered, Enriched> for WithFallback {
    fn invoke(&self, record: Numbered) -> LocalFuture<Result<Vec<Enriched>, UserError>> {
        self.0.invoke(record)
    }

    fn timeout(&self, record: &Numbered) -> Result<Vec<Enriched>, UserError> {
        Ok(vec![Enriched {
            index: record.index,
            key: record.key,
            value: u64::MAX,
        }])
    }
}

#[test]
fn a_timeout_handler_answers_for_stalled_requests_in_input_order() {
    let (url, _) = service(Behaviour {
        stall_every: Some(10),
        ..Behaviour::default()
    });
    let records: Vec<Numbered> = (0..200).map(|i| Numbered { index: i, key: i }).collect();
    let results = Arc::new(Mutex::new(Vec::new()));
    let into_results = results.clone();
    let items = Arc::new(records);
    Job::builder("fallback")
        .parallelism(1)
        .source("records", move |ctx| Items::new(items.clone(), ctx))
        .async_wait(
            "enrich",
            AsyncWait::ordered(Duration::from_millis(200), 50),
            move || WithFallback(Lookup::new(&url)),
        )
        .sink("collect", move |_| Collect::new(into_results.clone()))
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap();
    let got = results.lock().unwrap().clone();
    let expected: Vec<Enriched> = (0..200)
        .map(|i| Enriched {
            index: i,
            key: i,
            value: if i % 10 == 0 { u64::MAX } else { value_of(i) },
        })
        .collect();
    assert_eq!(got, expected);
}

/// A record with an event time.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Event {
    key: u64,
    at_ms: u64,
}

impl tidemark::time::Timestamped for Event {
    fn timestamp(&self) -> u64 {
        self.at_ms
    }
}

/// Answers each event after 0 to 4 ms, so that later events overtake
/// earlier ones.
struct Jittered;

impl AsyncFunction<Event, Event> for Jittered {
    fn invoke(&self, event: Event) -> LocalFuture<Result<Vec<Event>, UserError>> {
        let delay = Duration::from_millis(common::splitmix64(event.at_ms) % 5);
        Box::pin(async move {
            actix_web::rt::time::sleep(delay).await;
            Ok(vec![event])
        })
    }
}

#[test]
fn unordered_results_never_fall_behind_a_watermark_the_operator_let_go() {
    use tidemark::time::{Count, TimeWindow, WatermarkStrategy, WindowAssigner};
    const EVENTS: u64 = 4_000;
    let events: Vec<Event> = (0..EVENTS)
        .map(|i| Event {
            key: i % 7,
            at_ms: i,
        })
        .collect();
    let items = Arc::new(events);
    let results = Arc::new(Mutex::new(Vec::new()));
    let into_results = results.clone();
    Job::builder("jittered")
        .parallelism(2)
        .source_with_watermarks("events", WatermarkStrategy::monotonous(), move |ctx| {
            Items::new(items.clone(), ctx)
        })
        .async_wait(
            "jitter",
            AsyncWait::unordered(Duration::from_secs(10), 64),
            || Jittered,
        )
        .key_by(|e: &Event| e.key)
        .window(WindowAssigner::tumbling(Duration::from_millis(100)))
        .aggregate(
            "count",
            Count,
            |key: &u64, window: &TimeWindow, n: u64, out| out.collect((*key, window.start, n)),
        )
        .sink("collect", move |_| Collect::new(into_results.clone()))
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap();
    let mut got = results.lock().unwrap().clone();
    got.sort_unstable();
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..EVENTS {
        *expected
            .entry((i % 7, (i / 100 * 100) as i64))
            .or_insert(0u64) += 1;
    }
    let expected: Vec<_> = expected.into_iter().map(|((k, w), n)| (k, w, n)).collect();
    // A result behind a watermark would be late, and dropped.
    let wrong: Vec<_> = (expected.iter())
        .filter(|window| !got.contains(window))
        .take(3)
        .collect();
    assert!(
        wrong.is_empty() && got.len() == expected.len(),
        "windows counted wrong, as (key, start, count): {wrong:?}"
    );
}
