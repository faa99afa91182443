//! Batches of records. Records travel typed and unserialized; a batch erases
//! the record type so that channel endpoints, gates and queues are not
//! generic. The type is checked once per batch, when the consuming operator
//! takes the records back out.
//!
//! In-flight batches that an unaligned checkpoint captures are encoded to
//! bytes; restored, they stay encoded until the consumer takes them out, the
//! only place that knows their type.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::any::Any;
use std::fmt;

/// What a record must be to cross a channel: owned, sendable, cloneable for
/// broadcast, serializable so that in-flight batches can become channel state.
/// Shareable too: a heap snapshot reads keyed state from another thread while
/// the subtask goes on reading it.
pub trait Data: Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static> Data for T {}

/// Upper bounds on one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Records per batch.
    pub max_records: usize,
    /// In-memory bytes per batch, counted as `size_of::<T>()` per record
    /// (what the records own on the heap is not counted).
    pub max_bytes: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_records: 4096,
            max_bytes: 1 << 20,
        }
    }
}

impl BatchLimits {
    /// Records of `T` per batch: the byte bound is applied to the records'
    /// in-memory size, which is what a queued batch costs.
    pub fn records_of<T>(&self) -> usize {
        let size = std::mem::size_of::<T>().max(1);
        self.max_records.min(self.max_bytes / size).max(1)
    }
}

trait Records: Send {
    fn len(&self) -> usize;
    fn bytes(&self) -> usize;
    fn boxed_clone(&self) -> Box<dyn Records>;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    fn encode_into(&self, out: &mut Vec<u8>);
}

impl<T: Data> Records for Vec<T> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn bytes(&self) -> usize {
        Vec::len(self) * std::mem::size_of::<T>()
    }
    fn boxed_clone(&self) -> Box<dyn Records> {
        Box::new(self.clone())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
    fn encode_into(&self, out: &mut Vec<u8>) {
        rmp_serde::encode::write(out, self).expect("records serialize to memory");
    }
}

/// A batch as bytes (channel state): the records as rmp-serde. It carries
/// no type name: `std::any::type_name` is not stable across compilers, and
/// a restore matches channel state to the same operators' edges by uid
/// before any batch is decoded; records that do not decode as the
/// consumer's type are refused then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodedBatch {
    /// Number of records.
    pub len: u64,
    /// In-memory size of the records when they were encoded.
    pub bytes: u64,
    /// The `Vec` of records, rmp-serde.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

enum Payload {
    Typed {
        records: Box<dyn Records>,
        type_name: &'static str,
    },
    Encoded(EncodedBatch),
}

/// A type-erased `Vec<T>` of records.
pub struct Batch(Payload);

/// The consumer expected another record type than the producer sent (a
/// wiring bug of the job, or channel state written by another job), or the
/// stored records are damaged: reported rather than panicking.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The record type differs.
    #[error("a batch of {found} arrived where {expected} was expected")]
    Type {
        /// The type the consumer takes.
        expected: &'static str,
        /// The type the batch holds.
        found: String,
    },
    /// Stored records that do not decode as the consumer's type.
    #[error("a stored batch does not decode as {type_name}: {reason}")]
    Decode {
        /// The type the consumer takes.
        type_name: &'static str,
        /// The decoder's error.
        reason: String,
    },
}

