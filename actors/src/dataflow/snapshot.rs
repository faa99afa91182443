//! The asynchronous part of a subtask's snapshot: serialize what the
//! synchronous part copied, off the arbiter's thread, place the resulting
//! state objects (inline, merged or as objects of their own, see
//! `tidemark_core::checkpoint::merging`) and write the physical files to
//! checkpoint storage, a bounded number at a time.
//!
//! A heap snapshot's key groups are encoded on the blocking pool from the
//! moment the snapshot is taken ([`start`]), each handed over as soon as it
//! is encoded; the encoder does not wait for the arbiter, which is busy with
//! records, to poll the upload. Once the groups received are more than an
//! object that shares a physical file can hold, the keyed state is an object
//! of its own, and its writing starts while the rest is still being encoded.

use actix::{
    Actor, Addr, Arbiter, Context, Handler, Message, Supervised, Supervisor, SystemService,
};
use actix_rt::ArbiterHandle;
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io::Read;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tidemark_core::checkpoint::merging::UploadLimits;
use tidemark_core::checkpoint::merging::{MergePlan, Placement, StateLayout};
use tidemark_core::checkpoint::subtask::SharedBase;
use tidemark_core::checkpoint::{
    ChannelSide, ChannelState, ChannelStateHandle, Checksum, KeyGroupsStateHandle,
    KeyedStateHandle, NativeFileHandle, NativeStateHandle, StateHandle, SubtaskState,
};
use tidemark_core::dataflow::task::{KeyedSnapshot, NativeCheckpoint, PendingNative, TaskSnapshot};
use tidemark_core::model::batch::{Batch, EncodedBatch};
use tidemark_core::model::ids::{CheckpointId, SubtaskId};
use tidemark_storage::upload::ObjectWriter;
use tidemark_storage::CheckpointStorage;
use tokio::sync::mpsc;

/// Runs the asynchronous part of a snapshot on the arbiter of the
/// [`Uploads`] of this actix system.
pub fn spawn(part: impl Future<Output = ()> + Send + 'static) {
    Uploads::from_registry().do_send(Upload(Box::pin(part)));
}

/// The asynchronous parts of snapshots run on an arbiter of their own, one
/// per actix system: on a subtask's arbiter they wait while the actors there
/// process records (actix runs an actor's mailbox until it is empty), which
/// held acknowledgements back by 10 ms and more at 1,000,000 keys.
#[derive(Default)]
pub struct Uploads;

impl Actor for Uploads {
    type Context = Context<Self>;
}

impl Supervised for Uploads {}

