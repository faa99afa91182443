//! File merging, sans IO: where the state objects of one subtask's snapshot
//! go (FLINK-11937, FLIP-306). Objects below the inline threshold travel in
//! the ack and `_metadata`; the others become segments of physical files
//! `merged/op-<op>-<idx>/chk-<id>-<token>-<seq>`, filled in order and rolled
//! over at the size limit. A handle is then (physical file, offset, length).
//!
//! A physical file belongs to one subtask, one checkpoint and one writer
//! (the token), so concurrent checkpoints, and two attempts that ever wrote
//! the same checkpoint id, never write the same file (seed 002 §2.1).
//!
//! Object stores cannot append, so a file cannot grow as segments arrive.
//! The two ways out are one multipart upload per physical file kept open
//! while the snapshot produces segments, or files whose layout is fixed
//! before the upload. We take the second: the snapshot knows the size of
//! every object once its synchronous part is done (SSTs are immutable, heap
//! and channel state are serialized first), so the plan fixes every offset
//! up front and the shell writes each physical file in one go, its segments
//! in order — one put, or for a large file one multipart upload of the same
//! bytes. That way a file becomes visible only whole (a reader never meets a
//! half-written one, and a failed upload leaves no object, or an incomplete
//! multipart upload that the store's abort discards, not a truncated file),
//! the handles are known before any byte is sent, the shell needs no state
//! across objects, and rolling at the size limit bounds what one failed
//! upload costs and what one compaction rewrites. A multipart upload left
//! open across objects would instead tie the file's fate to every later
//! object and to S3's 5 MiB minimum part size, which small SSTs do not
//! reach.

use super::StateHandle;
use crate::model::ids::{CheckpointId, SubtaskId};

/// How a snapshot's objects are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergingConfig {
    /// Objects smaller than this travel inline; with 0 only empty ones do.
    pub inline_threshold: u64,
    /// A physical file is rolled over before a segment would take it past
    /// this; an object larger than this gets a file of its own.
    pub max_file_size: u64,
}

impl Default for MergingConfig {
    fn default() -> Self {
        MergingConfig {
            inline_threshold: 20 * 1024,
            max_file_size: 32 * 1024 * 1024,
        }
    }
}

impl MergingConfig {
    /// An empty object always travels inline: it costs nothing there, and
    /// an empty range read is an error on some stores.
    pub fn inlines(&self, size: u64) -> bool {
        size == 0 || size < self.inline_threshold
    }

    /// Places objects of `sizes` (in the order the snapshot writes them)
    /// for `subtask`'s snapshot of `checkpoint`. `token` tells writers of
    /// the same checkpoint id apart: the shell draws one per snapshot.
    pub fn plan(
        &self,
        subtask: SubtaskId,
        checkpoint: CheckpointId,
        token: u64,
        sizes: &[u64],
    ) -> MergePlan {
        let mut files: Vec<PhysicalFile> = Vec::new();
        let mut placements = Vec::with_capacity(sizes.len());
        for (index, &size) in sizes.iter().enumerate() {
            if self.inlines(size) {
                placements.push(Placement::Inline);
                continue;
            }
            let fits = files
                .last()
                .is_some_and(|f| f.size + size <= self.max_file_size);
            if !fits {
                files.push(PhysicalFile {
                    path: format!(
                        "merged/op-{}-{}/{checkpoint}-{token:016x}-{}",
                        subtask.operator.0,
                        subtask.index.0,
                        files.len()
                    ),
                    size: 0,
                    objects: Vec::new(),
                });
            }
            let at = files.len() - 1;
            let file = &mut files[at];
            placements.push(Placement::Segment {
                file: at,
                offset: file.size,
            });
            file.size += size;
            file.objects.push(index);
        }
        MergePlan {
            files,
            placements,
            sizes: sizes.to_vec(),
        }
    }
}

/// How a job's snapshots store their state objects.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StateLayout {
    /// Objects smaller than this travel inline; with 0 only empty ones do.
    pub inline_threshold: u64,
    /// With file merging, the size at which a physical file is rolled over;
    /// without (`None`), every object not inlined is an object of its own.
    pub max_merged_file_size: Option<u64>,
    /// A merged file wasting more than this (total / live bytes) is
    /// compacted.
    pub max_space_amplification: f64,
    /// Which physical files are multipart uploads, in which parts.
    pub upload: UploadLimits,
}

impl Default for StateLayout {
    fn default() -> Self {
        StateLayout {
            inline_threshold: MergingConfig::default().inline_threshold,
            max_merged_file_size: None,
            max_space_amplification: super::shared::DEFAULT_MAX_SPACE_AMPLIFICATION,
            upload: Default::default(),
        }
    }
}

