//! How the records of a source are split among its subtasks, and how that
//! split survives a change of parallelism with every record read exactly once.
//!
//! A source is a sequence of records indexed from 0. Subtask j of P reads the
//! indices i ≡ j (mod P) in increasing order, so its progress is one number:
//! the next index it would read. The progress of all P subtasks together is a
//! [`Staircase`]: record i was read iff i is below the next index of its
//! residue class. On a rescale to P' the staircase of the old subtasks is
//! handed to every new subtask, which skips the indices it covers; once a
//! subtask has passed the top of a staircase it drops it. A rescale before
//! the subtasks passed an earlier staircase keeps that one too, so the
//! records read so far are always the union of the staircases and the
//! current subtasks' progress.

use serde::{Deserialize, Serialize};

/// What P subtasks had read: index i iff `i < next[i % P]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staircase {
    /// Per residue class, the next index its subtask would have read.
    pub next: Vec<u64>,
}

impl Staircase {
    fn contains(&self, index: u64) -> bool {
        index < self.next[(index % self.next.len() as u64) as usize]
    }

    /// Every index below it was read.
    fn floor(&self) -> u64 {
        self.next.iter().copied().min().unwrap_or(0)
    }

    /// No index from it on was read.
    fn top(&self) -> u64 {
        self.next.iter().copied().max().unwrap_or(0)
    }

    /// The first index it does not contain among `from`, `from + step`,
    /// `from + 2 step`, ... (`u64::MAX` if none below). Along that sequence
    /// the residues modulo its width repeat every `lcm(step, width)`, so
    /// each of the first `width / gcd` indices starts a chain of one
    /// residue, read up to that residue's next: one jump per chain instead
    /// of one step per index, whatever the gap.
    fn first_unread(&self, from: u64, step: u64) -> u64 {
        let width = self.next.len() as u64;
        let chains = width / gcd(step, width);
        let cycle = step.saturating_mul(chains);
        (0..chains)
            .map(|k| {
                let Some(index) = k.checked_mul(step).and_then(|d| from.checked_add(d)) else {
                    return u64::MAX;
                };
                let read_until = self.next[(index % width) as usize];
                if index >= read_until {
                    return index;
                }
                (read_until - index)
                    .div_ceil(cycle)
                    .checked_mul(cycle)
                    .and_then(|d| index.checked_add(d))
                    .unwrap_or(u64::MAX)
            })
            .min()
            .unwrap_or(u64::MAX)
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A source subtask's progress: what goes into its operator state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitPosition {
    /// The next index of this subtask's residue class it considers.
    pub next: u64,
    /// What earlier parallelisms read, to skip.
    pub read_before: Vec<Staircase>,
}

impl SplitPosition {
    /// Where subtask `subtask` starts on a fresh start.
    pub fn start(subtask: u32) -> Self {
        SplitPosition {
            next: u64::from(subtask),
            read_before: Vec::new(),
        }
    }
}

/// The positions of `parallelism` new subtasks that go on from where the old
/// subtasks, `old[j]` being subtask j's position, stopped: together they read
/// every index the old subtasks had not, exactly once.
pub fn redistribute(old: &[SplitPosition], parallelism: u32) -> Vec<SplitPosition> {
    let mut read_before: Vec<Staircase> = Vec::new();
    for staircase in old.iter().flat_map(|p| &p.read_before) {
        if !read_before.contains(staircase) {
            read_before.push(staircase.clone());
        }
    }
    read_before.push(Staircase {
        next: old.iter().map(|p| p.next).collect(),
    });
    (0..parallelism)
        .map(|j| {
            let position = SplitPosition {
                next: u64::from(j),
                read_before: read_before.clone(),
            };
            Split::new(j, parallelism, Some(position)).position
        })
        .collect()
}

/// The indices one source subtask reads, from a position.
#[derive(Clone, Debug)]
pub struct Split {
    step: u64,
    position: SplitPosition,
}

impl Split {
    /// Subtask `subtask` of `parallelism` from `position`, or from its start.
    /// Below the highest floor of the staircases everything was read, so it
    /// starts there at the earliest. (`next` only grows and staircases are
    /// only dropped, so later reads never fall below it again.)
    pub fn new(subtask: u32, parallelism: u32, position: Option<SplitPosition>) -> Self {
        let step = u64::from(parallelism);
        let mut position = position.unwrap_or_else(|| SplitPosition::start(subtask));
        let floor = position
            .read_before
            .iter()
            .map(Staircase::floor)
            .max()
            .unwrap_or(0);
        if position.next < floor {
            let steps = (floor - position.next).div_ceil(step);
            position.next = steps
                .checked_mul(step)
                .and_then(|skip| position.next.checked_add(skip))
                .unwrap_or(u64::MAX);
        }
        let mut split = Split { step, position };
        split.skip_read();
        split
    }

    /// The next index to read; [`advance`](Self::advance) moves past it.
    pub fn peek(&self) -> u64 {
        self.position.next
    }

    /// Marks the index [`peek`](Self::peek) returned as read.
    pub fn advance(&mut self) {
        self.position.next = self.position.next.saturating_add(self.step);
        self.skip_read();
    }

