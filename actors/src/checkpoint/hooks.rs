//! The job's master hooks, user code that the coordinator actor runs when
//! the core asks for their states (`JobAction::TriggerHooks`) and when it
//! resumes from a checkpoint, so that none runs inside the core's sans-IO
//! machines. A split source's coordinator is among them (`source:UID`).

use std::collections::BTreeMap;
use tidemark_core::checkpoint::coordinator::HookError;
use tidemark_core::checkpoint::CompletedCheckpoint;
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::MasterHook;

/// The master hooks in the order they were added; a hook replaces an
/// earlier one of the same name, since their states are keyed by name.
#[derive(Default)]
pub(crate) struct MasterHooks(Vec<Box<dyn MasterHook>>);

impl MasterHooks {
    pub(crate) fn new(hooks: Vec<Box<dyn MasterHook>>) -> Self {
        let mut kept: Vec<Box<dyn MasterHook>> = Vec::new();
        for hook in hooks {
            kept.retain(|h| h.name() != hook.name());
            kept.push(hook);
        }
        MasterHooks(kept)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every hook's state for `checkpoint` by its name (a hook that returns
    /// none has no entry), or the first hook's failure.
    pub(crate) fn trigger(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<BTreeMap<String, Vec<u8>>, HookError> {
        let mut states = BTreeMap::new();
        for hook in &mut self.0 {
            let state = hook
                .trigger(checkpoint)
                .map_err(|reason| HookError::Trigger {
                    hook: hook.name().to_owned(),
                    checkpoint,
                    reason,
                })?;
            if let Some(state) = state {
                states.insert(hook.name().to_owned(), state);
            }
        }
        Ok(states)
    }

    /// Restores every hook with the state it returned for `checkpoint`
    /// (`None` if none), stopping at the first failure.
    pub(crate) fn restore(&mut self, checkpoint: &CompletedCheckpoint) -> Result<(), HookError> {
        for hook in &mut self.0 {
            let state = checkpoint.master_states.get(hook.name()).map(Vec::as_slice);
            hook.restore(checkpoint.id, state)
                .map_err(|reason| HookError::Restore {
                    hook: hook.name().to_owned(),
                    checkpoint: checkpoint.id,
                    reason,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    type Log = Arc<Mutex<Vec<String>>>;

    /// Records what it was asked, for the test to read back.
    struct RecordingHook {
        name: &'static str,
        state: Option<&'static str>,
        fail: bool,
        log: Log,
    }

    impl MasterHook for RecordingHook {
        fn name(&self) -> &str {
            self.name
        }

        fn trigger(&mut self, checkpoint: CheckpointId) -> Result<Option<Vec<u8>>, String> {
            let entry = format!("{} trigger {checkpoint}", self.name);
            self.log.lock().unwrap().push(entry);
            if self.fail {
                return Err("broker down".into());
            }
            Ok(self.state.map(|s| format!("{s}@{checkpoint}").into_bytes()))
        }

        fn restore(
            &mut self,
            checkpoint: CheckpointId,
            state: Option<&[u8]>,
        ) -> Result<(), String> {
            let state = state.map(|s| String::from_utf8_lossy(s).into_owned());
            let entry = format!("{} restore {checkpoint} {state:?}", self.name);
            self.log.lock().unwrap().push(entry);
            if self.fail {
                return Err("broker down".into());
            }
            Ok(())
        }
    }

    /// Hooks of (name, state, fails), in order, and their log.
    fn hooks(specs: &[(&'static str, Option<&'static str>, bool)]) -> (MasterHooks, Log) {
        let log = Log::default();
        let hooks = specs
            .iter()
            .map(|&(name, state, fail)| {
                let log = Arc::clone(&log);
                Box::new(RecordingHook {
                    name,
                    state,
                    fail,
                    log,
                }) as Box<dyn MasterHook>
            })
            .collect();
        (MasterHooks::new(hooks), log)
    }

    fn checkpoint_with(id: u64, states: BTreeMap<String, Vec<u8>>) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id: CheckpointId(id),
            kind: tidemark_core::model::event::CheckpointKind::Checkpoint,
            format: Default::default(),
            operators: Vec::new(),
            edges: Vec::new(),
            key_hash: tidemark_core::model::key_hash::KEY_HASH_VERSION,
            timestamp: 0,
            subtasks: BTreeMap::new(),
            master_states: states,
        }
    }

    #[test]
    fn states_are_keyed_by_name_and_restored_to_their_hooks() {
        let (mut hooks, log) = hooks(&[("kafka", Some("offsets"), false), ("audit", None, false)]);
        let states = hooks.trigger(CheckpointId(1)).unwrap();
        assert_eq!(
            states,
            BTreeMap::from([("kafka".to_owned(), b"offsets@chk-1".to_vec())])
        );
        hooks.restore(&checkpoint_with(1, states)).unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "kafka trigger chk-1",
                "audit trigger chk-1",
                "kafka restore chk-1 Some(\"offsets@chk-1\")",
                "audit restore chk-1 None"
            ]
        );
    }

    #[test]
    fn a_hook_replaces_an_earlier_one_of_the_same_name() {
        let (mut hooks, log) =
            hooks(&[("kafka", Some("old"), false), ("kafka", Some("new"), false)]);
        let states = hooks.trigger(CheckpointId(1)).unwrap();
        assert_eq!(states["kafka"], b"new@chk-1");
        assert_eq!(*log.lock().unwrap(), ["kafka trigger chk-1"]);
    }

    #[test]
    fn the_first_failure_stops_the_hooks_after_it() {
        let (mut hooks, log) = hooks(&[("kafka", Some("offsets"), true), ("audit", None, false)]);
        assert_eq!(
            hooks.trigger(CheckpointId(1)).map_err(|e| e.to_string()),
            Err("master hook kafka failed on chk-1: broker down".into())
        );
        assert_eq!(
            hooks
                .restore(&checkpoint_with(1, BTreeMap::new()))
                .map_err(|e| e.to_string()),
            Err("master hook kafka failed to restore chk-1: broker down".into())
        );
        assert_eq!(
            *log.lock().unwrap(),
            ["kafka trigger chk-1", "kafka restore chk-1 None"]
        );
    }
}