impl SystemService for Uploads {
    fn start_service(_: &ArbiterHandle) -> Addr<Self> {
        Supervisor::start_in_arbiter(&Arbiter::new().handle(), |_| Uploads)
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Upload(Pin<Box<dyn Future<Output = ()> + Send>>);

impl Handler<Upload> for Uploads {
    type Result = ();

    fn handle(&mut self, upload: Upload, _: &mut Context<Self>) {
        actix_rt::spawn(upload.0);
    }
}

/// Physical files written at once by one snapshot.
const PARALLEL_WRITES: usize = 4;

/// Bytes read from a native checkpoint's file at a time.
const READ_CHUNK: usize = 4 << 20;

/// Where a state object's bytes come from.
enum Source {
    /// Pieces in memory, back to back: the key groups of a heap snapshot,
    /// each as it was encoded, or a channel's batches.
    Memory(Vec<Bytes>),
    /// A file of a native checkpoint, read in chunks when its turn to
    /// upload comes, never whole.
    File(PathBuf),
}

impl Source {
    /// All of it at once: for objects small enough to travel inline.
    async fn read(self) -> Result<Vec<u8>, String> {
        match self {
            Source::Memory(pieces) => Ok(pieces.concat()),
            Source::File(file) => {
                let described = file.display().to_string();
                let read = blocking(move || std::fs::read(file)).await?;
                read.map_err(|e| format!("reading {described}: {e}"))
            }
        }
    }

    /// Streams the bytes into `writer`; returns their checksum. They must
    /// be `size` bytes, as planned: a file that changed size is refused
    /// rather than recorded with wrong offsets.
    async fn write_to(self, writer: &mut ObjectWriter<'_>, size: u64) -> Result<u32, String> {
        let mut sum = Checksum::default();
        let described = match self {
            Source::Memory(pieces) => {
                for piece in pieces {
                    sum.update(&piece);
                    writer.write(piece).await.map_err(|e| e.to_string())?;
                }
                "state in memory".to_owned()
            }
            Source::File(path) => {
                let described = path.display().to_string();
                let reading = |e: std::io::Error| format!("reading {described}: {e}");
                let mut file = blocking(move || std::fs::File::open(path))
                    .await?
                    .map_err(reading)?;
                loop {
                    let (back, chunk) =
                        blocking(move || read_chunk(file)).await?.map_err(reading)?;
                    if chunk.is_empty() {
                        break;
                    }
                    file = back;
                    sum.update(&chunk);
                    let chunk = Bytes::from(chunk);
                    writer.write(chunk).await.map_err(|e| e.to_string())?;
                }
                described
            }
        };
        if sum.len() != size {
            return Err(format!(
                "{described} was {size} bytes when planned and {} when written",
                sum.len()
            ));
        }
        Ok(sum.finish())
    }
}

/// `work` on the blocking pool: file IO stays off the runtime's thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| e.to_string())
}

/// The next `READ_CHUNK` bytes of `file` (none at its end), and the file
/// to read on from.
fn read_chunk(mut file: std::fs::File) -> std::io::Result<(std::fs::File, Vec<u8>)> {
    let mut chunk = Vec::with_capacity(READ_CHUNK);
    file.by_ref()
        .take(READ_CHUNK as u64)
        .read_to_end(&mut chunk)?;
    Ok((file, chunk))
}

/// A snapshot whose asynchronous part has started.
pub struct Started {
    keyed: Option<Keyed>,
    operator: BTreeMap<String, Vec<u8>>,
    timers: u64,
}

enum Keyed {
    Heap(Encoding),
    /// Being made; its directory is removed once it is, if the snapshot
    /// is dropped before (a declined or aborted checkpoint).
    Native(PendingNative),
}

/// The key groups of a heap snapshot, encoded in order on the blocking pool
/// and received one by one. Unbounded: the encoded state is held at most
/// once, as when it was encoded whole before writing. Dropping it stops the
/// encoder, which releases what the snapshot still shares.
struct Encoding {
    start_group: u32,
    groups: usize,
    receiver: mpsc::UnboundedReceiver<Bytes>,
    /// Key groups received and not yet handed on.
    held: VecDeque<Bytes>,
    /// Offset of each group received in the object.
    offsets: Vec<u64>,
    size: u64,
}

impl Encoding {
    /// Receives the `groups` key groups from `start_group` on, as `receiver`
    /// gets them.
    fn new(start_group: u32, groups: usize, receiver: mpsc::UnboundedReceiver<Bytes>) -> Self {
        Encoding {
            start_group,
            groups,
            receiver,
            held: VecDeque::new(),
            offsets: Vec::new(),
            size: 0,
        }
    }

    fn received_all(&self) -> bool {
        self.offsets.len() == self.groups
    }

    async fn receive(&mut self) -> Result<(), String> {
        let Some(bytes) = self.receiver.recv().await else {
            return Err(format!(
                "encoding key group {} of the heap snapshot failed",
                self.start_group as usize + self.offsets.len()
            ));
        };
        self.offsets.push(self.size);
        self.size += bytes.len() as u64;
        self.held.push_back(bytes);
        Ok(())
    }

    /// Holds key groups until more than `bytes` or all of them arrived;
    /// returns whether all did.
    async fn hold_beyond(&mut self, bytes: u64) -> Result<bool, String> {
        while self.size <= bytes && !self.received_all() {
            self.receive().await?;
        }
        Ok(self.received_all())
    }

