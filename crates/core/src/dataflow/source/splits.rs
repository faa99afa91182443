//! Split sources, as Flink's FLIP-27: a source's records come in splits (a
//! file, a byte range of one, a topic partition), which a
//! [`SplitEnumerator`] beside the checkpoint coordinator discovers and
//! hands out, and which each source subtask reads with a [`SplitReader`]
//! per split. A split carries its own position, so a checkpoint holds the
//! enumerator's state and every subtask's unfinished splits as they stood
//! at the barrier, and a restore at any parallelism deals them out again.

pub use crate::checkpoint::entries::SplitBytes;
use crate::dataflow::error::UserError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A future a connector's IO runs in; the shell awaits it.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What [`SplitEnumerator::discover`] returns.
pub type DiscoveryFuture<S, E> = BoxFuture<Result<Discovery<S, E>, UserError>>;

/// What [`ErasedEnumerator::discover`] returns: the splits and the state,
/// encoded.
pub type ErasedDiscovery = BoxFuture<Result<(Vec<SplitBytes>, Vec<u8>), UserError>>;

/// A part of a source's records with the position read up to, serialized
/// into checkpoints (MessagePack).
pub trait SourceSplit: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {
    /// Names the split among its source's, whatever its position.
    fn split_id(&self) -> String;
}

/// What one discovery found: the splits new to the enumerator's `state`,
/// and its state with them in it.
pub struct Discovery<S, E> {
    /// Splits not found before, at their start.
    pub splits: Vec<S>,
    /// The enumerator's state after them.
    pub state: E,
}

/// Discovers a source's splits. Its state (which files or partitions it has
/// seen) is checkpointed before the barriers go out, together with the
/// splits not yet handed to a subtask, so that every split is read exactly
/// once across failures, restarts and rescales.
pub trait SplitEnumerator: Send + Sync + 'static {
    /// The splits it finds.
    type Split: SourceSplit;
    /// What it remembers between discoveries; keep it bounded.
    type State: Serialize + DeserializeOwned + Default + Send + 'static;

    /// Looks for splits that `state` does not know yet, for `parallelism`
    /// reader subtasks (as Flink's `currentParallelism`, for a source that
    /// makes a split per reader). The IO runs in the future; the
    /// coordinator applies its outcome at once, so the state a checkpoint
    /// holds and the splits handed out always agree.
    fn discover(
        &self,
        state: Self::State,
        parallelism: u32,
    ) -> DiscoveryFuture<Self::Split, Self::State>;

    /// How long after a discovery to look again; `None` for a bounded
    /// source, which discovers once and then tells every subtask that no
    /// more splits will come (Flink's `signalNoMoreSplits`).
    fn monitor_interval(&self) -> Option<Duration>;

    /// Whether a bounded source discovers again when an attempt starts
    /// from a checkpoint in which it had discovered all: a generator whose
    /// run asks for more records than the checkpoint's run made. Files and
    /// Kafka do not: bounded is what their first discovery found.
    fn discovers_on_restore(&self) -> bool {
        false
    }

    /// The subtask of `parallelism` a split must go to (as Kafka pins a
    /// partition to a reader), or `None` for whichever subtask asks first.
    fn owner(&self, _split: &Self::Split, _parallelism: u32) -> Option<u32> {
        None
    }
}

/// Reads one split of records `T`.
pub trait SplitReader<T, S>: Send {
    /// Appends at most `max` records to `out`; `Finished` once the split
    /// is read to its end. `Running` with nothing appended means its data
    /// is on its way: the subtask asks again a little later.
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<super::SourceStatus, UserError>;

    /// The split at the position after the records read so far: reading it
    /// again resumes exactly after them.
    fn split(&self) -> S;
}

/// A split source of records `T`: an enumerator that also opens readers of
/// its splits, one per split a subtask holds.
pub trait SplitSource<T>: SplitEnumerator {
    /// A reader of `split` from its position.
    fn open(&self, split: Self::Split) -> Result<Box<dyn SplitReader<T, Self::Split>>, UserError>;

    /// A checkpoint in which a subtask held `splits`, at these positions,
    /// completed: as Flink's Kafka source, a source may publish them
    /// (for monitoring only: restores read positions from checkpoints).
    fn checkpoint_complete(&self, _splits: &[Self::Split]) -> Result<(), UserError> {
        Ok(())
    }
}

impl SplitBytes {
    /// Encodes `split`.
    pub fn encode<S: SourceSplit>(split: &S) -> Result<Self, rmp_serde::encode::Error> {
        Ok(SplitBytes {
            id: split.split_id(),
            bytes: rmp_serde::to_vec(split)?,
        })
    }

    /// Decodes the split.
    pub fn decode<S: SourceSplit>(&self) -> Result<S, String> {
        rmp_serde::from_slice(&self.bytes)
            .map_err(|e| format!("split {} is not one of this source's: {e}", self.id))
    }
}

/// An enumerator with its splits and state as bytes, for the coordinator,
/// which knows no source's types.
pub trait ErasedEnumerator: Send + Sync {
    /// [`SplitEnumerator::discover`] from encoded state.
    fn discover(&self, state: &[u8], parallelism: u32) -> ErasedDiscovery;
    /// [`SplitEnumerator::monitor_interval`].
    fn monitor_interval(&self) -> Option<Duration>;
    /// [`SplitEnumerator::discovers_on_restore`].
    fn discovers_on_restore(&self) -> bool;
    /// [`SplitEnumerator::owner`] of an encoded split.
    fn owner(&self, split: &SplitBytes, parallelism: u32) -> Result<Option<u32>, String>;
    /// The encoded state of an enumerator that has discovered nothing.
    fn initial_state(&self) -> Result<Vec<u8>, String>;
}

/// Erases `E`'s types.
pub struct Erased<E>(pub std::sync::Arc<E>);

impl<E: SplitEnumerator> ErasedEnumerator for Erased<E> {
    fn discover(&self, state: &[u8], parallelism: u32) -> ErasedDiscovery {
        let state: E::State = match rmp_serde::from_slice(state) {
            Ok(state) => state,
            Err(e) => {
                let error: UserError = format!("a malformed split enumerator state: {e}").into();
                return Box::pin(std::future::ready(Err(error)));
            }
        };
        let discovery = self.0.discover(state, parallelism);
        Box::pin(async move {
            let Discovery { splits, state } = discovery.await?;
            let splits = splits
                .iter()
                .map(SplitBytes::encode)
                .collect::<Result<Vec<_>, _>>()?;
            Ok((splits, rmp_serde::to_vec(&state)?))
        })
    }

    fn monitor_interval(&self) -> Option<Duration> {
        self.0.monitor_interval()
    }

    fn discovers_on_restore(&self) -> bool {
        self.0.discovers_on_restore()
    }

    fn owner(&self, split: &SplitBytes, parallelism: u32) -> Result<Option<u32>, String> {
        let split: E::Split = split.decode()?;
        Ok(self
            .0
            .owner(&split, parallelism)
            .map(|owner| owner % parallelism.max(1)))
    }

    fn initial_state(&self) -> Result<Vec<u8>, String> {
        rmp_serde::to_vec(&E::State::default())
            .map_err(|e| format!("cannot encode a split enumerator state: {e}"))
    }
}
