//! What a user sees when user code fails or a job is cancelled.

use std::time::Duration;
use tidemark::TaskError;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Discard;
use tidemark_actors::JobError;
use tidemark_cli::topologies::wordcount::Generator;

#[test]
fn a_panic_in_user_code_fails_the_job_with_its_message() {
    let result = Job::builder("panics")
        .parallelism(2)
        .split_source("generator", Generator::new(100_000, 1_000, 0))
        .map(|k: u64| {
            assert!(k != 999, "key 999 is cursed");
            k
        })
        .sink("discard", |_| Discard)
        .build()
        .run()
        .unwrap()
        .wait();
    match result {
        Err(JobError::TaskFailed {
            error: TaskError::Panic(message),
            ..
        }) => assert!(message.contains("key 999 is cursed"), "{message}"),
        other => panic!("expected the panic to fail the job, got {other:?}"),
    }
}

struct Failing;

impl Sink<u64> for Failing {
    fn write(&mut self, _records: &mut Vec<u64>) -> Result<(), UserError> {
        Err("disk full".into())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        Ok(())
    }
}

#[test]
fn a_sink_error_fails_the_job_and_names_the_subtask() {
    let err = Job::builder("sink-error")
        .parallelism(1)
        .split_source("generator", Generator::new(10, 10, 0))
        .sink("failing", |_| Failing)
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "subtask op-0#0 failed: sink failed: disk full"
    );
}

#[test]
fn cancel_ends_a_running_job() {
    let handle = Job::builder("endless")
        .parallelism(2)
        .source_rate(1000.0)
        .split_source("generator", Generator::new(u64::MAX, 10, 0))
        .sink("discard", |_| Discard)
        .build()
        .run()
        .unwrap();
    // Cancel once the job is demonstrably running.
    while handle.metrics().records_in() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    handle.cancel();
    assert!(matches!(handle.wait(), Err(JobError::Cancelled)));
}

#[test]
fn an_invalid_graph_is_refused_before_anything_runs() {
    let err = Job::builder("bad")
        .split_source("generator", Generator::new(10, 10, 0))
        .parallelism(200)
        .sink("discard", |_| Discard)
        .build()
        .run()
        .err()
        .expect("parallelism above max parallelism is refused");
    assert!(err.to_string().contains("parallelism 200"), "{err}");
}
