//! `_metadata` decoding, fuzzed. Whatever bytes a restore reads as
//! `_metadata` — a valid file whose payload was mutated and its checksum
//! recomputed (bytes changed, cut, inserted or copied, length prefixes of
//! 4 G elements or bytes spliced in, nesting deeper than the decoder allows,
//! unknown fields), a valid file damaged without recomputing its checksum,
//! or the encoding of a checkpoint with arbitrary paths, offsets, sizes, key
//! groups and ids — is either refused with a typed error or decodes to a
//! checkpoint on which everything a restore does before it reads state
//! behaves:
//!
//! - decoding never panics and never makes an allocation out of proportion
//!   to its input (measured by this test binary's allocator, below);
//! - [`check_references`] accepts the checkpoint exactly when
//!   [`CheckpointStorage::resolve`] resolves every object it names, and then
//!   every one lies under the job directory: on a local directory with
//!   files planted outside the job directory, no read reaches them;
//! - [`restore::plan`] returns a plan or a [`restore::RestoreError`], never panics,
//!   and a plan only hands a subtask of the job key groups it owns, byte
//!   ranges inside their state object and channels it has;
//! - [`StateHandle::range`], [`StateHandle::from_object`] and
//!   [`StateHandle::from_range`] never panic, whatever the offset and size,
//!   and only return bytes of the recorded length and checksum.
//!
//! Case counts are modest so that the suite stays fast; proptest keeps a
//! failing case in `proptest-regressions/` and replays it first.

use crate::{CheckpointStorage, ReadError, StorageError};
use bytes::Bytes;
use object_store::path::Path;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config, TestRunner};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use tidemark_core::checkpoint::metadata::{decode, encode, MetadataError};
use tidemark_core::checkpoint::restore::{self, RestorePlan};
use tidemark_core::checkpoint::savepoint::check_references;
use tidemark_core::checkpoint::{
    checksum, stays_inside, ChannelSide, ChannelStateHandle, CompletedCheckpoint,
    KeyGroupsStateHandle, KeyedStateHandle, NativeFileHandle, NativeStateHandle, SnapshotFormat,
    StateHandle, SubtaskState,
};
use tidemark_core::dataflow::task::{SINK, SOURCE_EXHAUSTED, SOURCE_POSITION, SOURCE_WATERMARK};
use tidemark_core::model::event::CheckpointKind;
use tidemark_core::model::graph::{Edge, JobGraph, OperatorSpec, Partitioner};
use tidemark_core::model::ids::{CheckpointId, JobId, OperatorId, SubtaskId, SubtaskIndex};
use tidemark_core::model::key_group::KeyGroupRange;

// ---------------------------------------------------------------------------
// Allocation measure

/// This test binary's allocator: the system's, noting the largest single
/// allocation a thread makes while it measures ([`largest_allocation`]).
/// Other threads and tests pay one thread-local read per allocation.
struct Measuring;

