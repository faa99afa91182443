//! The ordering rules of [`JobCheckpoints`], step by step on a fake clock:
//! what may be stored, sent, deleted or answered before which outcome.

use super::coordinator::{CheckpointCoordinator, HookError, Now};
use super::job_checkpoints::{JobAction, JobCheckpoints, JobEvent, Resolved, WriteFailure};
use super::store::CompletedCheckpointStore;
use super::{
    Ack, CheckpointFailure, CheckpointMetrics, CheckpointPolicy, CompletedCheckpoint,
    NativeFileHandle, StateHandle, SubtaskState,
};
use crate::model::event::{Alignment, CheckpointKind};
use crate::model::ids::{Attempt, CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn subtask(i: u32) -> SubtaskId {
    SubtaskId {
        operator: OperatorId(0),
        index: SubtaskIndex(i),
    }
}

const SOURCE: u32 = 0;
const SINK: u32 = 1;

/// A source and a sink, checkpointing every second, retaining one.
struct Job {
    machine: JobCheckpoints,
    base: Instant,
    t: u64,
}

impl Job {
    fn new() -> Self {
        Self::retaining(CompletedCheckpointStore::new(1))
    }

    fn retaining(store: CompletedCheckpointStore) -> Self {
        Self::build(store, false)
    }

    /// A job with master hooks, which the shell runs.
    fn hooked() -> Self {
        Self::build(CompletedCheckpointStore::new(1), true)
    }

    fn build(store: CompletedCheckpointStore, hooked: bool) -> Self {
        Self::build_deployed(store, hooked).0
    }

    /// The job, and what its first event (the deployment) asked for.
    fn build_deployed(store: CompletedCheckpointStore, hooked: bool) -> (Self, Vec<JobAction>) {
        let base = Instant::now();
        let policy = CheckpointPolicy {
            interval: Some(Duration::from_secs(1)),
            timeout: Duration::from_secs(60),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 0,
            retain: 1,
        };
        let now = Now {
            instant: base,
            unix_ms: 0,
        };
        let subtasks = vec![subtask(SOURCE), subtask(SINK)];
        let mut core =
            CheckpointCoordinator::new(policy, subtasks, Alignment::Aligned, CheckpointId(1), now);
        if hooked {
            core.await_master_hooks();
        }
        let mut job = Job {
            machine: JobCheckpoints::new(core, store, 2.0),
            base,
            t: 0,
        };
        let first = job.deploy(1);
        (job, first)
    }

    fn deploy(&mut self, attempt: u32) -> Vec<JobAction> {
        self.handle(JobEvent::Deployed {
            attempt: Attempt(attempt),
            sources: vec![subtask(SOURCE)],
            subtasks: vec![subtask(SOURCE), subtask(SINK)],
            input_ended: false,
        })
    }

    fn handle(&mut self, event: JobEvent) -> Vec<JobAction> {
        let now = Now {
            instant: self.base + Duration::from_millis(self.t),
            unix_ms: self.t,
        };
        let mut actions = self.machine.handle(now, event);
        // The statistics' own tests are the coordinator's.
        actions.retain(|a| !matches!(a, JobAction::Stats(_)));
        actions
    }

    /// A second later: the periodic checkpoint is due.
    fn tick(&mut self) -> Vec<JobAction> {
        self.t += 1_000;
        self.handle(JobEvent::Tick)
    }

    /// Triggers the next checkpoint and has its counter stored.
    fn start(&mut self) -> CheckpointId {
        let actions = self.tick();
        let [JobAction::StoreNextId { barrier, .. }] = actions.as_slice() else {
            panic!("expected the counter write alone, got {actions:?}");
        };
        let id = barrier.id;
        let sent = self.handle(JobEvent::IdStored {
            checkpoint: id,
            result: Ok(()),
        });
        assert!(matches!(sent.as_slice(), [JobAction::InjectBarrier { .. }]));
        id
    }

    fn ack(
        &mut self,
        attempt: u32,
        i: u32,
        id: CheckpointId,
        state: SubtaskState,
    ) -> Vec<JobAction> {
        self.handle(JobEvent::Ack {
            attempt: Attempt(attempt),
            ack: Box::new(Ack {
                subtask: subtask(i),
                checkpoint: id,
                state,
                metrics: CheckpointMetrics::default(),
            }),
        })
    }

    /// Both acks, the sink's with these shared files; returns the metadata
    /// the machine asked to write.
    fn acked(&mut self, id: CheckpointId, shared: &[(&str, u64)]) -> CompletedCheckpoint {
        assert_eq!(self.ack(1, SOURCE, id, SubtaskState::default()), []);
        let actions = self.ack(1, SINK, id, native(id, shared));
        match <[JobAction; 1]>::try_from(actions) {
            Ok([JobAction::WriteMetadata(checkpoint)]) => checkpoint,
            other => panic!("expected the metadata write alone, got {other:?}"),
        }
    }

    fn written(&mut self, id: CheckpointId) -> Vec<JobAction> {
        self.handle(JobEvent::MetadataWritten {
            checkpoint: id,
            result: Ok(format!("chk-{}", id.0)),
        })
    }
}

/// Keyed state holding shared files (name, the checkpoint that uploaded it)
/// and a private file of its own checkpoint.
fn native(id: CheckpointId, shared: &[(&str, u64)]) -> SubtaskState {
    let file = |name: &str, path: String, by: u64| NativeFileHandle {
        name: name.to_owned(),
        handle: StateHandle::object(path, 10, 0),
        uploaded_by: CheckpointId(by),
        instance: 7,
    };
    let shared = shared
        .iter()
        .map(|(name, by)| file(name, format!("shared/{name}"), *by))
        .collect();
    let private = vec![file("MANIFEST", format!("chk-{}/MANIFEST", id.0), id.0)];
    crate::testkit::native(shared, private)
}

fn kinds(actions: &[JobAction]) -> Vec<&'static str> {
    actions
        .iter()
        .map(|a| match a {
            JobAction::TriggerHooks(_) => "trigger hooks",
            JobAction::StoreNextId { .. } => "store id",
            JobAction::InjectBarrier { .. } => "inject",
            JobAction::WriteMetadata(_) => "write metadata",
            JobAction::WriteSavepoint { .. } => "write savepoint",
            JobAction::Delete { .. } => "delete",
            JobAction::Completed(_) => "completed",
            JobAction::SavepointCompleted { .. } => "savepoint completed",
            JobAction::NotifyComplete { .. } => "notify complete",
            JobAction::NotifyAbort { .. } => "notify abort",
            JobAction::EndOfData(_) => "end input",
            JobAction::FailJob(_) => "fail job",
            JobAction::Stats(_) => "stats",
            JobAction::Resolve { .. } => "resolve",
            JobAction::Restore(_) => "restore",
            JobAction::ShutDown => "shut down",
            JobAction::Rejected(_) => "rejected",
        })
        .collect()
}

