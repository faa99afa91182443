//! The `_metadata` format: a magic number, a format version, a CRC-32 of the
//! payload and the payload (rmp-serde). Anything else — another file, a
//! truncated or corrupted one, a newer version — is refused with a reason.

use super::CompletedCheckpoint;
use thiserror::Error;

const MAGIC: &[u8; 8] = b"TIDEMARK";
/// 2: state handles are inline bytes, whole objects or segments of merged
/// files, and native files name the database instance that created them.
/// 3: handles of stored bytes carry their CRC-32, and channel state
/// carries no type name.
pub const VERSION: u16 = 3;
const HEADER: usize = MAGIC.len() + 2 + 4;

/// Why bytes are not a `_metadata` this build can read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MetadataError {
    /// Too short, or no `TIDEMARK` magic: another file.
    #[error("not checkpoint metadata (no Tidemark header)")]
    NotMetadata,
    /// A format version other than [`VERSION`].
    #[error("metadata format version {0} is not supported (this build reads version {VERSION})")]
    Version(u16),
    /// The payload does not match its CRC-32.
    #[error("metadata is corrupted or truncated (checksum mismatch)")]
    Checksum,
    /// The checksum holds but the payload does not decode.
    #[error("metadata does not decode: {0}")]
    Decode(String),
}

/// The `_metadata` bytes of `checkpoint`, in format [`VERSION`].
pub fn encode(checkpoint: &CompletedCheckpoint) -> Vec<u8> {
    let payload = rmp_serde::to_vec_named(checkpoint).expect("checkpoint metadata is plain data");
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Reads `_metadata` bytes, checking magic, version and checksum first.
pub fn decode(bytes: &[u8]) -> Result<CompletedCheckpoint, MetadataError> {
    if bytes.len() < HEADER || &bytes[..MAGIC.len()] != MAGIC {
        return Err(MetadataError::NotMetadata);
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != VERSION {
        return Err(MetadataError::Version(version));
    }
    let crc = u32::from_le_bytes(bytes[10..14].try_into().expect("four bytes"));
    let payload = &bytes[HEADER..];
    if crc32fast::hash(payload) != crc {
        return Err(MetadataError::Checksum);
    }
    rmp_serde::from_slice(payload).map_err(|e| MetadataError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{StateHandle, SubtaskState};
    use crate::model::event::CheckpointKind;
    use crate::model::ids::{CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
    use std::collections::BTreeMap;

    fn sample() -> CompletedCheckpoint {
        let mut state = SubtaskState::default();
        state
            .operator
            .insert("source-offset".into(), 42u64.to_le_bytes().to_vec());
        state.keyed = Some(crate::checkpoint::KeyedStateHandle::KeyGroups(
            crate::checkpoint::KeyGroupsStateHandle {
                start_group: 0,
                offsets: vec![0, 10],
                handle: StateHandle::object("chk-3/op-1-0", 20, 0),
            },
        ));
        CompletedCheckpoint {
            id: CheckpointId(3),
            kind: CheckpointKind::Checkpoint,
            format: Default::default(),
            operators: Vec::new(),
            edges: Vec::new(),
            key_hash: crate::model::key_hash::KEY_HASH_VERSION,
            timestamp: 17,
            subtasks: BTreeMap::from([(
                SubtaskId {
                    operator: OperatorId(1),
                    index: SubtaskIndex(0),
                },
                state,
            )]),
            master_states: BTreeMap::new(),
        }
    }

    #[test]
    fn round_trips() {
        assert_eq!(decode(&encode(&sample())), Ok(sample()));
    }

    #[test]
    fn refuses_foreign_truncated_corrupted_and_newer_files() {
        let good = encode(&sample());
        assert_eq!(decode(b"{\"json\": true}"), Err(MetadataError::NotMetadata));
        assert_eq!(
            decode(&good[..good.len() - 3]),
            Err(MetadataError::Checksum)
        );
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode(&flipped), Err(MetadataError::Checksum));
        let mut newer = good;
        newer[8] = 9;
        assert_eq!(decode(&newer), Err(MetadataError::Version(9)));
    }
}