thread_local! {
    /// The largest allocation of this thread while it measures.
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note(size: usize) {
    // `try_with`: allocations during the thread's teardown are not noted.
    let _ = LARGEST.try_with(|largest| {
        if let Some(seen) = largest.get() {
            largest.set(Some(seen.max(size)));
        }
    });
}

// SAFETY: every call goes to `System` unchanged.
unsafe impl GlobalAlloc for Measuring {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `System`'s contract, which is ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as `alloc`; `ptr` came from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as `alloc`; `ptr` came from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Measuring = Measuring;

/// What `f` returned and the largest single allocation it made.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|largest| largest.set(Some(0)));
    let out = f();
    (out, LARGEST.with(|largest| largest.take()).unwrap_or(0))
}

/// The most a decode or a restore plan of `input` bytes may allocate at
/// once: serde preallocates at most 1 MiB for a sequence whatever length it
/// claims, and a vector grown to hold what the input holds needs at most
/// twice an element (well under 128 bytes) per input byte.
fn allocation_bound(input: usize) -> usize {
    (1 << 20) + 256 * input
}

// ---------------------------------------------------------------------------
// The job, the restore's checks

const JOB: JobId = JobId(7);

/// A job of a source (operator 0) feeding a counter (operator 1), as in
/// the restore tests; its uids are `source-0` and `count-1`.
#[derive(Clone, Debug)]
struct Job {
    source: u32,
    count: u32,
    partitioner: Partitioner,
    max_parallelism: u32,
    allow_non_restored: bool,
}

impl Job {
    /// The job [`sample`] was taken of: both at parallelism 2, a hash edge.
    fn sampled() -> Self {
        Job {
            source: 2,
            count: 2,
            partitioner: Partitioner::Hash,
            max_parallelism: 128,
            allow_non_restored: false,
        }
    }

    fn graph(&self) -> JobGraph {
        let mut g = JobGraph::default();
        let source = g.add_operator("source", self.source);
        let count = match self.partitioner {
            Partitioner::Forward => self.source,
            _ => self.count,
        };
        let count = g.add_operator("count", count);
        for op in &mut g.operators {
            op.max_parallelism = self.max_parallelism;
        }
        g.edges.push(Edge {
            from: source,
            to: count,
            partitioner: self.partitioner,
            input: 0,
        });
        assert_eq!(g.validate(), Ok(()));
        g
    }
}

fn partitioner() -> impl Strategy<Value = Partitioner> {
    select(vec![
        Partitioner::Hash,
        Partitioner::Rebalance,
        Partitioner::Broadcast,
        Partitioner::Forward,
    ])
}

fn job() -> impl Strategy<Value = Job> {
    (
        1..=3u32,
        1..=3u32,
        partitioner(),
        prop_oneof![4 => Just(128u32), 1 => 3..=8u32],
        any::<bool>(),
    )
        .prop_map(
            |(source, count, partitioner, max_parallelism, allow_non_restored)| Job {
                source,
                count,
                partitioner,
                max_parallelism,
                allow_non_restored,
            },
        )
}

/// The job's directory in the memory store [`storage`] opens.
fn job_dir() -> Path {
    Path::from_iter(["tenant", "checkpoints", &JOB.to_string()])
}

fn storage() -> CheckpointStorage {
    CheckpointStorage::open("memory:///tenant/checkpoints", JOB).expect("a memory store opens")
}

/// Every check a restore makes of `checkpoint` before it reads state,
/// against `job`.
fn check_restore(checkpoint: &CompletedCheckpoint, job: &Job) -> Result<(), TestCaseError> {
    check_paths(checkpoint)?;
    for handle in checkpoint.subtasks.values().flat_map(SubtaskState::handles) {
        check_handle(handle, &[])?;
    }
    let graph = job.graph();
    let input = encode(checkpoint).len();
    let (planned, largest) =
        largest_allocation(|| restore::plan(checkpoint, &graph, job.allow_non_restored));
    prop_assert!(
        largest <= allocation_bound(input),
        "planning {input} bytes of metadata allocated {largest} bytes at once"
    );
    // A `RestoreError` is a refusal with a reason, all a plan may fail with.
    if let Ok(plans) = planned {
        check_plans(&plans, &graph)?;
    }
    Ok(())
}

/// `check_references` accepts exactly the checkpoints whose every object
/// resolves, and each resolves to a path under the job directory, one part
/// per segment.
fn check_paths(checkpoint: &CompletedCheckpoint) -> Result<(), TestCaseError> {
    let storage = storage();
    let dir = job_dir();
    let references = check_references("fuzz/_metadata", checkpoint);
    let mut escaping = 0;
    for handle in checkpoint.subtasks.values().flat_map(SubtaskState::handles) {
        let Some(object) = handle.physical() else {
            continue;
        };
        match storage.resolve(object) {
            Ok(path) => {
                let parts = path.prefix_match(&dir).map(Iterator::count);
                prop_assert_eq!(
                    parts,
                    Some(object.split('/').count()),
                    "{:?} resolved to {}, not under {}",
                    object,
                    path,
                    dir
                );
            }
            Err(StorageError::EscapingPath(path)) => {
                prop_assert_eq!(&path, object);
                escaping += 1;
            }
            Err(e) => prop_assert!(false, "{:?}: {}", object, e),
        }
    }
    match references {
        Ok(()) => prop_assert_eq!(escaping, 0, "references accepted, paths refused"),
        Err(e) => {
            prop_assert!(escaping > 0, "{} but every path resolves", e);
            prop_assert!(!stays_inside(&e.reference));
        }
    }
    Ok(())
}

/// `handle` computes its range and cuts `object` without panicking, and
/// hands out only bytes of its recorded length and checksum.
fn check_handle(handle: &StateHandle, object: &[u8]) -> Result<(), TestCaseError> {
    let range = handle.range();
    prop_assert!(range.start <= range.end, "{:?}: {:?}", handle, range);
    let object = Bytes::copy_from_slice(object);
    let cuts = [
        handle.from_object(object.clone()),
        handle.from_range(object),
    ];
    let recorded = match handle {
        StateHandle::Inline(_) => return Ok(()),
        StateHandle::Object { checksum, .. } | StateHandle::Segment { checksum, .. } => *checksum,
    };
    for bytes in cuts.into_iter().flatten() {
        prop_assert_eq!(bytes.len() as u64, handle.size());
        prop_assert_eq!(checksum(&bytes), recorded);
    }
    Ok(())
}

/// A plan only concerns subtasks of the job, and hands each the key groups
/// it owns, byte ranges inside their object, native checkpoints of key
/// groups of the job and channels it has.
fn check_plans(
    plans: &HashMap<SubtaskId, RestorePlan>,
    graph: &JobGraph,
) -> Result<(), TestCaseError> {
    for (subtask, plan) in plans {
        let Some(op) = graph.operators.get(subtask.operator.0 as usize) else {
            return Err(TestCaseError::fail(format!("a plan for {subtask}")));
        };
        prop_assert!(subtask.index.0 < op.parallelism, "a plan for {}", subtask);
        let owned = KeyGroupRange::for_subtask(op.max_parallelism, op.parallelism, subtask.index);
        for slices in &plan.keyed {
            for (group, range) in &slices.groups {
                prop_assert!(owned.contains(*group), "{} gets {}", subtask, group);
                prop_assert!(
                    range.start <= range.end && range.end <= slices.handle.size(),
                    "{} reads {:?} of {:?}",
                    subtask,
                    range,
                    slices.handle
                );
            }
        }
        for native in plan.native.iter().chain(&plan.imports) {
            let groups = native.key_groups;
            prop_assert!(
                groups.start <= groups.end && groups.end < op.max_parallelism,
                "{} opens {:?}",
                subtask,
                groups
            );
        }
        for channel in &plan.channels {
            let width: u32 = graph
                .edges
                .iter()
                .filter(|e| match channel.side {
                    ChannelSide::Input => e.to == op.id,
                    ChannelSide::Output => e.from == op.id,
                })
                .map(|e| match (e.partitioner, channel.side) {
                    (Partitioner::Forward, _) => 1,
                    (_, ChannelSide::Input) => graph.operator(e.from).parallelism,
                    (_, ChannelSide::Output) => graph.operator(e.to).parallelism,
                })
                .sum();
            prop_assert!(
                channel.channel < width,
                "{} replays {:?} channel {} of {}",
                subtask,
                channel.side,
                channel.channel,
                width
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// A valid checkpoint and its payload

fn subtask(operator: u32, index: u32) -> SubtaskId {
    SubtaskId {
        operator: OperatorId(operator),
        index: SubtaskIndex(index),
    }
}

/// A checkpoint of the job at parallelism 2 with a hash edge that uses
/// every kind of handle: key groups in an object, a native checkpoint with
/// shared and private files (a segment of a merged file), input and output
/// channel state, operator state, sink transactions and master state.
fn sample() -> CompletedCheckpoint {
    let job = Job::sampled();
    let graph = job.graph();
    let channel = |side, channel, handle| ChannelStateHandle {
        side,
        channel,
        batches: 1,
        handle,
    };
    let file = |name: &str, handle| NativeFileHandle {
        name: name.into(),
        handle,
        uploaded_by: CheckpointId(4),
        instance: 77,
    };
    let subtasks = BTreeMap::from([
        (
            subtask(0, 0),
            SubtaskState {
                operator: BTreeMap::from([("offset".to_owned(), vec![1, 2, 3])]),
                channels: vec![
                    channel(
                        ChannelSide::Output,
                        0,
                        StateHandle::object("chk-5/out-0-0", 10, 11),
                    ),
                    channel(
                        ChannelSide::Output,
                        1,
                        StateHandle::Segment {
                            path: "merged/file-1".into(),
                            offset: 0,
                            size: 5,
                            checksum: 12,
                        },
                    ),
                ],
                ..SubtaskState::default()
            },
        ),
        (
            subtask(0, 1),
            SubtaskState {
                operator: BTreeMap::from([(SOURCE_EXHAUSTED.to_owned(), Vec::new())]),
                ..SubtaskState::default()
            },
        ),
        (
            subtask(1, 0),
            SubtaskState {
                keyed: Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                    start_group: 0,
                    offsets: (0..64).map(|g| g * 3).collect(),
                    handle: StateHandle::object("chk-5/count-0", 192, 13),
                })),
                operator: BTreeMap::from([(SINK.to_owned(), vec![9])]),
                channels: vec![channel(
                    ChannelSide::Input,
                    1,
                    StateHandle::Inline(vec![1, 2]),
                )],
                timers: 3,
            },
        ),
        (
            subtask(1, 1),
            SubtaskState {
                keyed: Some(KeyedStateHandle::Native(NativeStateHandle {
                    key_groups: KeyGroupRange {
                        start: 64,
                        end: 127,
                    },
                    shared: vec![file(
                        "000008.sst",
                        StateHandle::object("shared/op-1-1/e0-000008.sst", 100, 14),
                    )],
                    private: vec![file(
                        "MANIFEST-000005",
                        StateHandle::Segment {
                            path: "merged/file-2".into(),
                            offset: 17,
                            size: 40,
                            checksum: 15,
                        },
                    )],
                })),
                operator: BTreeMap::from([(SINK.to_owned(), vec![8])]),
                ..SubtaskState::default()
            },
        ),
    ]);
    CompletedCheckpoint {
        id: CheckpointId(5),
        kind: CheckpointKind::Checkpoint,
        format: SnapshotFormat::JobDirectory,
        operators: graph.operators.clone(),
        edges: graph.edges.clone(),
        key_hash: tidemark_core::model::key_hash::KEY_HASH_VERSION,
        timestamp: 1_700_000_000_000,
        subtasks,
        master_states: BTreeMap::from([("hook".to_owned(), vec![4, 5])]),
    }
}

/// Bytes before the payload: magic (8), version (2) and CRC-32 (4).
const HEADER: usize = 14;

fn payload(checkpoint: &CompletedCheckpoint) -> Vec<u8> {
    rmp_serde::to_vec_named(checkpoint).expect("plain data")
}

/// `payload` as `_metadata`: the header of this build, with the payload's
/// CRC-32, and the payload.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = encode(&sample())[..HEADER - 4].to_vec();
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// `s` as a MessagePack string.
fn msgpack_str(s: &str) -> Vec<u8> {
    let len = s.len();
    let mut out = match len {
        0..32 => vec![0xa0 | len as u8],
        32..256 => vec![0xd9, len as u8],
        256..65536 => [&[0xda][..], &(len as u16).to_be_bytes()].concat(),
        _ => [&[0xdb][..], &(len as u32).to_be_bytes()].concat(),
    };
    out.extend_from_slice(s.as_bytes());
    out
}

/// `payload`, a map of fewer than 15 fields (a whole checkpoint), with one
/// more field, which no type has, holding `value`.
fn with_unknown_field(payload: &[u8], value: &[u8]) -> Vec<u8> {
    assert!((0x80..0x8f).contains(&payload[0]), "a small map");
    let mut out = vec![payload[0] + 1];
    out.extend_from_slice(&payload[1..]);
    out.extend(msgpack_str("unknown"));
    out.extend_from_slice(value);
    out
}

/// Where the value of the first field named `field` starts in `payload`.
fn value_of(payload: &[u8], field: &str) -> usize {
    let key = msgpack_str(field);
    let at = payload
        .windows(key.len())
        .position(|w| w == key)
        .unwrap_or_else(|| panic!("no field {field}"));
    at + key.len()
}

/// MessagePack tokens that make a decoder do too much: lengths of 4 G
/// elements or bytes (and of 64 K), integers at the ends of their range, a
/// NaN, the reserved byte.
const HOSTILE: &[&[u8]] = &[
    &[0xdd, 0xff, 0xff, 0xff, 0xff],                         // array 32
    &[0xdc, 0xff, 0xff],                                     // array 16
    &[0xdf, 0xff, 0xff, 0xff, 0xff],                         // map 32
    &[0xde, 0xff, 0xff],                                     // map 16
    &[0xdb, 0xff, 0xff, 0xff, 0xff],                         // str 32
    &[0xda, 0xff, 0xff],                                     // str 16
    &[0xd9, 0xff],                                           // str 8
    &[0xc6, 0xff, 0xff, 0xff, 0xff],                         // bin 32
    &[0xc5, 0xff, 0xff],                                     // bin 16
    &[0xc9, 0xff, 0xff, 0xff, 0xff, 0x01],                   // ext 32
    &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // u64::MAX
    &[0xce, 0xff, 0xff, 0xff, 0xff],                         // u32::MAX
    &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],                      // i64::MIN
    &[0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0],                   // NaN
    &[0xc0],                                                 // nil
    &[0xc1],                                                 // never used
    &[0xff],                                                 // -1
];

/// A hostile token, nesting, or a hostile path as a string.
fn hostile() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => select(HOSTILE).prop_map(<[u8]>::to_vec),
        1 => (1..3000usize).prop_map(|n| vec![0x91; n]),
        1 => (1..1500usize).prop_map(|n| [0x81, 0xa1, b'k'].repeat(n)),
        2 => path().prop_map(|p| msgpack_str(&p)),
    ]
}

