//! Checkpointing through the embedding API: manual triggers, master hooks,
//! and the tolerable-failure limit.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::checkpoint::{CheckpointConfig, CheckpointPolicy};
use tidemark::cluster::fault::{Fault, FaultPoint};
use tidemark::model::event::CheckpointKind;
use tidemark::model::ids::{CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
use tidemark::MasterHook;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Discard;
use tidemark_actors::JobError;
use tidemark_cli::topologies::wordcount::{Counter, Emit, Generator};

fn settings(dir: &std::path::Path, policy: CheckpointPolicy) -> CheckpointConfig {
    CheckpointConfig {
        policy,
        ..CheckpointConfig::new(dir.to_str().unwrap())
    }
}

/// A checkpoint id and the state a hook was restored with.
type Restored = (u64, Option<Vec<u8>>);

#[derive(Clone, Default)]
struct Hook {
    triggered: Arc<Mutex<Vec<u64>>>,
    restored: Arc<Mutex<Vec<Restored>>>,
}

impl MasterHook for Hook {
    fn name(&self) -> &str {
        "recorder"
    }

    fn trigger(&mut self, checkpoint: CheckpointId) -> Result<Option<Vec<u8>>, String> {
        self.triggered.lock().unwrap().push(checkpoint.0);
        Ok(Some(checkpoint.0.to_le_bytes().to_vec()))
    }

    fn restore(&mut self, checkpoint: CheckpointId, state: Option<&[u8]>) -> Result<(), String> {
        self.restored
            .lock()
            .unwrap()
            .push((checkpoint.0, state.map(<[u8]>::to_vec)));
        Ok(())
    }
}

#[test]
fn manual_checkpoints_resolve_and_master_hooks_see_trigger_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::default();
    let counter = SubtaskId {
        operator: OperatorId(1),
        index: SubtaskIndex(0),
    };
    let mut job = Job::builder("manual")
        .parallelism(2)
        .source_rate(100_000.0)
        .master_hook(hook.clone())
        .checkpointing(settings(
            dir.path(),
            CheckpointPolicy {
                interval: None,
                ..CheckpointPolicy::default()
            },
        ))
        .split_source("generator", Generator::new(10_000_000, 100, 0))
        .key_by(|k: &u64| *k)
        .process("count", |states| Counter::open(states, Emit::Final))
        .sink("discard", |_| Discard)
        .build();
    job.config.faults = vec![Fault {
        point: FaultPoint::SyncSnapshot,
        checkpoint: CheckpointId(2),
        subtask: counter,
    }];
    let handle = job.run().unwrap();

    assert_eq!(
        handle.trigger_checkpoint(CheckpointKind::Checkpoint),
        Ok(CheckpointId(1))
    );
    let failed = handle.trigger_checkpoint(CheckpointKind::Checkpoint);
    assert!(
        failed.is_err(),
        "checkpoint 2 meets the injected fault: {failed:?}"
    );
    // The restored attempt takes checkpoints again.
    let third = handle
        .trigger_checkpoint(CheckpointKind::Checkpoint)
        .unwrap();
    assert!(third > CheckpointId(2));
    handle.cancel();
    assert!(matches!(handle.wait(), Err(JobError::Cancelled)));

    let triggered = hook.triggered.lock().unwrap().clone();
    assert_eq!(&triggered[..2], [1, 2]);
    assert!(triggered.contains(&third.0));
    assert_eq!(
        hook.restored.lock().unwrap().clone(),
        [(1, Some(1u64.to_le_bytes().to_vec()))],
        "restored once, from checkpoint 1, with the state the hook gave it"
    );
}

/// Takes 2 ms per batch: a barrier waits behind the queued batches.
struct Slow;

impl Sink<(u64, u64)> for Slow {
    fn write(&mut self, _records: &mut Vec<(u64, u64)>) -> Result<(), UserError> {
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        Ok(())
    }
}

#[test]
fn failures_beyond_the_tolerable_number_fail_the_job_over_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let result = Job::builder("expiring")
        .parallelism(2)
        .restart(tidemark::cluster::restart::RestartStrategy::None)
        .checkpointing(settings(
            dir.path(),
            CheckpointPolicy {
                interval: Some(Duration::from_millis(10)),
                timeout: Duration::from_micros(200),
                tolerable_failures: 1,
                ..CheckpointPolicy::default()
            },
        ))
        .split_source("generator", Generator::new(10_000_000, 100, 0))
        .key_by(|k: &u64| *k)
        .process("count", |states| Counter::open(states, Emit::Updates))
        .sink("slow", |_| Slow)
        .build()
        .run()
        .unwrap()
        .wait();
    match result {
        Err(JobError::RestartsExhausted { restarts: 0, last }) => {
            let JobError::Checkpointing(reason) = *last else {
                panic!("expected a failure of checkpoints, got {last:?}");
            };
            assert!(
                reason.starts_with("2 consecutive checkpoint failures exceed the tolerable 1")
                    && reason.contains("expired"),
                "{reason}"
            )
        }
        other => panic!("expected the job to fail on checkpoints, got {other:?}"),
    }
}

#[test]
fn settings_that_would_lose_savepoints_or_never_checkpoint_deploy_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().to_str().unwrap();
    let job_dir = format!("{url}/{}", tidemark_actors::runtime::job_id("refused"));
    for settings in [
        CheckpointConfig::new(url).savepoint_dir(format!("{job_dir}/savepoints")),
        CheckpointConfig::new(url).retain(0),
        CheckpointConfig::new(url).max_concurrent(0),
    ] {
        let refused = Job::builder("refused")
            .checkpointing(settings.clone())
            .split_source("generator", Generator::new(1000, 10, 0))
            .sink("discard", |_| Discard)
            .build()
            .run();
        assert!(
            matches!(refused, Err(JobError::InvalidCheckpointing(_))),
            "{settings:?}"
        );
    }
    // Nothing was deployed, so nothing was written.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