    /// The progress to checkpoint as the subtask's operator state.
    pub fn position(&self) -> &SplitPosition {
        &self.position
    }

    /// Moves `next` past the indices an earlier parallelism read, dropping
    /// the staircases it has passed. Indices saturate at `u64::MAX`, which
    /// no staircase covers: a position restored from a checkpoint can
    /// neither overflow them nor make the skip take as long as its gap.
    fn skip_read(&mut self) {
        let step = self.step;
        let SplitPosition { next, read_before } = &mut self.position;
        loop {
            read_before.retain(|s| *next < s.top());
            match read_before.iter().find(|s| s.contains(*next)) {
                Some(staircase) => *next = staircase.first_unread(*next, step),
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Reads `counts[j]` indices (or to `records`) with subtask j of
    /// `positions.len()`, recording who read what.
    fn run(
        positions: Vec<SplitPosition>,
        counts: &[u64],
        records: u64,
        read: &mut BTreeMap<u64, u32>,
    ) -> Vec<SplitPosition> {
        let p = positions.len() as u32;
        positions
            .into_iter()
            .enumerate()
            .map(|(j, position)| {
                let mut split = Split::new(j as u32, p, Some(position));
                for _ in 0..counts[j % counts.len()] {
                    let i = split.peek();
                    if i >= records {
                        break;
                    }
                    *read.entry(i).or_default() += 1;
                    split.advance();
                }
                split.position().clone()
            })
            .collect()
    }

    #[test]
    fn a_rescaled_source_reads_the_gaps_first_then_goes_on() {
        let mut read = BTreeMap::new();
        // p=2: subtask 0 read 0, 2, 4; subtask 1 read 1.
        let old = run(
            (0..2).map(SplitPosition::start).collect(),
            &[3, 1],
            100,
            &mut read,
        );
        let new = redistribute(&old, 3);
        let mut reads: Vec<Vec<u64>> = Vec::new();
        for (j, position) in new.into_iter().enumerate() {
            let mut split = Split::new(j as u32, 3, Some(position));
            let mut mine = Vec::new();
            while split.peek() < 12 {
                mine.push(split.peek());
                split.advance();
            }
            reads.push(mine);
        }
        assert_eq!(reads, [vec![3, 6, 9], vec![7, 10], vec![5, 8, 11]]);
        assert!(Split::new(0, 3, Some(SplitPosition::start(0)))
            .position()
            .read_before
            .is_empty());
    }

    #[test]
    fn positions_near_the_end_of_the_index_space_saturate_instead_of_overflowing() {
        let near = u64::MAX - 2;
        let old = [near, u64::MAX].map(|next| SplitPosition {
            next,
            read_before: Vec::new(),
        });
        for p in 1..5 {
            for position in redistribute(&old, p) {
                assert!(position.next >= near, "p={p}: {position:?}");
            }
        }
        let mut split = Split::new(
            0,
            3,
            Some(SplitPosition {
                next: u64::MAX - 1,
                read_before: Vec::new(),
            }),
        );
        split.advance();
        assert_eq!(split.peek(), u64::MAX);
        split.advance();
        assert_eq!(split.peek(), u64::MAX);
    }

    #[test]
    fn a_gap_as_wide_as_the_index_space_is_skipped_at_once() {
        let far = 1 << 62;
        let old = [0, far, 5, far + 3].map(|next| SplitPosition {
            next,
            read_before: Vec::new(),
        });
        let new = redistribute(&old, 2);
        // Even indices: class 0 read nothing, class 2 up to 5 (0, 4 of 2).
        assert_eq!(new[0].next, 0);
        let mut even = Split::new(0, 2, Some(new[0].clone()));
        let firsts: Vec<u64> = (0..3)
            .map(|_| {
                let i = even.peek();
                even.advance();
                i
            })
            .collect();
        assert_eq!(firsts, [0, 4, 6]);
        // Odd indices: classes 1 and 3 read up to far and far + 3.
        assert_eq!(new[1].next, far + 1);
        let mut odd = Split::new(1, 2, Some(new[1].clone()));
        odd.advance();
        assert_eq!(odd.peek(), far + 3);
    }

    proptest! {
        /// Any number of rescales at random progress: every index below
        /// `records` is read exactly once.
        #[test]
        fn every_record_is_read_exactly_once_across_rescales(
            records in 0u64..300,
            steps in prop::collection::vec((1u32..7, prop::collection::vec(0u64..40, 1..7)), 1..5),
        ) {
            let mut read = BTreeMap::new();
            let mut positions: Vec<SplitPosition> =
                (0..steps[0].0).map(SplitPosition::start).collect();
            for (p, counts) in &steps {
                positions = redistribute(&positions, *p);
                positions = run(positions, counts, records, &mut read);
                for position in &positions {
                    prop_assert!(position.read_before.len() <= steps.len() + 1);
                }
            }
            positions = run(positions, &[u64::MAX], records, &mut read);
            prop_assert!(read.values().all(|&n| n == 1), "{read:?}");
            prop_assert_eq!(read.len() as u64, records);
            for position in &positions {
                prop_assert!(position.next >= records);
            }
        }
    }
}