/// One change to a payload.
#[derive(Clone, Debug)]
enum Mutation {
    /// Sets the byte at a position.
    Set(Index, u8),
    /// Cuts the payload at a position.
    Truncate(Index),
    /// Inserts bytes at a position.
    Insert(Index, Vec<u8>),
    /// Removes up to so many bytes from a position.
    Remove(Index, usize),
    /// Writes bytes over those at a position.
    Overwrite(Index, Vec<u8>),
    /// Copies up to so many bytes from one position over another.
    Copy(Index, Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<Index>;
    prop_oneof![
        4 => (at(), any::<u8>()).prop_map(|(at, b)| Mutation::Set(at, b)),
        1 => at().prop_map(Mutation::Truncate),
        2 => (at(), prop_oneof![vec(any::<u8>(), 1..8), hostile()])
            .prop_map(|(at, b)| Mutation::Insert(at, b)),
        1 => (at(), 1..16usize).prop_map(|(at, n)| Mutation::Remove(at, n)),
        3 => (at(), hostile()).prop_map(|(at, b)| Mutation::Overwrite(at, b)),
        1 => (at(), at(), 1..64usize).prop_map(|(from, to, n)| Mutation::Copy(from, to, n)),
    ]
}

impl Mutation {
    fn apply(&self, bytes: &mut Vec<u8>) {
        let len = bytes.len();
        // A position in the bytes, or at their end.
        let at = |i: &Index| i.index(len + 1);
        match self {
            Mutation::Set(i, b) if len > 0 => bytes[i.index(len)] = *b,
            Mutation::Set(..) => {}
            Mutation::Truncate(i) => bytes.truncate(at(i)),
            Mutation::Insert(i, b) => {
                let at = at(i);
                bytes.splice(at..at, b.iter().copied());
            }
            Mutation::Remove(i, n) => {
                let at = at(i);
                bytes.drain(at..(at + n).min(len));
            }
            Mutation::Overwrite(i, b) => {
                let at = at(i);
                bytes.splice(at..(at + b.len()).min(len), b.iter().copied());
            }
            Mutation::Copy(from, to, n) => {
                let (from, to) = (at(from), at(to));
                let copied = bytes[from..(from + n).min(len)].to_vec();
                bytes.splice(to..(to + copied.len()).min(len), copied);
            }
        }
    }
}

/// Decodes `bytes` as a restore does: refused with a typed error, or a
/// checkpoint that re-encodes to itself and passes [`check_restore`]; no
/// allocation out of proportion either way.
fn check_decode(bytes: &[u8], job: &Job) -> Result<Option<MetadataError>, TestCaseError> {
    let (decoded, largest) = largest_allocation(|| decode(bytes));
    prop_assert!(
        largest <= allocation_bound(bytes.len()),
        "decoding {} bytes allocated {} bytes at once",
        bytes.len(),
        largest
    );
    match decoded {
        Err(e) => Ok(Some(e)),
        Ok(checkpoint) => {
            prop_assert_eq!(decode(&encode(&checkpoint)), Ok(checkpoint.clone()));
            check_restore(&checkpoint, job)?;
            Ok(None)
        }
    }
}

// ---------------------------------------------------------------------------
// Arbitrary checkpoints

fn u64_edge() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..400u64,
        1 => Just(u64::MAX),
        1 => (u64::MAX - 400)..=u64::MAX,
        1 => any::<u64>(),
    ]
}

