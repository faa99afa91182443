//! How a checkpointed job ends, sans-IO. A source that has read everything
//! does not end its output at once: records after its last checkpoint could
//! otherwise be replayed after they were committed. Once every source of the
//! running attempt has reported itself exhausted, one checkpoint is started
//! as soon as no other is in flight (the final checkpoint, FLIP-147's idea);
//! when a completed checkpoint holds every source as exhausted, the sources
//! are told to end their output and no checkpoint starts after it.
//!
//! An attempt restored from such a checkpoint takes no checkpoint at all:
//! its sources end their output as soon as they report themselves
//! exhausted. Everything its sinks receive then comes after the restored
//! checkpoint, as in the attempt that failed, so it lands in the same final
//! files, which replace themselves. A new final checkpoint would instead
//! commit part of it (say a window that an overtaken watermark fires early)
//! under a checkpoint's name, beside the final file that already holds it.
//! That holds only for a checkpoint of this run: a run may start from
//! another run's final checkpoint with more to read, and checkpoints as
//! usual.

use super::{ends_input, CompletedCheckpoint};
use crate::model::ids::{Attempt, SubtaskId};
use std::collections::BTreeSet;

/// Decides when a checkpointed job takes its final checkpoint and when its
/// sources may end their output. The coordinator actor owns one.
#[derive(Debug, Default)]
pub struct InputEnd {
    attempt: Attempt,
    sources: Vec<SubtaskId>,
    /// Reports by attempt: a restored source can report before the shell
    /// has announced its attempt.
    exhausted: BTreeSet<(Attempt, SubtaskId)>,
    final_wanted: bool,
    ended: bool,
    /// A checkpoint completed in this run ended the input.
    ended_in_this_run: bool,
}

impl InputEnd {
    /// A new attempt runs with these sources; earlier reports are void.
    /// `input_ended`: it restored a checkpoint holding every source as
    /// exhausted, which ends its input if this run completed it. Returns
    /// the sources to tell to end their output now: those of such an
    /// attempt that reported before it was announced.
    pub fn deployed(
        &mut self,
        attempt: Attempt,
        sources: Vec<SubtaskId>,
        input_ended: bool,
    ) -> Vec<SubtaskId> {
        self.attempt = attempt;
        self.sources = sources;
        self.ended = input_ended && self.ended_in_this_run;
        self.exhausted.retain(|(a, _)| *a == attempt);
        self.check();
        if !self.ended {
            return Vec::new();
        }
        let reported = self.exhausted.iter().map(|(_, s)| *s);
        reported.filter(|s| self.sources.contains(s)).collect()
    }

    /// Source `source` of `attempt` has read everything; reports of older
    /// attempts are ignored. Returns whether to tell it to end its output
    /// now: its attempt restored a checkpoint that ended the input.
    pub fn source_exhausted(&mut self, attempt: Attempt, source: SubtaskId) -> bool {
        if attempt < self.attempt {
            return false;
        }
        self.exhausted.insert((attempt, source));
        self.check();
        self.ended && attempt == self.attempt && self.sources.contains(&source)
    }

    fn check(&mut self) {
        let attempt = self.attempt;
        self.final_wanted = !self.ended
            && !self.sources.is_empty()
            && self
                .sources
                .iter()
                .all(|s| self.exhausted.contains(&(attempt, *s)));
    }

    /// Whether to start the final checkpoint now, given the checkpoints in
    /// flight; answers yes once.
    pub fn trigger_final(&mut self, in_flight: usize) -> bool {
        let now = self.final_wanted && in_flight == 0;
        if now {
            self.final_wanted = false;
        }
        now
    }

    /// A checkpoint completed: whether the sources may now end their output.
    pub fn completed(&mut self, checkpoint: &CompletedCheckpoint) -> bool {
        if !self.ended && ends_input(checkpoint, &self.sources) {
            self.ended = true;
            self.ended_in_this_run = true;
            self.final_wanted = false;
        }
        self.ended
    }