impl Batch {
    /// A batch of `records`, typed; nothing is serialized.
    pub fn new<T: Data>(records: Vec<T>) -> Self {
        Batch(Payload::Typed {
            records: Box::new(records),
            type_name: std::any::type_name::<T>(),
        })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        match &self.0 {
            Payload::Typed { records, .. } => records.len(),
            Payload::Encoded(e) => e.len as usize,
        }
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// In-memory size, as [`BatchLimits::max_bytes`] counts it.
    pub fn bytes(&self) -> usize {
        match &self.0 {
            Payload::Typed { records, .. } => records.bytes(),
            Payload::Encoded(e) => e.bytes as usize,
        }
    }

    fn type_name(&self) -> &str {
        match &self.0 {
            Payload::Typed { type_name, .. } => type_name,
            Payload::Encoded(_) => "encoded records",
        }
    }

    /// The batch as bytes, for channel state.
    pub fn encode(&self) -> EncodedBatch {
        let mut data = Vec::new();
        self.encode_into(&mut data);
        EncodedBatch {
            len: self.len() as u64,
            bytes: self.bytes() as u64,
            data,
        }
    }

    /// Appends the records as [`EncodedBatch::data`] holds them, without
    /// a buffer of their own: a frame on the wire is written in one piece.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match &self.0 {
            Payload::Typed { records, .. } => records.encode_into(out),
            Payload::Encoded(e) => out.extend_from_slice(&e.data),
        }
    }

    /// The records, if they are of type `T`; encoded records are decoded
    /// here.
    pub fn into_records<T: Data>(self) -> Result<Vec<T>, BatchError> {
        let expected = std::any::type_name::<T>();
        let mismatch = |found: &str| BatchError::Type {
            expected,
            found: found.to_owned(),
        };
        match self.0 {
            Payload::Typed { records, type_name } => records
                .into_any()
                .downcast::<Vec<T>>()
                .map(|b| *b)
                .map_err(|_| mismatch(type_name)),
            Payload::Encoded(e) => {
                rmp_serde::from_slice(&e.data).map_err(|error| BatchError::Decode {
                    type_name: expected,
                    reason: error.to_string(),
                })
            }
        }
    }
}

impl From<EncodedBatch> for Batch {
    fn from(encoded: EncodedBatch) -> Self {
        Batch(Payload::Encoded(encoded))
    }
}

impl Clone for Batch {
    fn clone(&self) -> Self {
        Batch(match &self.0 {
            Payload::Typed { records, type_name } => Payload::Typed {
                records: records.boxed_clone(),
                type_name,
            },
            Payload::Encoded(e) => Payload::Encoded(e.clone()),
        })
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Batch<{}>[{}]", self.type_name(), self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_typed_or_not_at_all() {
        let b = Batch::new(vec![(1u64, 2u64), (3, 4)]);
        assert_eq!(b.len(), 2);
        assert_eq!(b.bytes(), 32);
        assert_eq!(
            b.clone().into_records::<(u64, u64)>().unwrap(),
            vec![(1, 2), (3, 4)]
        );
        let err = b.into_records::<String>().unwrap_err();
        assert!(matches!(err, BatchError::Type { found, .. } if found == "(u64, u64)"));
    }

    #[test]
    fn an_encoded_batch_decodes_to_its_own_shape_only() {
        let encoded = Batch::new(vec![("a".to_owned(), 1u64), ("b".into(), 2)]).encode();
        assert_eq!(encoded.len, 2);
        let restored = Batch::from(encoded.clone());
        assert_eq!((restored.len(), restored.bytes()), (2, 64));
        assert_eq!(restored.encode(), encoded);
        assert_eq!(
            restored.clone().into_records::<(String, u64)>().unwrap(),
            vec![("a".to_owned(), 1), ("b".to_owned(), 2)]
        );
        assert!(matches!(
            restored.into_records::<u64>(),
            Err(BatchError::Decode { .. })
        ));
        let damaged = EncodedBatch {
            data: encoded.data[..3].to_vec(),
            ..encoded
        };
        assert!(matches!(
            Batch::from(damaged).into_records::<(String, u64)>(),
            Err(BatchError::Decode { .. })
        ));
    }

    #[test]
    fn byte_limit_bounds_large_records() {
        let limits = BatchLimits {
            max_records: 4096,
            max_bytes: 1024,
        };
        assert_eq!(limits.records_of::<[u8; 256]>(), 4);
        assert_eq!(limits.records_of::<u8>(), 1024);
        assert_eq!(limits.records_of::<[u8; 4096]>(), 1);
    }
}