fn u32_edge() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0..140u32,
        1 => Just(u32::MAX),
        1 => (u32::MAX - 140)..=u32::MAX,
        1 => any::<u32>(),
    ]
}

/// Subtask and channel indices: small, about the default max parallelism,
/// or the largest.
fn index() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0..4u32,
        1 => 126..=130u32,
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ]
}

/// Mostly `usual`, sometimes `odd`.
fn mostly<T: std::fmt::Debug>(
    usual: impl Strategy<Value = T> + 'static,
    odd: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    prop_oneof![12 => usual, 1 => odd].boxed()
}

/// One segment of a path: a plain name, or one that leaves or confuses a
/// directory.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z0-9._-]{1,12}",
        3 => select(vec![
            "..", ".", "", "...", "..a", "a..", "a\\b", "\\", "s3:", "x://y", "c:", "%2E%2E",
            "%2F", "~", "\0", "é", " ", "*",
        ])
        .prop_map(str::to_owned),
        1 => "\\PC{0,8}",
        1 => (1..400usize).prop_map(|n| "a".repeat(n)),
    ]
}

/// A path as a handle might record it: segments, maybe from the root, any
/// string, or a very deep one.
fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (any::<bool>(), vec(segment(), 1..5)).prop_map(|(absolute, parts)| {
            let path = parts.join("/");
            if absolute {
                format!("/{path}")
            } else {
                path
            }
        }),
        1 => any::<String>(),
        1 => (1..3000usize).prop_map(|n| "d/".repeat(n) + "f"),
    ]
}

