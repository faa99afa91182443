//! Watermarks per split (Flink's split-aware watermark generation). A split
//! source subtask reads several splits in turn, each in its own time: one
//! file may hold this morning and another the afternoon. Its watermark
//! follows the slowest split it holds, so that reading one split ahead
//! never makes the records of another late.

use super::Millis;
use std::collections::BTreeMap;
use std::time::Duration;

/// The event time of each split a subtask holds.
#[derive(Clone, Debug, Default)]
pub struct SplitWatermarks {
    splits: BTreeMap<String, SplitTime>,
    /// The largest timestamp of the splits read to their end: what the
    /// watermark may follow once the subtask holds no split.
    retired: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct SplitTime {
    /// The largest timestamp read from it, or the subtask's when it came.
    max_timestamp: Option<u64>,
    /// When it last had records, or came.
    last_record_at: Millis,
}

impl SplitWatermarks {
    /// A read at `now`: the subtask holds `held` after it, and `records`
    /// came from one split with this largest timestamp. A split new to it
    /// starts at `current`, the timestamp the subtask's watermark follows,
    /// and holds it there until its own records pass it; a split no longer
    /// held (read to its end) holds nothing back.
    pub fn on_read(
        &mut self,
        held: &[&str],
        records: Option<(&str, u64)>,
        current: Option<u64>,
        now: Millis,
    ) {
        let came = records.map(|(split, _)| split);
        for id in held.iter().copied().chain(came) {
            if !self.splits.contains_key(id) {
                let time = SplitTime {
                    max_timestamp: current,
                    last_record_at: now,
                };
                self.splits.insert(id.to_owned(), time);
            }
        }
        if let Some((split, max)) = records {
            if let Some(time) = self.splits.get_mut(split) {
                time.max_timestamp = time.max_timestamp.max(Some(max));
                time.last_record_at = now;
            }
        }
        let retired = &mut self.retired;
        self.splits.retain(|id, time| {
            let kept = held.contains(&id.as_str());
            if !kept {
                *retired = (*retired).max(time.max_timestamp);
            }
            kept
        });
    }

    /// The timestamp the subtask's watermark may follow: the smallest over
    /// the splits that had records within `idleness` (all of them without
    /// it), or, holding none, the largest of those read to their end.
    /// `None` while a split that counts has no timestamp, or every split
    /// held is idle.
    pub fn combined(&self, idleness: Option<Duration>, now: Millis) -> Option<u64> {
        if self.splits.is_empty() {
            return self.retired;
        }
        let active = |time: &&SplitTime| match idleness {
            None => true,
            Some(timeout) => {
                let timeout = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                now.saturating_sub(time.last_record_at) < timeout
            }
        };
        self.splits
            .values()
            .filter(active)
            .map(|time| time.max_timestamp)
            .min()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_follows_the_slowest_split_held() {
        let mut w = SplitWatermarks::default();
        w.on_read(&["a", "b"], Some(("a", 100)), None, 1);
        assert_eq!(w.combined(None, 1), None, "b has no timestamp yet");
        w.on_read(&["a", "b"], Some(("b", 5_000)), None, 2);
        assert_eq!(w.combined(None, 2), Some(100));
        // A new split starts at the subtask's time and holds it there.
        w.on_read(&["a", "b", "c"], Some(("a", 200)), Some(100), 4);
        assert_eq!(w.combined(None, 4), Some(100));
        w.on_read(&["a", "b", "c"], Some(("c", 300)), Some(100), 5);
        assert_eq!(w.combined(None, 5), Some(200));
        // "a" is read to its end: it no longer holds the others back.
        w.on_read(&["b", "c"], Some(("a", 250)), Some(200), 6);
        assert_eq!(w.combined(None, 6), Some(300));
        // With every split read, the last records count.
        w.on_read(&["b"], Some(("c", 400)), Some(300), 7);
        w.on_read(&[], Some(("b", 5_100)), Some(400), 8);
        assert_eq!(w.combined(None, 8), Some(5_100));
    }

    #[test]
    fn an_idle_split_drops_out_until_it_has_records_again() {
        let idleness = Some(Duration::from_millis(10));
        let mut w = SplitWatermarks::default();
        w.on_read(&["a", "b"], Some(("a", 100)), None, 0);
        w.on_read(&["a", "b"], Some(("b", 50)), None, 0);
        w.on_read(&["a", "b"], Some(("a", 900)), None, 15);
        assert_eq!(w.combined(idleness, 15), Some(900), "b is idle");
        w.on_read(&["a", "b"], Some(("b", 60)), None, 16);
        assert_eq!(w.combined(idleness, 16), Some(60));
        assert_eq!(w.combined(idleness, 100), None, "both idle");
    }
}