impl StateLayout {
    /// The size above which an object is a physical file of its own
    /// whatever else its snapshot holds: its writing may start before its
    /// size is known.
    pub fn alone_above(&self) -> u64 {
        self.max_merged_file_size
            .unwrap_or(0)
            .max(self.inline_threshold)
    }

    /// Places the objects of one snapshot, each given as the path it has as
    /// an object of its own and its size, in the order the snapshot writes
    /// them: inline, merged (see [`MergingConfig::plan`]) or as they are.
    pub fn plan(
        &self,
        subtask: SubtaskId,
        checkpoint: CheckpointId,
        token: u64,
        objects: &[(String, u64)],
    ) -> MergePlan {
        let sizes: Vec<u64> = objects.iter().map(|(_, size)| *size).collect();
        let options = MergingConfig {
            inline_threshold: self.inline_threshold,
            max_file_size: self.max_merged_file_size.unwrap_or(u64::MAX),
        };
        if self.max_merged_file_size.is_some() {
            return options.plan(subtask, checkpoint, token, &sizes);
        }
        let mut files = Vec::new();
        let placements = objects
            .iter()
            .enumerate()
            .map(|(index, (path, size))| {
                if options.inlines(*size) {
                    return Placement::Inline;
                }
                files.push(PhysicalFile {
                    path: path.clone(),
                    size: *size,
                    objects: vec![index],
                });
                Placement::Segment {
                    file: files.len() - 1,
                    offset: 0,
                }
            })
            .collect();
        MergePlan {
            files,
            placements,
            sizes,
        }
    }
}

/// One physical file to write: the objects at `objects` (indices into the
/// planned sizes) back to back, in that order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhysicalFile {
    /// Path relative to the job directory.
    pub path: String,
    /// Sum of the sizes of its objects.
    pub size: u64,
    /// Indices of its objects, in file order.
    pub objects: Vec<usize>,
}

/// Where one object of a snapshot goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the ack and `_metadata`, no file.
    Inline,
    /// Into a physical file of the plan.
    Segment {
        /// Index into [`MergePlan::files`].
        file: usize,
        /// Byte offset in that file.
        offset: u64,
    },
}

/// Where every object of one snapshot goes, fixed before any byte is
/// written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergePlan {
    /// The physical files to write, each in one go.
    pub files: Vec<PhysicalFile>,
    /// Per planned object, in order.
    pub placements: Vec<Placement>,
    sizes: Vec<u64>,
}

impl MergePlan {
    /// The planned size of object `index`.
    pub fn size(&self, index: usize) -> u64 {
        self.sizes[index]
    }

    /// The handle of object `index`, whose bytes have CRC-32 `checksum`,
    /// once its file is written: an object of its own if the file holds
    /// nothing else; `None` for an object that travels inline (its handle
    /// is `StateHandle::Inline`).
    pub fn handle(&self, index: usize, checksum: u32) -> Option<StateHandle> {
        match self.placements[index] {
            Placement::Inline => None,
            Placement::Segment { file, .. } if self.files[file].objects.len() == 1 => Some(
                StateHandle::object(self.files[file].path.clone(), self.sizes[index], checksum),
            ),
            Placement::Segment { file, offset } => Some(StateHandle::Segment {
                path: self.files[file].path.clone(),
                offset,
                size: self.sizes[index],
                checksum,
            }),
        }
    }
}

/// When an object is written as a multipart upload, and in which parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UploadLimits {
    /// Objects larger than this are multipart uploads.
    pub multipart_threshold: u64,
    /// Size of every part but the last. S3 wants at least 5 MiB.
    pub part_size: usize,
    /// Parts of one upload in flight at once.
    pub parts_in_flight: usize,
}