/// A path as a snapshot writes it, or sometimes any [`path`].
fn stored_path() -> BoxedStrategy<String> {
    mostly(
        "(chk-[0-9]{1,3}|shared/op-1-[0-3]|merged)/[a-z0-9.-]{1,12}",
        path(),
    )
}

fn handle_at(path: BoxedStrategy<String>) -> impl Strategy<Value = StateHandle> {
    prop_oneof![
        1 => vec(any::<u8>(), 0..16).prop_map(StateHandle::Inline),
        2 => (path.clone(), u64_edge(), any::<u32>())
            .prop_map(|(path, size, checksum)| StateHandle::Object { path, size, checksum }),
        2 => (path, u64_edge(), u64_edge(), any::<u32>()).prop_map(
            |(path, offset, size, checksum)| StateHandle::Segment {
                path,
                offset,
                size,
                checksum,
            }
        ),
    ]
}

/// A handle with any path, offset and size.
fn handle() -> impl Strategy<Value = StateHandle> {
    handle_at(path().boxed())
}

/// `handle` holding `size` bytes.
fn sized(handle: StateHandle, size: u64) -> StateHandle {
    match handle {
        StateHandle::Inline(_) => StateHandle::Inline(vec![0; size as usize]),
        StateHandle::Object { path, checksum, .. } => StateHandle::Object {
            path,
            size,
            checksum,
        },
        StateHandle::Segment {
            path,
            offset,
            checksum,
            ..
        } => StateHandle::Segment {
            path,
            offset,
            size,
            checksum,
        },
    }
}

fn offsets() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        vec(u64_edge(), 0..8),
        vec(u64_edge(), 0..8).prop_map(|mut o| {
            o.sort_unstable();
            o
        }),
        vec(u64_edge(), 0..8).prop_map(|mut o| {
            o.sort_unstable_by(|a, b| b.cmp(a));
            o
        }),
    ]
}

fn native_file() -> impl Strategy<Value = NativeFileHandle> {
    (
        "[A-Z0-9.-]{0,12}",
        handle_at(stored_path()),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(name, handle, uploaded_by, instance)| NativeFileHandle {
            name,
            handle,
            uploaded_by: CheckpointId(uploaded_by),
            instance,
        })
}

/// Keyed state of subtask `index` of `parallelism`: as a snapshot writes
/// it (key groups back to back, or a native checkpoint of the key groups
/// it owns), or with any start, offsets and key groups.
fn keyed(
    max_parallelism: u32,
    parallelism: u32,
    index: u32,
) -> impl Strategy<Value = Option<KeyedStateHandle>> {
    let owned = KeyGroupRange::for_subtask(max_parallelism, parallelism, SubtaskIndex(index));
    let groups = mostly(
        Just(owned),
        (u32_edge(), u32_edge()).prop_map(|(start, end)| KeyGroupRange { start, end }),
    );
    let native = (groups, vec(native_file(), 0..3), vec(native_file(), 0..3)).prop_map(
        |(key_groups, shared, private)| {
            Some(KeyedStateHandle::Native(NativeStateHandle {
                key_groups,
                shared,
                private,
            }))
        },
    );
    let written = (1..20u64, handle_at(stored_path())).prop_map(move |(step, handle)| {
        Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
            start_group: owned.start,
            offsets: (0..owned.len() as u64).map(|g| g * step).collect(),
            handle: sized(handle, owned.len() as u64 * step),
        }))
    });
    let odd = (u32_edge(), offsets(), handle_at(stored_path())).prop_map(
        |(start_group, offsets, handle)| {
            Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                start_group,
                offsets,
                handle,
            }))
        },
    );
    prop_oneof![
        3 => Just(None),
        8 => written,
        3 => native,
        1 => odd,
    ]
}

