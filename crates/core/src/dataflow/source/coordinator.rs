//! The source coordinator: the rules by which a split source's enumerator,
//! beside the checkpoint coordinator, hands splits to the source subtasks.
//!
//! Why a checkpoint is consistent: the coordinator's state is taken when a
//! checkpoint is triggered, before its barriers go out, and splits reach a
//! subtask over the same ordered path as the barrier. A split handed out
//! before the trigger reaches the subtask before the barrier, so the
//! subtask's snapshot holds it; one handed out after reaches it after the
//! barrier, so the coordinator's snapshot still holds it as unassigned.
//! Either way exactly one of the two has it. A restore starts every attempt
//! from the restored state; requests of the failed attempt are forgotten
//! and the subtasks ask again.

use super::splits::{ErasedEnumerator, SplitBytes};
use crate::checkpoint::coordinator::MasterHook;
use crate::dataflow::error::UserError;
use crate::model::ids::CheckpointId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use thiserror::Error;

/// What a checkpoint holds of a source's coordinator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorState {
    /// The enumerator's state, MessagePack.
    #[serde(with = "serde_bytes")]
    pub enumerator: Vec<u8>,
    /// Splits discovered and not yet handed to a subtask, in order.
    pub unassigned: VecDeque<SplitBytes>,
    /// A bounded source has discovered all its splits: none will come.
    pub discovered_all: bool,
}

/// What happens to a source coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceEvent {
    /// An attempt with `parallelism` source subtasks started.
    Started {
        /// The source operator's parallelism in this attempt.
        parallelism: u32,
    },
    /// A subtask has no split left to read and asks for one.
    SplitRequested {
        /// Which subtask.
        subtask: u32,
    },
    /// A discovery the coordinator asked for found `splits`, after which
    /// the enumerator's state is `state`.
    Discovered {
        /// New splits.
        splits: Vec<SplitBytes>,
        /// The enumerator's state after them.
        state: Vec<u8>,
    },
    /// The wait of a [`SourceAction::DiscoverAfter`] is over.
    DiscoveryDue,
}

/// What the shell does for a source coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceAction {
    /// Run a discovery from `state` and report it as `Discovered`.
    Discover {
        /// The enumerator's state.
        state: Vec<u8>,
        /// The source's parallelism in this attempt.
        parallelism: u32,
    },
    /// Come back with `DiscoveryDue` after the wait.
    DiscoverAfter(Duration),
    /// Hand `splits` to `subtask`, over the path its barriers take.
    Assign {
        /// Which subtask.
        subtask: u32,
        /// The splits, at their positions.
        splits: Vec<SplitBytes>,
    },
    /// Tell `subtask` that no split will come: it ends once it has read
    /// the ones it holds.
    NoMoreSplits {
        /// Which subtask.
        subtask: u32,
    },
}

/// Why a source coordinator cannot go on.
#[derive(Debug, Error)]
pub enum SourceCoordinatorError {
    /// A checkpoint's state of this source cannot be read.
    #[error("the checkpointed state of source {source_name} is malformed: {problem}")]
    Malformed {
        /// The source operator's uid.
        source_name: String,
        /// What is wrong.
        problem: String,
    },
    /// The enumerator failed.
    #[error("the split enumerator of source {source_name} failed: {error}")]
    Enumerator {
        /// The source operator's uid.
        source_name: String,
        /// Its error.
        error: UserError,
    },
}

/// One split source's coordinator: the machine of this module.
pub struct SourceCoordinator {
    /// The source operator's uid: names its state in checkpoints.
    uid: String,
    enumerator: Arc<dyn ErasedEnumerator>,
    /// What every attempt starts from: the restored checkpoint's state;
    /// `None`: a fresh one.
    restored: Option<CoordinatorState>,
    state: CoordinatorState,
    parallelism: u32,
    /// Subtasks that asked while nothing was unassigned, in order.
    waiting: VecDeque<u32>,
    /// A discovery is running: no second one starts.
    discovering: bool,
    /// Why `handle` failed this attempt: its state may be half changed, so
    /// no checkpoint may hold it (the attempt fails and restarts).
    failed: Option<String>,
}

impl SourceCoordinator {
    /// The coordinator of source `uid`, discovering with `enumerator`.
    pub fn new(uid: &str, enumerator: Arc<dyn ErasedEnumerator>) -> Self {
        SourceCoordinator {
            uid: uid.to_owned(),
            enumerator,
            restored: None,
            state: CoordinatorState::default(),
            parallelism: 1,
            waiting: VecDeque::new(),
            discovering: false,
            failed: None,
        }
    }

    /// The source operator's uid.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// Runs discoveries for the shell.
    pub fn enumerator(&self) -> &Arc<dyn ErasedEnumerator> {
        &self.enumerator
    }

    /// Applies one event; the actions are for the shell, in order. After
    /// an error the coordinator refuses checkpoints until the next attempt
    /// starts.
    pub fn handle(
        &mut self,
        event: SourceEvent,
    ) -> Result<Vec<SourceAction>, SourceCoordinatorError> {
        if matches!(event, SourceEvent::Started { .. }) {
            self.failed = None;
        }
        let handled = self.apply(event);
        if let Err(e) = &handled {
            self.failed = Some(e.to_string());
        }
        handled
    }