impl Default for UploadLimits {
    fn default() -> Self {
        UploadLimits {
            multipart_threshold: 16 << 20,
            part_size: 8 << 20,
            parts_in_flight: 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::HandleMismatch;
    use crate::model::ids::{OperatorId, SubtaskIndex};

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;

    fn subtask() -> SubtaskId {
        SubtaskId {
            operator: OperatorId(2),
            index: SubtaskIndex(1),
        }
    }

    #[test]
    fn small_objects_go_inline_and_the_rest_fill_files_in_order_up_to_the_limit() {
        let options = MergingConfig::default();
        let sizes = [5 * KIB, 10 * MIB, 20 * KIB, 20 * MIB, 3 * MIB, 40 * MIB, 1];
        let plan = options.plan(subtask(), CheckpointId(7), 0xab, &sizes);
        let paths: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "merged/op-2-1/chk-7-00000000000000ab-0",
                "merged/op-2-1/chk-7-00000000000000ab-1",
                "merged/op-2-1/chk-7-00000000000000ab-2",
            ]
        );
        // 10 MiB + 20 KiB + 20 MiB fit in 32 MiB; 3 MiB more would not.
        assert_eq!(plan.files[0].objects, [1, 2, 3]);
        assert_eq!(plan.files[0].size, 30 * MIB + 20 * KIB);
        assert_eq!(plan.files[1].objects, [4]);
        assert_eq!(plan.files[2].objects, [5], "too large for any file: alone");
        assert_eq!(plan.handle(0, 0), None, "below 20 KiB: inline");
        assert_eq!(plan.handle(6, 0), None);
        assert_eq!(
            plan.handle(2, 7),
            Some(StateHandle::Segment {
                path: paths[0].into(),
                offset: 10 * MIB,
                size: 20 * KIB,
                checksum: 7,
            }),
            "exactly at the threshold: a segment"
        );
        assert_eq!(
            plan.handle(3, 0).unwrap().range(),
            10 * MIB + 20 * KIB..30 * MIB + 20 * KIB
        );
    }

    #[test]
    fn without_merging_objects_keep_their_paths_and_small_ones_still_go_inline() {
        let layout = StateLayout::default();
        let objects = [
            ("chk-3/op-2-1-keyed".to_owned(), 64 * KIB),
            ("chk-3/op-2-1-CURRENT".to_owned(), 16),
            ("shared/op-2-1/chk-3-000009.sst".to_owned(), 5 * MIB),
        ];
        let plan = layout.plan(subtask(), CheckpointId(3), 0xab, &objects);
        assert_eq!(
            plan.handle(0, 0),
            Some(StateHandle::object(&objects[0].0, 64 * KIB, 0))
        );
        assert_eq!(plan.handle(1, 0), None);
        assert_eq!(
            plan.handle(2, 0),
            Some(StateHandle::object(&objects[2].0, 5 * MIB, 0))
        );
        assert_eq!(plan.files.len(), 2);

        let merged = StateLayout {
            max_merged_file_size: Some(32 * MIB),
            ..layout
        }
        .plan(subtask(), CheckpointId(3), 0xab, &objects);
        assert_eq!(merged.files.len(), 1);
        assert_eq!(merged.files[0].objects, [0, 2]);

        let nothing_inline = StateLayout {
            inline_threshold: 0,
            ..layout
        };
        let empty = [("chk-3/op-2-1-LOG".to_owned(), 0), objects[1].clone()];
        let plan = nothing_inline.plan(subtask(), CheckpointId(3), 0xab, &empty);
        assert_eq!(plan.handle(0, 0), None, "an empty object is always inline");
        assert!(plan.handle(1, 0).is_some());
    }

    #[test]
    fn concurrent_checkpoints_and_writers_never_share_a_file() {
        let options = MergingConfig {
            inline_threshold: 0,
            max_file_size: 10,
        };
        let path = |checkpoint, token| {
            options
                .plan(subtask(), CheckpointId(checkpoint), token, &[4])
                .files[0]
                .path
                .clone()
        };
        assert_ne!(path(3, 1), path(4, 1));
        assert_ne!(path(3, 1), path(3, 2));
        let other = SubtaskId {
            index: SubtaskIndex(0),
            ..subtask()
        };
        assert_ne!(
            path(3, 1),
            options.plan(other, CheckpointId(3), 1, &[4]).files[0].path
        );
    }

    #[test]
    fn a_segment_reads_back_out_of_a_range_read_or_the_whole_file_only_if_intact() {
        let plan = MergingConfig {
            inline_threshold: 0,
            max_file_size: 100,
        }
        .plan(subtask(), CheckpointId(1), 0, &[3, 4]);
        let file = bytes::Bytes::from_static(b"abcdefg");
        let second = plan
            .handle(1, crate::checkpoint::checksum(b"defg"))
            .unwrap();
        assert_eq!(second.from_object(file.clone()).unwrap(), "defg");
        let range = second.range();
        let read = file.slice(range.start as usize..range.end as usize);
        assert_eq!(second.from_range(read).unwrap(), "defg");
        assert!(second.from_object(file.slice(..5)).is_err(), "truncated");
        assert!(matches!(
            second.from_range(file.slice(3..5)),
            Err(HandleMismatch::Length { found: 2, .. })
        ));
        let err = second
            .from_object(bytes::Bytes::from_static(b"abcdeFg"))
            .unwrap_err();
        assert!(matches!(err, HandleMismatch::Checksum { .. }), "{err}");
        assert!(err.to_string().contains(&plan.files[0].path), "{err}");
    }
}