/// Operator state: entries a restore interprets (source positions and
/// watermarks, sink transactions) and others. Source positions anywhere,
/// near `u64::MAX` too: a rescale redistributes them, jumping the gaps
/// between the old subtasks' positions.
fn operator_state() -> impl Strategy<Value = BTreeMap<String, Vec<u8>>> {
    let entry = prop_oneof![
        (
            select(vec![SOURCE_POSITION, SOURCE_WATERMARK]),
            vec(any::<u8>(), 0..5)
        ),
        (
            Just(SOURCE_POSITION),
            prop_oneof![0..1000u64, (u64::MAX - 400)..=u64::MAX, any::<u64>()].prop_map(|next| {
                rmp_serde::to_vec(&tidemark_core::model::split::SplitPosition {
                    next,
                    read_before: Vec::new(),
                })
                .expect("plain data")
            })
        ),
        (
            select(vec![SINK, "sink-1", SOURCE_EXHAUSTED, "offset"]),
            vec(any::<u8>(), 0..4)
        ),
    ];
    vec(entry, 0..3).prop_map(|entries| {
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    })
}

/// Channel state of `side`, whose channels were `0..width`, or of any side
/// and channel.
fn channel_state(side: ChannelSide, width: u32) -> impl Strategy<Value = ChannelStateHandle> {
    (
        mostly(
            Just(side),
            select(vec![ChannelSide::Input, ChannelSide::Output]),
        ),
        mostly(0..width, index()),
        0..4u32,
        handle_at(stored_path()),
    )
        .prop_map(|(side, channel, batches, handle)| ChannelStateHandle {
            side,
            channel,
            batches,
            handle,
        })
}

fn subtask_state(
    max_parallelism: u32,
    parallelism: u32,
    index: u32,
    side: ChannelSide,
    width: u32,
) -> BoxedStrategy<SubtaskState> {
    (
        keyed(max_parallelism, parallelism, index),
        operator_state(),
        prop_oneof![2 => Just(Vec::new()), 1 => vec(channel_state(side, width), 1..3)],
        any::<u64>(),
    )
        .prop_map(|(keyed, operator, channels, timers)| SubtaskState {
            keyed,
            operator,
            channels,
            timers,
        })
        .boxed()
}

/// The operators of `job` as a checkpoint at `parallelism` records them:
/// none (an old checkpoint), or with another parallelism, max parallelism,
/// uid or id, missing or repeated.
fn operators(job: &Job, parallelism: [u32; 2]) -> impl Strategy<Value = Vec<OperatorSpec>> {
    let max = job.max_parallelism;
    let spec = move |id: u32, name: &'static str| {
        (
            mostly(Just(parallelism[id as usize]), u32_edge()),
            mostly(Just(max), u32_edge()),
            mostly(Just(format!("{name}-{id}")), "[a-z-]{0,8}"),
            mostly(Just(id), u32_edge()),
        )
            .prop_map(
                move |(parallelism, max_parallelism, uid, id)| OperatorSpec {
                    id: OperatorId(id),
                    name: name.into(),
                    uid,
                    parallelism,
                    max_parallelism,
                },
            )
    };
    prop_oneof![
        1 => Just(Vec::new()),
        6 => (spec(0, "source"), spec(1, "count")).prop_map(|(a, b)| vec![a, b]),
        1 => (spec(0, "source"), spec(1, "count"), any::<bool>()).prop_map(|(a, b, missing)| {
            if missing {
                vec![b]
            } else {
                vec![a.clone(), b, a]
            }
        }),
    ]
}

/// The edges of `job` as a checkpoint records them: none (an old
/// checkpoint), the job's, another partitioner's or any.
fn edges(job: &Job) -> impl Strategy<Value = Vec<Edge>> {
    let edge = |from, to, partitioner, input| Edge {
        from: OperatorId(from),
        to: OperatorId(to),
        partitioner,
        input,
    };
    let any_edge = (index(), index(), partitioner(), any::<u8>())
        .prop_map(move |(f, t, p, i)| edge(f, t, p, i));
    prop_oneof![
        1 => Just(Vec::new()),
        6 => Just(vec![edge(0, 1, job.partitioner, 0)]),
        1 => partitioner().prop_map(move |p| vec![edge(0, 1, p, 0)]),
        1 => vec(any_edge, 0..3),
    ]
}

