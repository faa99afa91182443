//! Writing one object from pieces, so that a large state object never has
//! to be whole in memory and its writing can start before its size is
//! known: pieces are held for one put (a `PutPayload` holds them without
//! joining them) until they pass a threshold, and from there go out as a
//! multipart upload of fixed-size parts, a bounded number in flight. Either
//! way the object appears only once it is complete: a multipart upload that
//! fails or is abandoned is aborted, never completed.

use crate::{CheckpointStorage, StorageError};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStoreExt, PutPayload};
use std::sync::atomic::Ordering;
use tidemark_core::checkpoint::merging::UploadLimits;
use tokio::task::JoinSet;

/// An object being written, piece by piece. Nothing is visible under its
/// name before [`ObjectWriter::finish`] succeeds; one dropped unfinished
/// aborts its multipart upload.
pub struct ObjectWriter<'a> {
    storage: &'a CheckpointStorage,
    path: Path,
    limits: UploadLimits,
    written: u64,
    target: Target,
}

enum Target {
    /// Pieces of one put, while they are no more than the threshold.
    Put(Vec<Bytes>),
    Multipart(Multipart),
    /// Finished, aborted or failed: nothing left to do.
    Done,
}

struct Multipart {
    upload: Box<dyn MultipartUpload>,
    limits: UploadLimits,
    /// Bytes of the next part, not yet full.
    pending: Vec<Bytes>,
    pending_len: usize,
    /// Parts sent, running on their own while the next one fills.
    in_flight: JoinSet<object_store::Result<()>>,
    parts: usize,
}

impl Multipart {
    async fn write(&mut self, mut bytes: Bytes) -> object_store::Result<()> {
        while !bytes.is_empty() {
            let room = self.limits.part_size - self.pending_len;
            let piece = bytes.split_to(room.min(bytes.len()));
            self.pending_len += piece.len();
            self.pending.push(piece);
            if self.pending_len == self.limits.part_size {
                self.send_part().await?;
            }
        }
        Ok(())
    }

    /// Sends what is pending as the next part, once fewer than the limit
    /// are in flight.
    async fn send_part(&mut self) -> object_store::Result<()> {
        while self.in_flight.len() >= self.limits.parts_in_flight {
            self.join_next().await?;
        }
        let part = PutPayload::from_iter(std::mem::take(&mut self.pending));
        self.pending_len = 0;
        self.parts += 1;
        self.in_flight.spawn(self.upload.put_part(part));
        Ok(())
    }

    async fn join_next(&mut self) -> object_store::Result<()> {
        match self.in_flight.join_next().await {
            Some(Ok(result)) => result,
            Some(Err(panicked)) => Err(panicked.into()),
            None => Ok(()),
        }
    }

    async fn complete(&mut self) -> object_store::Result<()> {
        if self.pending_len > 0 || self.parts == 0 {
            self.send_part().await?;
        }
        while !self.in_flight.is_empty() {
            self.join_next().await?;
        }
        self.upload.complete().await.map(drop)
    }

    /// Parts in flight are awaited first, so that none lands after the
    /// abort.
    async fn abort(mut self) {
        while self.in_flight.join_next().await.is_some() {}
        let _ = self.upload.abort().await;
    }
}

impl CheckpointStorage {
    /// A writer of the object `relative`: one put, or a multipart upload
    /// once more than `limits.multipart_threshold` bytes are written.
    pub fn writer(
        &self,
        relative: &str,
        limits: UploadLimits,
    ) -> Result<ObjectWriter<'_>, StorageError> {
        Ok(ObjectWriter {
            storage: self,
            path: self.resolve(relative)?,
            limits: UploadLimits {
                part_size: limits.part_size.max(1),
                parts_in_flight: limits.parts_in_flight.max(1),
                ..limits
            },
            written: 0,
            target: Target::Put(Vec::new()),
        })
    }
}