    /// The next key group, encoded; `None` after the last.
    async fn next(&mut self) -> Result<Option<Bytes>, String> {
        if self.held.is_empty() && !self.received_all() {
            self.receive().await?;
        }
        Ok(self.held.pop_front())
    }
}

/// Starts the asynchronous part of `snapshot`: a heap snapshot's encoder
/// starts at once. Needs the runtime of the arbiter.
pub fn start(snapshot: TaskSnapshot) -> Started {
    let TaskSnapshot {
        keyed,
        operator,
        timers,
    } = snapshot;
    let keyed = keyed.map(|keyed| match keyed {
        KeyedSnapshot::Heap(heap) => {
            let range = heap.key_groups();
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::task::spawn_blocking(move || {
                for group in 0..range.len() {
                    if sender.send(Bytes::from(heap.take_group(group))).is_err() {
                        return;
                    }
                }
            });
            Keyed::Heap(Encoding::new(range.start, range.len(), receiver))
        }
        KeyedSnapshot::Native(pending) => {
            // The cache's write-back and the checkpoint, off the subtask.
            tokio::task::spawn_blocking(pending.job());
            Keyed::Native(pending)
        }
    });
    Started {
        keyed,
        operator,
        timers,
    }
}

/// A heap snapshot's keyed state as an object of its own, written as its
/// key groups are encoded.
struct Streamed {
    path: String,
    encoding: Encoding,
}

impl Streamed {
    /// Writes the object; returns its handle, the key groups' offsets and
    /// the first key group.
    async fn write(
        mut self,
        storage: &CheckpointStorage,
        limits: UploadLimits,
    ) -> Result<(StateHandle, (Vec<u64>, u32)), String> {
        let mut writer = storage
            .writer(&self.path, limits)
            .map_err(|e| e.to_string())?;
        let mut sum = Checksum::default();
        let written = loop {
            match self.encoding.next().await {
                Ok(Some(bytes)) => {
                    sum.update(&bytes);
                    if let Err(e) = writer.write(bytes).await {
                        break Err(e.to_string());
                    }
                }
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        if let Err(error) = written {
            writer.abort().await;
            return Err(error);
        }
        writer.finish().await.map_err(|e| e.to_string())?;
        let handle = StateHandle::object(self.path, sum.len(), sum.finish());
        Ok((handle, (self.encoding.offsets, self.encoding.start_group)))
    }
}

/// How the handles of the written objects go back into a `SubtaskState`, in
/// the order the objects were listed.
struct Shape {
    operator: BTreeMap<String, Vec<u8>>,
    heap: Option<(Vec<u64>, u32)>,
    native: Option<NativeStateHandle>,
    checkpoint: CheckpointId,
    channels: Vec<(ChannelSide, usize, usize)>,
    timers: u64,
}

/// A snapshot whose objects are serialized and placed but not written: its
/// physical files are known before any byte goes out, so that a cancelled
/// upload can delete whatever of them it wrote.
pub struct Prepared {
    started: Instant,
    plan: MergePlan,
    limits: UploadLimits,
    sources: Vec<Source>,
    streamed: Option<Streamed>,
    /// The hard links of a native checkpoint, removed whatever happens.
    _links: Option<Links>,
    shape: Shape,
}

/// Serializes `snapshot` and the non-empty `channels` and places their
/// objects by `layout`. Objects of their own go under the checkpoint's
/// directory, new shared files under `shared/`. With a `base`, the shared
/// files of a native checkpoint that the base holds are referenced, not
/// uploaded. A heap snapshot's keyed state is received until it is known
/// to be an object of its own (then streamed by the upload) or whole.
pub async fn prepare(
    subtask: SubtaskId,
    checkpoint: CheckpointId,
    snapshot: Started,
    channels: Vec<ChannelState>,
    base: Option<&SharedBase>,
    layout: &StateLayout,
    run: &str,
) -> Result<Prepared, String> {
    let started = Instant::now();
    let Started {
        keyed,
        operator,
        timers,
    } = snapshot;
    let prefix = format!(
        "{}/op-{}-{}-{run}",
        CheckpointStorage::checkpoint_dir(checkpoint),
        subtask.operator.0,
        subtask.index.0
    );
    let (heap, native, links) = match keyed {
        None => (None, None, None),
        Some(Keyed::Heap(heap)) => (Some(heap), None, None),
        Some(Keyed::Native(pending)) => {
            // Its directory is removed whether the snapshot is uploaded,
            // fails or is dropped, even while this waits.
            let made = blocking(move || pending.wait().map(|n| (Links(n.dir.clone()), n)));
            let (links, native) = made
                .await?
                .map_err(|e| format!("making the native checkpoint failed: {e}"))?;
            (None, Some(native), Some(links))
        }
    };
    let channels = tokio::task::spawn_blocking(move || {
        channels
            .into_iter()
            .filter(|c| !c.batches.is_empty())
            .map(|c| {
                let encoded: Vec<EncodedBatch> = c.batches.iter().map(Batch::encode).collect();
                let bytes = rmp_serde::to_vec(&encoded).expect("batches serialize to memory");
                (c.side, c.channel, encoded.len(), Bytes::from(bytes))
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| format!("serializing state failed: {e}"))?;

    // Every object, as (path of its own, size, source), in the order the
    // handles are taken back out in `Prepared::upload`: the keyed state's
    // first (unless streamed), then the channels'.
    let mut objects: Vec<(String, u64, Source)> = Vec::new();
    let mut streamed = None;
    let mut heap_shape = None;
    if let Some(mut encoding) = heap {
        let path = format!("{prefix}-keyed");
        if encoding.hold_beyond(layout.alone_above()).await? {
            let held = Vec::from(encoding.held);
            objects.push((path, encoding.size, Source::Memory(held)));
            heap_shape = Some((encoding.offsets, encoding.start_group));
        } else {
            streamed = Some(Streamed { path, encoding });
        }
    }
    let native = native.map(|native| {
        plan_native(
            native,
            subtask,
            checkpoint,
            &prefix,
            base,
            run,
            &mut objects,
        )
    });
    let channels = channels
        .into_iter()
        .map(|(side, channel, batches, bytes)| {
            let name = match side {
                ChannelSide::Input => "in",
                ChannelSide::Output => "out",
            };
            let size = bytes.len() as u64;
            objects.push((
                format!("{prefix}-{name}-{channel}"),
                size,
                Source::Memory(vec![bytes]),
            ));
            (side, channel, batches)
        })
        .collect();
    let (paths, sources): (Vec<(String, u64)>, Vec<Source>) = objects
        .into_iter()
        .map(|(path, size, source)| ((path, size), source))
        .unzip();
    let plan = layout.plan(
        subtask,
        checkpoint,
        tidemark_storage::unique_token(),
        &paths,
    );
    let native = native.map(|(_, handle)| handle);
    Ok(Prepared {
        started,
        plan,
        limits: layout.upload,
        sources,
        streamed,
        _links: links,
        shape: Shape {
            operator,
            heap: heap_shape,
            native,
            checkpoint,
            channels,
            timers,
        },
    })
}

impl Prepared {
    /// The physical files the upload writes.
    pub fn physical_files(&self) -> Vec<String> {
        let streamed = self.streamed.iter().map(|s| s.path.clone());
        streamed
            .chain(self.plan.files.iter().map(|f| f.path.clone()))
            .collect()
    }

    /// Writes the physical files and returns the state to acknowledge and
    /// how long the asynchronous part took. If any write fails, what was
    /// written is deleted again: no acknowledgement will ever name it.
    pub async fn upload(
        self,
        storage: &CheckpointStorage,
    ) -> Result<(SubtaskState, Duration), String> {
        let files = self.physical_files();
        let Prepared {
            started,
            plan,
            limits,
            sources,
            streamed,
            _links,
            mut shape,
        } = self;
        let streamed = async {
            match streamed {
                Some(streamed) => streamed.write(storage, limits).await.map(Some),
                None => Ok(None),
            }
        };
        let written = write_files(storage, &plan, limits, sources);
        let (streamed, written) = match futures::join!(streamed, written) {
            (Ok(streamed), Ok(written)) => (streamed, written),
            (Err(error), _) | (_, Err(error)) => {
                delete_all(storage, files).await;
                return Err(error);
            }
        };
        let streamed = streamed.map(|(handle, heap)| {
            shape.heap = Some(heap);
            handle
        });
        let handles = written
            .into_iter()
            .enumerate()
            .map(|(index, written)| match written {
                Written::Inline(bytes) => StateHandle::Inline(bytes),
                Written::Stored(checksum) => {
                    plan.handle(index, checksum).expect("placed in a file")
                }
            });
        Ok((
            shape.state(streamed.into_iter().chain(handles)),
            started.elapsed(),
        ))
    }
}

/// The directory of hard links of a native checkpoint: ours to remove once
/// uploaded, failed or cancelled.
struct Links(PathBuf);

impl Drop for Links {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Shape {
    fn state(self, handles: impl Iterator<Item = StateHandle>) -> SubtaskState {
        let mut handles = handles;
        let mut next = || handles.next().expect("one handle per object");
        let Shape {
            operator,
            heap,
            native,
            checkpoint,
            channels,
            timers,
        } = self;
        let keyed = match (heap, native) {
            (Some((offsets, start_group)), _) => {
                Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                    start_group,
                    offsets,
                    handle: next(),
                }))
            }
            (None, Some(mut handle)) => {
                for file in handle.private.iter_mut() {
                    file.handle = next();
                }
                for file in handle.shared.iter_mut() {
                    if file.uploaded_by == checkpoint {
                        file.handle = next();
                    }
                }
                Some(KeyedStateHandle::Native(handle))
            }
            (None, None) => None,
        };
        let channels = channels
            .into_iter()
            .map(|(side, channel, batches)| ChannelStateHandle {
                side,
                channel: channel as u32,
                batches: batches as u32,
                handle: next(),
            })
            .collect();
        SubtaskState {
            keyed,
            operator,
            channels,
            timers,
        }
    }
}

/// The handle of a native checkpoint, and the objects to upload for it:
/// private files into the checkpoint's directory, shared files the base
/// does not hold into `shared/`. Paths of shared files name the checkpoint
/// and the run that uploaded them, so two checkpoints never write the same
/// object.
/// Handles of uploads are filled in once written, in the order pushed.
fn plan_native(
    native: NativeCheckpoint,
    subtask: SubtaskId,
    checkpoint: CheckpointId,
    prefix: &str,
    base: Option<&SharedBase>,
    run: &str,
    objects: &mut Vec<(String, u64, Source)>,
) -> (NativeCheckpoint, NativeStateHandle) {
    let pending = |name: &str| NativeFileHandle {
        name: name.to_owned(),
        handle: StateHandle::Inline(Vec::new()),
        uploaded_by: checkpoint,
        instance: native.instance,
    };
    let mut private = Vec::new();
    let mut shared = Vec::new();
    for file in native.files.iter().filter(|f| !f.is_shared()) {
        private.push(pending(&file.name));
        let path = format!("{prefix}-{}", file.name);
        objects.push((path, file.size, Source::File(native.dir.join(&file.name))));
    }
    for file in native.files.iter().filter(|f| f.is_shared()) {
        match base
            .and_then(|b| b.get(&file.name))
            .filter(|f| f.handle.size() == file.size)
        {
            Some(reused) => shared.push(reused.clone()),
            None => {
                shared.push(pending(&file.name));
                let path = format!(
                    "shared/op-{}-{}/{checkpoint}-{run}-{}",
                    subtask.operator.0, subtask.index.0, file.name
                );
                objects.push((path, file.size, Source::File(native.dir.join(&file.name))));
            }
        }
    }
    let handle = NativeStateHandle {
        key_groups: native.key_groups,
        shared,
        private,
    };
    (native, handle)
}

/// The objects of one physical file, by index, with their bytes.
type Parts = Vec<(usize, Source)>;

/// What became of one object of a snapshot.
enum Written {
    /// Its bytes, which travel in the acknowledgement.
    Inline(Vec<u8>),
    /// Stored, with this CRC-32 of its bytes.
    Stored(u32),
}

/// Writes the physical files of `plan`, each its objects back to back,
/// streamed (see `tidemark_storage::upload`), at most `PARALLEL_WRITES` at a
/// time; returns, per object, what became of it.
async fn write_files(
    storage: &CheckpointStorage,
    plan: &MergePlan,
    limits: UploadLimits,
    sources: Vec<Source>,
) -> Result<Vec<Written>, String> {
    let mut sources: Vec<Option<Source>> = sources.into_iter().map(Some).collect();
    let mut out: Vec<Option<Written>> = (0..plan.placements.len()).map(|_| None).collect();
    for (index, placement) in plan.placements.iter().enumerate() {
        if matches!(placement, Placement::Inline) {
            let source = sources[index].take().expect("each object once");
            out[index] = Some(Written::Inline(source.read().await?));
        }
    }
    let files: Vec<(String, Parts)> = plan
        .files
        .iter()
        .map(|file| {
            let parts = file
                .objects
                .iter()
                .map(|&i| (i, sources[i].take().expect("each object once")))
                .collect();
            (file.path.clone(), parts)
        })
        .collect();
    let results: Vec<Result<Vec<(usize, u32)>, String>> = stream::iter(files)
        .map(|(path, parts)| async move {
            let mut writer = storage.writer(&path, limits).map_err(|e| e.to_string())?;
            let mut checksums = Vec::with_capacity(parts.len());
            for (index, part) in parts {
                match part.write_to(&mut writer, plan.size(index)).await {
                    Ok(checksum) => checksums.push((index, checksum)),
                    Err(error) => {
                        writer.abort().await;
                        return Err(error);
                    }
                }
            }
            writer.finish().await.map_err(|e| e.to_string())?;
            Ok(checksums)
        })
        .buffered(PARALLEL_WRITES)
        .collect()
        .await;
    for (index, checksum) in results.into_iter().collect::<Result<Vec<_>, _>>()?.concat() {
        out[index] = Some(Written::Stored(checksum));
    }
    Ok(out
        .into_iter()
        .map(|written| written.expect("every object inline or in a file"))
        .collect())
}

/// Deletes `paths` (the physical files of an upload that failed or was
/// cancelled, whichever of them it wrote), every one even if some fail: an
/// object left behind is an orphan that `tidemark cleanup` sweeps.
pub async fn delete_all(storage: &CheckpointStorage, paths: Vec<String>) {
    match storage.delete_many(paths).await {
        Ok(failed) => {
            for (path, e) in failed {
                tracing::warn!(error = %e, path, "deleting an abandoned state object failed");
            }
        }
        Err(e) => tracing::warn!(error = %e, "deleting abandoned state objects failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::model::ids::JobId;

    /// The encoding of key groups 10, 11 and 12 by an encoder that stopped
    /// (it panicked) after sending `sent`.
    fn stopped_after(sent: &[&'static [u8]]) -> Encoding {
        let (sender, receiver) = mpsc::unbounded_channel();
        for bytes in sent {
            sender.send(Bytes::from_static(bytes)).unwrap();
        }
        Encoding::new(10, 3, receiver)
    }

    /// A heap snapshot whose encoder ends early fails, naming the first key
    /// group that never came, whether its groups are still held or already
    /// streaming into a multipart upload, which is given up: the truncated
    /// state never becomes an object.
    #[tokio::test]
    async fn an_encoder_that_ends_early_fails_the_snapshot_and_leaves_nothing_behind() {
        let error = stopped_after(&[b"group 10"])
            .hold_beyond(u64::MAX)
            .await
            .unwrap_err();
        assert!(error.contains("key group 11"), "{error}");

        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap(), JobId(1)).unwrap();
        let checkpoint = CheckpointStorage::checkpoint_dir(CheckpointId(1));
        let streamed = Streamed {
            path: format!("{checkpoint}/op-0-0-run-keyed"),
            encoding: stopped_after(&[b"group 10", b"group 11"]),
        };
        let limits = UploadLimits {
            multipart_threshold: 4,
            part_size: 4,
            parts_in_flight: 1,
        };
        let error = streamed.write(&storage, limits).await.unwrap_err();
        assert!(error.contains("key group 12"), "{error}");
        let checkpoint = dir.path().join(JobId(1).to_string()).join(checkpoint);
        let left: Vec<_> = std::fs::read_dir(&checkpoint)
            .map(|entries| entries.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