#[test]
fn a_barrier_goes_out_only_after_its_id_counter_is_stored() {
    let mut job = Job::new();
    let actions = job.tick();
    assert_eq!(kinds(&actions), ["store id"]);
    let JobAction::StoreNextId { barrier, next_id } = &actions[0] else {
        unreachable!()
    };
    assert_eq!((barrier.id, *next_id), (CheckpointId(1), CheckpointId(2)));
    let sent = job.handle(JobEvent::IdStored {
        checkpoint: barrier.id,
        result: Ok(()),
    });
    let [JobAction::InjectBarrier { sources, .. }] = sent.as_slice() else {
        panic!("{sent:?}")
    };
    assert_eq!(sources, &[subtask(SOURCE)]);
}

#[test]
fn the_counter_and_the_barrier_wait_for_the_master_hooks_states() {
    let mut job = Job::hooked();
    assert_eq!(job.tick(), [JobAction::TriggerHooks(CheckpointId(1))]);
    let states = BTreeMap::from([("source:words".to_owned(), vec![7])]);
    let stored = job.handle(JobEvent::HooksTriggered {
        checkpoint: CheckpointId(1),
        result: Ok(states.clone()),
    });
    assert_eq!(kinds(&stored), ["store id"]);
    let sent = job.handle(JobEvent::IdStored {
        checkpoint: CheckpointId(1),
        result: Ok(()),
    });
    assert_eq!(kinds(&sent), ["inject"]);
    assert_eq!(job.acked(CheckpointId(1), &[]).master_states, states);
}

