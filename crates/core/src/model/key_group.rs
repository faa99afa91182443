//! Key groups: the unit in which keyed state is partitioned, snapshotted and
//! moved on rescale. The formulas are Flink's (`KeyGroupRangeAssignment`), so a
//! key group always belongs to exactly one subtask and rescaling moves whole
//! key groups.

use crate::model::ids::{KeyGroup, SubtaskIndex};
use crate::model::key_hash::stable_hash;
use serde::{Deserialize, Serialize};

/// Flink's default upper bound for rescaling.
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

/// Inclusive range of key groups owned by one subtask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: u32,
    /// Last key group, included.
    pub end: u32,
}

impl KeyGroupRange {
    /// Flink's `computeKeyGroupRangeForOperatorIndex`.
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, index: SubtaskIndex) -> Self {
        assert!(
            parallelism > 0 && parallelism <= max_parallelism,
            "parallelism {parallelism} outside 1..={max_parallelism}"
        );
        let (max, p, i) = (
            u64::from(max_parallelism),
            u64::from(parallelism),
            u64::from(index.0),
        );
        let start = (i * max).div_ceil(p);
        let end = ((i + 1) * max - 1) / p;
        KeyGroupRange {
            start: start as u32,
            end: end as u32,
        }
    }

    /// Number of key groups.
    pub fn len(&self) -> usize {
        (self.end + 1 - self.start) as usize
    }

    /// Whether the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `group` is in the range.
    pub fn contains(&self, group: KeyGroup) -> bool {
        (self.start..=self.end).contains(&group.0)
    }

    /// Offset of `group` inside the range, for dense per-group tables.
    pub fn offset(&self, group: KeyGroup) -> usize {
        debug_assert!(self.contains(group), "{group} outside {self:?}");
        (group.0 - self.start) as usize
    }

    /// The key groups in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = KeyGroup> {
        (self.start..=self.end).map(KeyGroup)
    }
}

/// Flink's `computeOperatorIndexForKeyGroup`.
pub fn subtask_for_key_group(
    max_parallelism: u32,
    parallelism: u32,
    group: KeyGroup,
) -> SubtaskIndex {
    SubtaskIndex((u64::from(group.0) * u64::from(parallelism) / u64::from(max_parallelism)) as u32)
}

/// Hash of a key: a stable function of its value, the same in every
/// process, platform and build ([`crate::model::key_hash`]). State tables reuse
/// it, so a record's key is hashed once per operator.
#[inline]
pub fn key_hash<K: Serialize + ?Sized>(key: &K) -> u64 {
    stable_hash(key)
}

/// The key group of a key whose [`key_hash`] is `hash`:
/// `hash % max_parallelism`.
pub fn key_group_for_hash(hash: u64, max_parallelism: u32) -> KeyGroup {
    KeyGroup((hash % u64::from(max_parallelism)) as u32)
}

/// The key group of `key`; every subtask and every run computes the same.
pub fn key_group_of<K: Serialize + ?Sized>(key: &K, max_parallelism: u32) -> KeyGroup {
    key_group_for_hash(key_hash(key), max_parallelism)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_match_flink() {
        let r = |p, i| KeyGroupRange::for_subtask(128, p, SubtaskIndex(i));
        assert_eq!(r(1, 0), KeyGroupRange { start: 0, end: 127 });
        assert_eq!(r(2, 0), KeyGroupRange { start: 0, end: 63 });
        assert_eq!(
            r(2, 1),
            KeyGroupRange {
                start: 64,
                end: 127
            }
        );
        assert_eq!(r(3, 0), KeyGroupRange { start: 0, end: 42 });
        assert_eq!(r(3, 1), KeyGroupRange { start: 43, end: 85 });
        assert_eq!(
            r(3, 2),
            KeyGroupRange {
                start: 86,
                end: 127
            }
        );
    }

    #[test]
    fn key_groups_are_stable_across_processes() {
        // Fixed expectations: a change here breaks every existing savepoint.
        let groups: Vec<u32> = (0u64..6).map(|k| key_group_of(&k, 128).0).collect();
        assert_eq!(groups, [0, 82, 103, 40, 79, 90]);
    }

    proptest! {
        #[test]
        fn every_key_group_has_exactly_one_owner(max in 1u32..512, p_seed in 1u32..512) {
            let p = 1 + p_seed % max;
            for g in 0..max {
                let owners: Vec<u32> = (0..p)
                    .filter(|&i| KeyGroupRange::for_subtask(max, p, SubtaskIndex(i)).contains(KeyGroup(g)))
                    .collect();
                prop_assert_eq!(owners.len(), 1);
                prop_assert_eq!(subtask_for_key_group(max, p, KeyGroup(g)), SubtaskIndex(owners[0]));
            }
        }
    }
}