    /// The input ended (or the job is over): nothing may be triggered.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The job is over without its input having ended.
    pub fn stop(&mut self) {
        self.ended = true;
        self.final_wanted = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::entries::SOURCE_EXHAUSTED;
    use crate::checkpoint::SubtaskState;
    use crate::model::ids::{OperatorId, SubtaskIndex};
    use crate::testkit::checkpoint;
    use std::collections::BTreeMap;

    fn source(i: u32) -> SubtaskId {
        SubtaskId {
            operator: OperatorId(0),
            index: SubtaskIndex(i),
        }
    }

    fn holding(exhausted: &[u32]) -> CompletedCheckpoint {
        let mut c = checkpoint(1);
        for i in 0..2 {
            let mut state = SubtaskState::default();
            if exhausted.contains(&i) {
                state.operator = BTreeMap::from([(SOURCE_EXHAUSTED.to_owned(), Vec::new())]);
            }
            c.subtasks.insert(source(i), state);
        }
        c
    }

    #[test]
    fn the_final_checkpoint_waits_for_every_source_and_for_nothing_in_flight() {
        let mut end = InputEnd::default();
        end.deployed(Attempt(0), vec![source(0), source(1)], false);
        end.source_exhausted(Attempt(0), source(0));
        assert!(!end.trigger_final(0));
        end.source_exhausted(Attempt(0), source(1));
        assert!(!end.trigger_final(1), "a checkpoint in flight comes first");
        assert!(end.trigger_final(0));
        assert!(!end.trigger_final(0), "once");
    }

    #[test]
    fn input_ends_only_with_a_checkpoint_holding_every_source_exhausted() {
        let mut end = InputEnd::default();
        end.deployed(Attempt(0), vec![source(0), source(1)], false);
        assert!(!end.completed(&holding(&[0])));
        assert!(end.completed(&holding(&[0, 1])));
        assert!(end.ended());
    }

    #[test]
    fn a_report_racing_its_attempts_announcement_counts_and_older_ones_do_not() {
        let mut end = InputEnd::default();
        end.deployed(Attempt(0), vec![source(0)], false);
        end.source_exhausted(Attempt(1), source(0));
        assert!(!end.trigger_final(0), "attempt 1 is not running yet");
        end.deployed(Attempt(1), vec![source(0)], false);
        assert!(end.trigger_final(0));

        end.deployed(Attempt(2), vec![source(0)], false);
        end.source_exhausted(Attempt(1), source(0));
        assert!(
            !end.trigger_final(0),
            "a report of a failed attempt is void"
        );
    }

    #[test]
    fn an_attempt_restored_from_the_final_checkpoint_ends_each_source_as_it_reports() {
        let mut end = InputEnd::default();
        end.deployed(Attempt(0), vec![source(0), source(1)], false);
        assert!(end.completed(&holding(&[0, 1])));
        assert!(
            !end.source_exhausted(Attempt(1), source(1)),
            "attempt 1 is not running yet"
        );
        let now = end.deployed(Attempt(1), vec![source(0), source(1)], true);
        assert_eq!(now, vec![source(1)], "it reported before the announcement");
        assert!(end.ended(), "no checkpoint starts, periodic or manual");
        assert!(end.source_exhausted(Attempt(1), source(0)));
        assert!(!end.trigger_final(0), "no final checkpoint either");
        assert!(
            !end.source_exhausted(Attempt(0), source(0)),
            "a report of a failed attempt is void"
        );

        let now = end.deployed(Attempt(2), vec![source(0), source(1)], false);
        assert!(now.is_empty());
        assert!(!end.ended(), "restored from an earlier checkpoint");
        assert!(!end.source_exhausted(Attempt(2), source(0)));
        assert!(!end.source_exhausted(Attempt(2), source(1)));
        assert!(end.trigger_final(0));
    }

    #[test]
    fn a_run_restored_from_another_runs_final_checkpoint_reads_on_and_ends_as_usual() {
        let mut end = InputEnd::default();
        let now = end.deployed(Attempt(0), vec![source(0), source(1)], true);
        assert!(now.is_empty());
        assert!(!end.ended(), "its sources may have more to read");
        assert!(!end.source_exhausted(Attempt(0), source(0)));
        assert!(!end.source_exhausted(Attempt(0), source(1)));
        assert!(end.trigger_final(0), "a final checkpoint of its own");
        assert!(end.completed(&holding(&[0, 1])));

        let now = end.deployed(Attempt(1), vec![source(0), source(1)], true);
        assert!(now.is_empty());
        assert!(end.ended(), "restored from this run's final checkpoint");
    }

    #[test]
    fn a_restart_after_the_end_starts_over_and_a_stop_ends_everything() {
        let mut end = InputEnd::default();
        end.deployed(Attempt(0), vec![source(0), source(1)], false);
        assert!(end.completed(&holding(&[0, 1])));
        end.deployed(Attempt(1), vec![source(0), source(1)], false);
        assert!(!end.ended());
        end.stop();
        assert!(end.ended());
        end.source_exhausted(Attempt(1), source(0));
        end.source_exhausted(Attempt(1), source(1));
        assert!(!end.trigger_final(0));
    }
}