#[test]
fn a_failing_master_hook_fails_the_checkpoint_with_nothing_stored_or_sent() {
    let mut job = Job::hooked();
    job.tick();
    let actions = job.handle(JobEvent::HooksTriggered {
        checkpoint: CheckpointId(1),
        result: Err(HookError::Trigger {
            hook: "source:words".into(),
            checkpoint: CheckpointId(1),
            reason: "listing failed".into(),
        }),
    });
    // No tolerable failures: the job fails, and no subtask heard of it.
    assert_eq!(kinds(&actions), ["fail job"]);
}

#[test]
fn a_counter_that_was_not_stored_fails_the_checkpoint_unsent() {
    let mut job = Job::new();
    job.tick();
    let actions = job.handle(JobEvent::IdStored {
        checkpoint: CheckpointId(1),
        result: Err("disk full".into()),
    });
    // No barrier; no tolerable failures: the job fails.
    assert_eq!(kinds(&actions), ["notify abort", "fail job"]);
}

#[test]
fn a_checkpoint_completes_only_once_its_metadata_is_written() {
    let mut job = Job::new();
    let id = job.start();
    let metadata = job.acked(id, &[("a.sst", 1)]);
    assert_eq!(metadata.id, id);
    let actions = job.written(id);
    assert_eq!(kinds(&actions), ["completed", "notify complete"]);
    assert_eq!(job.machine.store().latest().map(|c| c.id), Some(id));
}

#[test]
fn a_subsumed_checkpoint_goes_without_the_files_a_retained_one_references() {
    let mut job = Job::new();
    let first = job.start();
    job.acked(first, &[("a.sst", 1), ("b.sst", 1)]);
    job.written(first);
    let second = job.start();
    // The second reuses a.sst; b.sst was compacted away.
    job.acked(second, &[("a.sst", 1), ("c.sst", 2)]);
    let actions = job.written(second);
    assert_eq!(kinds(&actions), ["completed", "delete", "notify complete"]);
    let JobAction::Delete { checkpoints, paths } = &actions[1] else {
        unreachable!()
    };
    assert_eq!(checkpoints, &[first]);
    assert_eq!(paths, &["chk-1/MANIFEST", "shared/b.sst"]);
}

#[test]
fn a_restore_waits_for_the_metadata_write_in_flight() {
    let mut job = Job::new();
    let id = job.start();
    job.acked(id, &[]);
    // The attempt fails while the metadata is being written.
    job.handle(JobEvent::AttemptFailed {
        reason: "boom".into(),
    });
    assert_eq!(job.handle(JobEvent::RestoreWanted), []);
    let actions = job.written(id);
    let Some(JobAction::Restore(Some(latest))) = actions.last() else {
        panic!("{actions:?}")
    };
    assert_eq!(latest.id, id);
}

#[test]
fn a_metadata_write_of_unknown_outcome_keeps_the_state_it_may_reference() {
    for (outcome_unknown, deleted) in [(true, false), (false, true)] {
        let mut job = Job::new();
        let id = job.start();
        job.acked(id, &[("a.sst", 1)]);
        let actions = job.handle(JobEvent::MetadataWritten {
            checkpoint: id,
            result: Err(WriteFailure {
                reason: "timeout".into(),
                outcome_unknown,
            }),
        });
        assert!(!kinds(&actions).contains(&"completed"));
        let deletes = kinds(&actions).contains(&"delete");
        assert_eq!(deletes, deleted, "outcome unknown: {outcome_unknown}");
    }
}