    fn apply(&mut self, event: SourceEvent) -> Result<Vec<SourceAction>, SourceCoordinatorError> {
        let mut out = Vec::new();
        match event {
            SourceEvent::Started { parallelism } => {
                self.state = match &self.restored {
                    Some(restored) => restored.clone(),
                    None => CoordinatorState {
                        enumerator: self
                            .enumerator
                            .initial_state()
                            .map_err(|problem| self.malformed(problem))?,
                        ..CoordinatorState::default()
                    },
                };
                self.parallelism = parallelism.max(1);
                self.waiting.clear();
                self.discovering = false;
                let unassigned = std::mem::take(&mut self.state.unassigned);
                self.place(unassigned, &mut out)?;
                if self.restored.is_some() && self.enumerator.discovers_on_restore() {
                    // Requests wait for this discovery, not for no more.
                    self.state.discovered_all = false;
                }
                if !self.state.discovered_all {
                    self.discover(&mut out);
                }
            }
            SourceEvent::SplitRequested { subtask } => {
                if !self.waiting.contains(&subtask) {
                    self.waiting.push_back(subtask);
                }
                self.serve(&mut out);
            }
            SourceEvent::Discovered { splits, state } => {
                self.discovering = false;
                self.state.enumerator = state;
                self.place(splits.into(), &mut out)?;
                let interval = self.enumerator.monitor_interval();
                self.state.discovered_all = interval.is_none();
                self.serve(&mut out);
                out.extend(interval.map(SourceAction::DiscoverAfter));
            }
            SourceEvent::DiscoveryDue => self.discover(&mut out),
        }
        Ok(out)
    }

    fn discover(&mut self, out: &mut Vec<SourceAction>) {
        if !self.discovering {
            self.discovering = true;
            out.push(SourceAction::Discover {
                state: self.state.enumerator.clone(),
                parallelism: self.parallelism,
            });
        }
    }

    /// Hands splits with an owner to it, and queues the others.
    fn place(
        &mut self,
        splits: VecDeque<SplitBytes>,
        out: &mut Vec<SourceAction>,
    ) -> Result<(), SourceCoordinatorError> {
        let mut owned: BTreeMap<u32, Vec<SplitBytes>> = BTreeMap::new();
        for split in splits {
            let owner = self
                .enumerator
                .owner(&split, self.parallelism)
                .map_err(|problem| self.malformed(problem))?;
            match owner {
                Some(subtask) => owned.entry(subtask).or_default().push(split),
                None => self.state.unassigned.push_back(split),
            }
        }
        out.extend(
            owned
                .into_iter()
                .map(|(subtask, splits)| SourceAction::Assign { subtask, splits }),
        );
        Ok(())
    }

    /// Gives the waiting subtasks a split each, in the order they asked, or
    /// tells them none will come.
    fn serve(&mut self, out: &mut Vec<SourceAction>) {
        while let Some(&subtask) = self.waiting.front() {
            if let Some(split) = self.state.unassigned.pop_front() {
                out.push(SourceAction::Assign {
                    subtask,
                    splits: vec![split],
                });
            } else if self.state.discovered_all {
                out.push(SourceAction::NoMoreSplits { subtask });
            } else {
                return;
            }
            self.waiting.pop_front();
        }
    }

    /// The state a checkpoint triggered now holds.
    pub fn snapshot(&self) -> Result<Vec<u8>, SourceCoordinatorError> {
        if let Some(failed) = &self.failed {
            return Err(self.malformed(format!("it failed ({failed})")));
        }
        rmp_serde::to_vec(&self.state).map_err(|e| self.malformed(e.to_string()))
    }

    /// The state every attempt from now on starts from: a checkpoint's
    /// (`None` if it has none of this source: a fresh start).
    pub fn restore(&mut self, state: Option<&[u8]>) -> Result<(), SourceCoordinatorError> {
        self.restored = state
            .map(|bytes| rmp_serde::from_slice(bytes).map_err(|e| self.malformed(e.to_string())))
            .transpose()?;
        Ok(())
    }

    fn malformed(&self, problem: String) -> SourceCoordinatorError {
        SourceCoordinatorError::Malformed {
            source_name: self.uid.clone(),
            problem,
        }
    }
}

/// A source coordinator shared by its master hook, which snapshots and
/// restores it, and the shell that feeds it requests and discoveries: the
/// coordinator actor runs both on its thread, in turn.
pub type SharedSourceCoordinator = Arc<Mutex<SourceCoordinator>>;

/// The name of source `uid`'s state among a checkpoint's master states.
pub fn hook_name(uid: &str) -> String {
    format!("source:{uid}")
}

/// A source coordinator as the master hook that checkpoints it.
pub struct SourceHook {
    name: String,
    coordinator: SharedSourceCoordinator,
}

impl SourceHook {
    /// The hook of `coordinator`.
    pub fn new(coordinator: SharedSourceCoordinator) -> Self {
        let name = hook_name(lock(&coordinator).uid());
        SourceHook { name, coordinator }
    }
}

/// The coordinator, whatever a panic elsewhere left: its state is only
/// changed by `handle`, which does not panic midway.
pub fn lock(coordinator: &SharedSourceCoordinator) -> std::sync::MutexGuard<'_, SourceCoordinator> {
    coordinator.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MasterHook for SourceHook {
    fn name(&self) -> &str {
        &self.name
    }

    fn trigger(&mut self, _checkpoint: CheckpointId) -> Result<Option<Vec<u8>>, String> {
        lock(&self.coordinator)
            .snapshot()
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn restore(&mut self, _checkpoint: CheckpointId, state: Option<&[u8]>) -> Result<(), String> {
        lock(&self.coordinator)
            .restore(state)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;