impl ObjectWriter<'_> {
    /// Appends `bytes`. A full part goes out at once; if a part fails, the
    /// upload is aborted, the error returned, and the writer is done.
    pub async fn write(&mut self, bytes: Bytes) -> Result<(), StorageError> {
        let len = bytes.len() as u64;
        let result = match &mut self.target {
            Target::Put(pieces) if self.written + len > self.limits.multipart_threshold => {
                let held = std::mem::take(pieces);
                self.start_multipart(held, bytes).await
            }
            Target::Put(pieces) => {
                pieces.push(bytes);
                Ok(())
            }
            Target::Multipart(upload) => upload.write(bytes).await,
            Target::Done => return Err(self.done()),
        };
        match result {
            Ok(()) => {
                self.written += len;
                Ok(())
            }
            Err(error) => Err(self.fail(error).await),
        }
    }

    /// Turns the pieces held for a put, and `next`, into the start of a
    /// multipart upload.
    async fn start_multipart(&mut self, held: Vec<Bytes>, next: Bytes) -> object_store::Result<()> {
        self.target = Target::Done;
        let upload = self.storage.store.put_multipart(&self.path).await?;
        let mut multipart = Multipart {
            upload,
            limits: self.limits,
            pending: Vec::new(),
            pending_len: 0,
            in_flight: JoinSet::new(),
            parts: 0,
        };
        let written = async {
            for piece in held.into_iter().chain([next]) {
                multipart.write(piece).await?;
            }
            Ok(())
        }
        .await;
        self.target = Target::Multipart(multipart);
        written
    }

    /// Makes the object visible under its name with every byte written.
    pub async fn finish(mut self) -> Result<(), StorageError> {
        let result = match &mut self.target {
            Target::Put(pieces) => self
                .storage
                .store
                .put(&self.path, PutPayload::from_iter(std::mem::take(pieces)))
                .await
                .map(drop),
            Target::Multipart(upload) => upload.complete().await,
            Target::Done => return Err(self.done()),
        };
        if let Err(error) = result {
            return Err(self.fail(error).await);
        }
        self.target = Target::Done;
        let counters = self.storage.counters();
        counters.objects_created.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_uploaded
            .fetch_add(self.written, Ordering::Relaxed);
        Ok(())
    }

    /// Gives the object up: a multipart upload is aborted (best effort; an
    /// object store may keep an unfinished upload's parts until its own
    /// lifecycle rules remove them).
    pub async fn abort(mut self) {
        if let Target::Multipart(upload) = std::mem::replace(&mut self.target, Target::Done) {
            upload.abort().await;
        }
    }

    async fn fail(&mut self, error: object_store::Error) -> StorageError {
        if let Target::Multipart(upload) = std::mem::replace(&mut self.target, Target::Done) {
            upload.abort().await;
        }
        CheckpointStorage::io(&self.path)(error)
    }

    fn done(&self) -> StorageError {
        StorageError::Io {
            path: self.path.to_string(),
            source: object_store::Error::Generic {
                store: "upload",
                source: "written to after it finished or failed".into(),
            },
        }
    }
}

impl Drop for ObjectWriter<'_> {
    /// A writer dropped unfinished (its task cancelled) aborts its
    /// multipart upload in the background, so that no store keeps its parts.
    fn drop(&mut self) {
        if let Target::Multipart(upload) = std::mem::replace(&mut self.target, Target::Done) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(upload.abort());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::model::ids::JobId;

    fn limits() -> UploadLimits {
        UploadLimits {
            multipart_threshold: 10,
            part_size: 4,
            parts_in_flight: 2,
        }
    }

    async fn write_pieces(storage: &CheckpointStorage, path: &str, pieces: &[&[u8]]) {
        let mut writer = storage.writer(path, limits()).unwrap();
        for piece in pieces {
            writer.write(Bytes::copy_from_slice(piece)).await.unwrap();
        }
        writer.finish().await.unwrap();
    }

    #[tokio::test]
    async fn pieces_become_one_object_by_put_or_by_parts_on_every_store() {
        let dir = tempfile::tempdir().unwrap();
        for url in [dir.path().to_str().unwrap(), "memory://"] {
            let storage = CheckpointStorage::open(url, JobId(1)).unwrap();
            let small: &[&[u8]] = &[b"ab", b"", b"cdef"];
            let large: &[&[u8]] = &[b"0123456", b"789", b"abcdefghijklm", b"n"];
            write_pieces(&storage, "small", small).await;
            write_pieces(&storage, "large", large).await;
            assert_eq!(&storage.get("small").await.unwrap()[..], b"abcdef");
            assert_eq!(
                &storage.get("large").await.unwrap()[..],
                b"0123456789abcdefghijklmn"
            );
            let counters = storage.counters();
            assert_eq!(counters.objects_created.load(Ordering::Relaxed), 2);
            assert_eq!(counters.bytes_uploaded.load(Ordering::Relaxed), 30);
        }
    }

    #[tokio::test]
    async fn an_aborted_upload_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap(), JobId(1)).unwrap();
        let mut writer = storage.writer("aborted", limits()).unwrap();
        writer
            .write(Bytes::from_static(b"0123456789"))
            .await
            .unwrap();
        writer.abort().await;
        assert!(storage.get("aborted").await.unwrap_err().is_not_found());
        let leftovers: Vec<_> = walk(dir.path());
        assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    }

    /// A writer holds what it is given for one put while that stays within
    /// the threshold: nothing reaches the store. Past it the held pieces
    /// start a multipart upload (on a local store, a staging file beside
    /// the object), and the object appears only when finished.
    #[tokio::test]
    async fn pieces_are_held_for_one_put_until_they_pass_the_threshold() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap(), JobId(1)).unwrap();
        let mut writer = storage.writer("object", limits()).unwrap();
        writer.write(Bytes::from_static(b"01234")).await.unwrap();
        writer.write(Bytes::from_static(b"56789")).await.unwrap();
        assert!(walk(dir.path()).is_empty(), "ten bytes are held for a put");
        writer.write(Bytes::from_static(b"a")).await.unwrap();
        assert_eq!(walk(dir.path()).len(), 1, "a staging file of the upload");
        assert!(storage.get("object").await.unwrap_err().is_not_found());
        writer.finish().await.unwrap();
        assert_eq!(&storage.get("object").await.unwrap()[..], b"0123456789a");
        assert_eq!(walk(dir.path()).len(), 1, "the object alone");
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .flat_map(|entry| {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path)
                } else {
                    vec![path]
                }
            })
            .collect()
    }
}