#[test]
fn an_ack_of_an_abandoned_attempt_deletes_what_it_wrote() {
    let mut job = Job::new();
    let id = job.start();
    job.handle(JobEvent::AttemptFailed {
        reason: "boom".into(),
    });
    job.deploy(2);
    let actions = job.ack(1, SINK, id, native(id, &[("a.sst", 1)]));
    let [JobAction::Delete { paths, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(paths, &["chk-1/MANIFEST", "shared/a.sst"]);
}

/// Checkpoints found in storage beyond the retained one (the run before
/// retained three) are subsumed at once, but only after the registry
/// counted them: a shared file the retained one references stays.
#[test]
fn recovery_subsumes_the_surplus_and_keeps_what_the_retained_share() {
    let found = [
        (1, &[("a.sst", 1)][..]),
        (2, &[("a.sst", 1), ("b.sst", 2)]),
        (3, &[("b.sst", 2)]),
    ]
    .map(|(id, shared)| {
        let mut checkpoint = crate::testkit::checkpoint(id);
        let state = native(CheckpointId(id), shared);
        checkpoint.subtasks.insert(subtask(SINK), state);
        checkpoint
    });
    let (mut job, first) =
        Job::build_deployed(CompletedCheckpointStore::recovered(1, found), false);
    let [JobAction::Delete { checkpoints, paths }] = first.as_slice() else {
        panic!("expected the surplus deleted first, got {first:?}")
    };
    assert_eq!(checkpoints, &[CheckpointId(1), CheckpointId(2)]);
    assert_eq!(paths, &["chk-1/MANIFEST", "chk-2/MANIFEST", "shared/a.sst"]);
    let retained: Vec<CheckpointId> = job.machine.store().retained().map(|c| c.id).collect();
    assert_eq!(retained, [CheckpointId(3)]);
    // Deleted once: the next event asks for nothing more.
    assert_eq!(job.handle(JobEvent::Deleted), []);
}

#[test]
fn a_shutdown_is_answered_once_deletions_end() {
    let mut job = Job::new();
    let first = job.start();
    job.acked(first, &[]);
    job.written(first);
    let second = job.start();
    job.acked(second, &[]);
    let actions = job.written(second);
    assert!(kinds(&actions).contains(&"delete"));
    assert_eq!(job.handle(JobEvent::Shutdown), []);
    assert_eq!(kinds(&job.handle(JobEvent::Deleted)), ["shut down"]);
    // Nothing starts after it.
    assert_eq!(job.machine.poll_timeout(), None);
}

#[test]
fn the_final_checkpoint_ends_the_input_once_it_completes() {
    let mut job = Job::new();
    let actions = job.handle(JobEvent::SourceExhausted {
        attempt: Attempt(1),
        source: subtask(SOURCE),
    });
    assert_eq!(kinds(&actions), ["store id"]);
    job.handle(JobEvent::IdStored {
        checkpoint: CheckpointId(1),
        result: Ok(()),
    });
    let mut exhausted = SubtaskState::default();
    exhausted
        .operator
        .insert(crate::dataflow::task::SOURCE_EXHAUSTED.into(), Vec::new());
    job.ack(1, SOURCE, CheckpointId(1), exhausted);
    job.ack(1, SINK, CheckpointId(1), SubtaskState::default());
    let actions = job.written(CheckpointId(1));
    assert_eq!(
        kinds(&actions),
        ["completed", "notify complete", "end input"]
    );
    assert_eq!(job.machine.poll_timeout(), None);
}

#[test]
fn a_manual_trigger_between_attempts_waits_for_the_next() {
    let mut job = Job::new();
    job.handle(JobEvent::AttemptFailed {
        reason: "boom".into(),
    });
    let manual = JobEvent::Trigger {
        request: 0,
        kind: CheckpointKind::Checkpoint,
        stop: false,
        savepoint_dir: false,
    };
    assert_eq!(job.handle(manual), []);
    assert_eq!(kinds(&job.deploy(2)), ["store id"]);
}

#[test]
fn a_savepoint_without_a_directory_is_refused() {
    let mut job = Job::new();
    let actions = job.handle(JobEvent::Trigger {
        request: 3,
        kind: CheckpointKind::Savepoint,
        stop: false,
        savepoint_dir: false,
    });
    assert_eq!(
        actions,
        [JobAction::Resolve {
            request: 3,
            result: Err(CheckpointFailure::NotTriggered(
                "no savepoint directory is configured".into()
            )),
        }]
    );
}

#[test]
fn a_manual_checkpoint_is_answered_with_its_id() {
    let mut job = Job::new();
    let actions = job.handle(JobEvent::Trigger {
        request: 5,
        kind: CheckpointKind::Checkpoint,
        stop: false,
        savepoint_dir: false,
    });
    assert_eq!(kinds(&actions), ["store id"]);
    job.handle(JobEvent::IdStored {
        checkpoint: CheckpointId(1),
        result: Ok(()),
    });
    job.acked(CheckpointId(1), &[]);
    let actions = job.written(CheckpointId(1));
    assert_eq!(
        actions.last(),
        Some(&JobAction::Resolve {
            request: 5,
            result: Ok(Resolved {
                checkpoint: CheckpointId(1),
                location: None,
                ends_input: false,
            }),
        })
    );
}