/// A checkpoint `job` may restore: taken at its parallelism or at another
/// one up to 3, with hostile values here and there, and sometimes state of
/// subtasks the job never had.
fn checkpoint(job: &Job) -> impl Strategy<Value = CompletedCheckpoint> {
    let job = job.clone();
    let graph = job.graph();
    let now = |op: usize| graph.operators[op].parallelism;
    let forward = job.partitioner == Partitioner::Forward;
    (
        prop_oneof![Just(now(0)), 1..=3u32],
        prop_oneof![Just(now(1)), 1..=3u32],
    )
        .prop_flat_map(move |(source, count)| {
            let parallelism = [source, if forward { source } else { count }];
            let width = |op: usize| if forward { 1 } else { parallelism[1 - op] };
            let max = job.max_parallelism;
            let states: Vec<_> = [ChannelSide::Output, ChannelSide::Input]
                .into_iter()
                .enumerate()
                .flat_map(|(op, side)| {
                    (0..parallelism[op]).map(move |i| {
                        subtask_state(max, parallelism[op], i, side, width(op))
                            .prop_map(move |s| (subtask(op as u32, i), s))
                    })
                })
                .collect();
            let stranger = (
                prop_oneof![0..3u32, u32_edge()],
                index(),
                subtask_state(max, 1, 0, ChannelSide::Input, 1),
            )
                .prop_map(|(op, i, s)| (subtask(op, i), s));
            let strangers = prop_oneof![6 => Just(Vec::new()), 1 => vec(stranger, 1..3)];
            (
                states,
                strangers,
                operators(&job, parallelism),
                edges(&job),
                mostly(
                    Just(tidemark_core::model::key_hash::KEY_HASH_VERSION),
                    any::<u32>(),
                ),
                select(vec![
                    SnapshotFormat::JobDirectory,
                    SnapshotFormat::SelfContained,
                ]),
                select(vec![CheckpointKind::Checkpoint, CheckpointKind::Savepoint]),
                any::<u64>(),
                btree_map("[a-z]{0,4}", vec(any::<u8>(), 0..4), 0..2),
            )
        })
        .prop_map(
            |(states, strangers, operators, edges, key_hash, format, kind, id, master_states)| {
                CompletedCheckpoint {
                    id: CheckpointId(id),
                    kind,
                    format,
                    operators,
                    edges,
                    key_hash,
                    timestamp: id,
                    subtasks: states.into_iter().chain(strangers).collect(),
                    master_states,
                }
            },
        )
}

/// A job and a checkpoint it may restore.
fn job_and_checkpoint() -> impl Strategy<Value = (Job, CompletedCheckpoint)> {
    job().prop_flat_map(|job| (Just(job.clone()), checkpoint(&job)))
}

// ---------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A valid payload changed in up to four places, its checksum
    /// recomputed: only the decoder stands between it and a restore.
    #[test]
    fn mutated_payloads_are_refused_or_restore_safely(
        mutations in vec(mutation(), 1..5),
        job in job(),
    ) {
        let mut payload = payload(&sample());
        for m in &mutations {
            m.apply(&mut payload);
        }
        if let Some(e) = check_decode(&frame(&payload), &job)? {
            prop_assert!(matches!(e, MetadataError::Decode(_)), "{}", e);
        }
    }

    /// A checkpoint with arbitrary paths, offsets, sizes, key groups,
    /// operators, edges and subtasks: what a CRC-valid `_metadata` can say.
    #[test]
    fn arbitrary_checkpoints_are_refused_or_restore_safely(
        (job, checkpoint) in job_and_checkpoint(),
    ) {
        let bytes = encode(&checkpoint);
        prop_assert_eq!(check_decode(&bytes, &job)?, None);
        prop_assert_eq!(decode(&bytes), Ok(checkpoint));
    }

    /// A handle of any offset and size cuts any object without panicking,
    /// and one that fits the object cuts exactly its bytes.
    #[test]
    fn handles_cut_any_object_without_overflow(
        handle in handle(),
        object in vec(any::<u8>(), 0..64),
        start in any::<Index>(),
        end in any::<Index>(),
    ) {
        check_handle(&handle, &object)?;
        let (start, end) = {
            let (a, b) = (start.index(object.len() + 1), end.index(object.len() + 1));
            (a.min(b), a.max(b))
        };
        let bytes = &object[start..end];
        let fits = StateHandle::Segment {
            path: "merged/file".into(),
            offset: start as u64,
            size: bytes.len() as u64,
            checksum: checksum(bytes),
        };
        let object = Bytes::copy_from_slice(&object);
        prop_assert_eq!(fits.range(), start as u64..end as u64);
        prop_assert_eq!(fits.from_object(object.clone()), Ok(object.slice(start..end)));
        let read = object.slice(start..end);
        prop_assert_eq!(fits.from_range(read.clone()), Ok(read));
        let whole = StateHandle::object("file", object.len() as u64, checksum(&object));
        prop_assert_eq!(whole.from_object(object.clone()), Ok(object.clone()));
        check_handle(&fits, &object)?;
        check_handle(&whole, &object)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A valid file damaged without recomputing its checksum: one changed
    /// byte anywhere is refused (CRC-32 catches every burst of up to 32
    /// bits); anything else is refused or restores safely.
    #[test]
    fn damaged_files_are_refused(mutations in vec(mutation(), 1..4), job in job()) {
        let good = encode(&sample());
        let mut bytes = good.clone();
        for m in &mutations {
            m.apply(&mut bytes);
        }
        let changed = bytes.len() == good.len()
            && bytes.iter().zip(&good).filter(|(a, b)| a != b).count() == 1;
        let refused = check_decode(&bytes, &job)?;
        prop_assert!(refused.is_some() || !changed, "one changed byte was accepted");
    }

    /// A field no version wrote, holding anything: ignored if it is a whole
    /// value the decoder can skip, else refused.
    #[test]
    fn unknown_fields_are_skipped_or_refused(
        value in hostile(),
        nil in any::<bool>(),
        job in job(),
    ) {
        let mut value = value;
        if nil {
            value.push(0xc0);
        }
        let bytes = frame(&with_unknown_field(&payload(&sample()), &value));
        check_decode(&bytes, &job)?;
    }
}

