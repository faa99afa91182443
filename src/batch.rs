//! Batches of records. Records travel typed and unserialized; a batch erases
//! the record type so that channel endpoints, gates and queues are not
//! generic. The type is checked once per batch, when the consuming operator
//! takes the records back out.

use serde::{de::DeserializeOwned, Serialize};
use std::any::Any;
use std::fmt;

/// What a record must be to cross a channel: owned, sendable, cloneable for
/// broadcast, serializable so that in-flight batches can become channel state.
pub trait Data: Clone + Send + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Serialize + DeserializeOwned + 'static> Data for T {}

/// Upper bounds on one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    pub max_records: usize,
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
}

/// A type-erased `Vec<T>` of records.
pub struct Batch {
    records: Box<dyn Records>,
    type_name: &'static str,
}

/// The consumer expected another record type than the producer sent: a wiring
/// bug in the job, reported rather than panicking.
#[derive(Debug, thiserror::Error)]
#[error("a batch of {found} arrived where {expected} was expected")]
pub struct BatchTypeError {
    pub expected: &'static str,
    pub found: &'static str,
}

impl Batch {
    pub fn new<T: Data>(records: Vec<T>) -> Self {
        Batch {
            records: Box::new(records),
            type_name: std::any::type_name::<T>(),
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        self.records.bytes()
    }

    pub fn into_records<T: Data>(self) -> Result<Vec<T>, BatchTypeError> {
        let found = self.type_name;
        self.records
            .into_any()
            .downcast::<Vec<T>>()
            .map(|b| *b)
            .map_err(|_| BatchTypeError {
                expected: std::any::type_name::<T>(),
                found,
            })
    }
}

impl Clone for Batch {
    fn clone(&self) -> Self {
        Batch {
            records: self.records.boxed_clone(),
            type_name: self.type_name,
        }
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Batch<{}>[{}]", self.type_name, self.len())
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
        assert_eq!(err.found, "(u64, u64)");
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