/// The measure sees allocations, so the bound it checks means something.
#[test]
fn the_allocation_measure_sees_large_allocations() {
    let (v, largest) = largest_allocation(|| vec![0u8; 5 << 20]);
    assert_eq!(v.len(), 5 << 20);
    assert!(largest >= 5 << 20 && largest > allocation_bound(1000));
    let (_, after) = largest_allocation(|| ());
    assert_eq!(after, 0, "each measure starts afresh");
}

#[test]
fn the_test_frame_is_the_format() {
    let c = sample();
    assert_eq!(frame(&payload(&c)), encode(&c));
    assert_eq!(decode(&frame(&payload(&c))), Ok(c.clone()));
    let at = value_of(&payload(&c), "operators");
    assert_eq!(payload(&c)[at], 0x92, "a fixarray of the two operators");
    let job = Job::sampled();
    let plans = restore::plan(&c, &job.graph(), false).expect("the sample restores");
    check_plans(&plans, &job.graph()).unwrap();
}

/// A length prefix of 4 G elements (or bytes) where the sample has a short
/// one is refused after allocating at most what serde preallocates.
#[test]
fn huge_length_prefixes_are_refused_without_allocating_them() {
    let payload = payload(&sample());
    for (field, header) in [
        ("operators", &[0xdd, 0xff, 0xff, 0xff, 0xff][..]),
        ("subtasks", &[0xdf, 0xff, 0xff, 0xff, 0xff]),
        ("offsets", &[0xdd, 0xff, 0xff, 0xff, 0xff]),
        ("master_states", &[0xdf, 0xff, 0xff, 0xff, 0xff]),
        ("hook", &[0xc6, 0xff, 0xff, 0xff, 0xff]),
        ("uid", &[0xdb, 0xff, 0xff, 0xff, 0xff]),
        ("path", &[0xdb, 0xff, 0xff, 0xff, 0xff]),
    ] {
        let at = value_of(&payload, field);
        let mut huge = payload.clone();
        // The header of the field's value is one byte (fixarray, fixmap,
        // fixstr) or two (bin 8).
        let old = if payload[at] == 0xc4 { 2 } else { 1 };
        huge.splice(at..at + old, header.iter().copied());
        let bytes = frame(&huge);
        let (decoded, largest) = largest_allocation(|| decode(&bytes));
        assert!(
            matches!(decoded, Err(MetadataError::Decode(_))),
            "{field}: {decoded:?}"
        );
        assert!(
            largest <= allocation_bound(bytes.len()),
            "{field}: {largest} bytes"
        );
    }
}

/// Nesting the decoder can skip is skipped; deeper nesting is refused
/// (rmp-serde's depth limit), without overflowing the stack.
#[test]
fn deep_nesting_is_skipped_or_refused() {
    let payload = payload(&sample());
    for (depth, ok) in [(500, true), (1000, true), (2000, false), (100_000, false)] {
        let mut value = vec![0x91; depth];
        value.push(0xc0);
        let decoded = decode(&frame(&with_unknown_field(&payload, &value)));
        assert_eq!(decoded.is_ok(), ok, "{depth}: {decoded:?}");
    }
}

/// On a local directory with files planted outside the job directory,
/// handles of any path, offset and size read nothing: a path that stays inside
/// finds no object there (the job directory is empty), one that does not is
/// refused before any IO.
#[test]
fn no_handle_reads_outside_the_job_directory() {
    let root = tempfile::tempdir().unwrap();
    let checkpoints = root.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    for planted in [root.path().join("secret"), checkpoints.join("secret")] {
        std::fs::write(planted, b"secret").unwrap();
    }
    let storage = CheckpointStorage::open(checkpoints.to_str().unwrap(), JOB).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 128,
        source_file: Some(file!()),
        ..Config::default()
    });
    let handles = vec(handle(), 1..8).prop_map(|handles| {
        // Segments of an existing file too, at any offset.
        handles
            .into_iter()
            .chain([StateHandle::Segment {
                path: "../secret".into(),
                offset: 0,
                size: 6,
                checksum: checksum(b"secret"),
            }])
            .collect::<Vec<_>>()
    });
    runner
        .run(&handles, |handles| {
            for handle in &handles {
                let Some(path) = handle.physical() else {
                    continue;
                };
                match runtime.block_on(storage.read_handle(handle)) {
                    Ok(bytes) => prop_assert!(false, "{:?} read {:?}", handle, bytes),
                    Err(ReadError::Mismatch(e)) => prop_assert!(false, "{:?} read: {}", handle, e),
                    Err(ReadError::Storage(StorageError::EscapingPath(_))) => {
                        prop_assert!(!stays_inside(path), "{:?} refused", path)
                    }
                    Err(ReadError::Storage(e)) => {
                        prop_assert!(stays_inside(path), "{:?}: {}", path, e)
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

/// Found by the fuzzing: key groups counted from a start group near
/// `u32::MAX` overflowed in the restore plan.
#[test]
fn key_groups_past_the_last_one_are_malformed() {
    let mut c = sample();
    let Some(KeyedStateHandle::KeyGroups(keyed)) =
        &mut c.subtasks.get_mut(&subtask(1, 0)).unwrap().keyed
    else {
        unreachable!("the sample's count 0 has key groups")
    };
    keyed.start_group = u32::MAX;
    let job = Job::sampled();
    let error = restore::plan(&c, &job.graph(), false).unwrap_err();
    assert!(
        error.to_string().contains("past the last key group"),
        "{error}"
    );
}
