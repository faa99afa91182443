//! Which links a worker process takes from its peers, and which attempt
//! each goes to: the rules that keep a stranger's connection from taking a
//! peer's place or piling up in memory.
//!
//! A link arrives with a hello naming its attempt and the worker that
//! dialed it. It may come before the attempt asks for it (the peer was
//! deployed first), so it is parked, or after (the attempt waits). Either
//! way each key is handed over once: a second link for a key already
//! parked or delivered is refused, never swapped in, so a link cannot be
//! replaced under a running attempt. Parked links are bounded in number
//! and dropped once their attempt can no longer run here.

use crate::cluster::attempts::{Claim, HostedAttempt, RunAttempt};
use std::collections::{HashMap, HashSet};

/// A link of an attempt, by the worker that dialed it.
pub type LinkKey = (RunAttempt, u32);

/// Links parked at most: more than any deployment has peers (a worker
/// links with each other worker once per attempt).
pub const MAX_PARKED_LINKS: usize = 256;

/// Why an arriving link was closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefusal {
    /// Its attempt cannot run here: an earlier one, or another job's while
    /// one runs.
    #[error("{run} cannot run here")]
    NotAdmitted {
        /// The attempt the hello named.
        run: RunAttempt,
    },
    /// A link with the same hello is parked or was handed over.
    #[error("worker {from} already linked for {run}")]
    Duplicate {
        /// The attempt the hello named.
        run: RunAttempt,
        /// The worker the hello named.
        from: u32,
    },
    /// [`MAX_PARKED_LINKS`] links wait for their attempts already.
    #[error("{MAX_PARKED_LINKS} links wait for their attempts already")]
    Full,
}

/// What becomes of an arriving link `L`, or of an attempt's wait `W`.
#[derive(Debug, PartialEq, Eq)]
pub enum Handover<L, W> {
    /// The link goes to the waiting attempt.
    Deliver(W, L),
    /// Kept until asked for (a link), or until it arrives (a wait).
    Kept,
    /// A link closed for this reason.
    Refused(L, LinkRefusal),
    /// A wait dropped: its attempt cannot run here, a later one replaced it.
    Dropped(W),
}

/// The links and waits of one worker process, and the attempt it hosts.
#[derive(Debug)]
pub struct LinkAdmission<L, W> {
    hosted: HostedAttempt,
    parked: HashMap<LinkKey, L>,
    waiting: HashMap<LinkKey, W>,
    /// Keys parked or handed over, for the attempts still admitted.
    taken: HashSet<LinkKey>,
}

impl<L, W> Default for LinkAdmission<L, W> {
    fn default() -> Self {
        LinkAdmission {
            hosted: HostedAttempt::default(),
            parked: HashMap::new(),
            waiting: HashMap::new(),
            taken: HashSet::new(),
        }
    }
}

impl<L, W> LinkAdmission<L, W> {
    /// `claimant` asks to run here ([`HostedAttempt::claim`]); a grant
    /// drops the links and waits of attempts it ends.
    pub fn claim(&mut self, claimant: RunAttempt) -> Claim {
        let claim = self.hosted.claim(claimant);
        if claim == Claim::Granted {
            self.forget_unadmitted();
        }
        claim
    }

    /// `ended` ended here; true if that frees the worker. Links parked for
    /// it go; those of later attempts (a peer that greets at once) stay.
    pub fn release(&mut self, ended: RunAttempt) -> bool {
        let frees = self.hosted.release(ended);
        if frees {
            let later = |key: &LinkKey| key.0.supersedes(&ended);
            self.parked.retain(|key, _| later(key));
            self.waiting.retain(|key, _| later(key));
            self.taken.retain(later);
        }
        frees
    }

    /// A link whose hello named `key` arrived.
    pub fn arrived(&mut self, key: LinkKey, link: L) -> Handover<L, W> {
        let (run, from) = key;
        if !self.hosted.admits(run) {
            return Handover::Refused(link, LinkRefusal::NotAdmitted { run });
        }
        if self.taken.contains(&key) {
            return Handover::Refused(link, LinkRefusal::Duplicate { run, from });
        }
        if let Some(waiter) = self.waiting.remove(&key) {
            self.taken.insert(key);
            return Handover::Deliver(waiter, link);
        }
        if self.parked.len() >= MAX_PARKED_LINKS {
            return Handover::Refused(link, LinkRefusal::Full);
        }
        self.taken.insert(key);
        self.parked.insert(key, link);
        Handover::Kept
    }

    /// The attempt of `key` waits for its link.
    pub fn awaited(&mut self, key: LinkKey, waiter: W) -> Handover<L, W> {
        if !self.hosted.admits(key.0) {
            return Handover::Dropped(waiter);
        }
        match self.parked.remove(&key) {
            Some(link) => Handover::Deliver(waiter, link),
            None => match self.waiting.insert(key, waiter) {
                // An attempt asks once per key: a second wait replaces a
                // first that gave up.
                Some(earlier) => Handover::Dropped(earlier),
                None => Handover::Kept,
            },
        }
    }

    /// Forgets waits that gave up (`gone`), say timed out.
    pub fn forget_waits(&mut self, mut gone: impl FnMut(&W) -> bool) {
        self.waiting.retain(|_, waiter| !gone(waiter));
    }

    /// Links parked now.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    fn forget_unadmitted(&mut self) {
        let hosted = &self.hosted;
        self.parked.retain(|(run, _), _| hosted.admits(*run));
        self.waiting.retain(|(run, _), _| hosted.admits(*run));
        self.taken.retain(|(run, _)| hosted.admits(*run));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{Attempt, JobId};

    fn run(epoch: u64, attempt: u32) -> RunAttempt {
        RunAttempt {
            job: JobId(7),
            epoch,
            attempt: Attempt(attempt),
        }
    }

    type Links = LinkAdmission<&'static str, &'static str>;

    #[test]
    fn a_link_goes_to_its_attempt_whichever_comes_first() {
        let mut links = Links::default();
        links.claim(run(1, 0));
        // The peer dialed first: parked, then handed over on asking.
        assert_eq!(links.arrived((run(1, 0), 1), "link 1"), Handover::Kept);
        assert_eq!(
            links.awaited((run(1, 0), 1), "wait 1"),
            Handover::Deliver("wait 1", "link 1")
        );
        // The attempt asked first: the link goes straight to it.
        assert_eq!(links.awaited((run(1, 0), 2), "wait 2"), Handover::Kept);
        assert_eq!(
            links.arrived((run(1, 0), 2), "link 2"),
            Handover::Deliver("wait 2", "link 2")
        );
        assert_eq!(links.parked(), 0);
    }

    #[test]
    fn a_second_link_for_a_key_is_refused_and_never_replaces_the_first() {
        let mut links = Links::default();
        links.claim(run(1, 0));
        let key = (run(1, 0), 1);
        let duplicate = LinkRefusal::Duplicate {
            run: run(1, 0),
            from: 1,
        };
        assert_eq!(links.arrived(key, "peer"), Handover::Kept);
        assert_eq!(
            links.arrived(key, "stranger"),
            Handover::Refused("stranger", duplicate.clone())
        );
        assert_eq!(
            links.awaited(key, "wait"),
            Handover::Deliver("wait", "peer")
        );
        // Delivered: still refused, the running attempt keeps its link.
        assert_eq!(
            links.arrived(key, "stranger"),
            Handover::Refused("stranger", duplicate)
        );
    }

    #[test]
    fn links_of_attempts_that_cannot_run_here_are_refused_or_dropped() {
        let mut links = Links::default();
        links.claim(run(1, 3));
        assert_eq!(
            links.arrived((run(1, 2), 1), "late"),
            Handover::Refused("late", LinkRefusal::NotAdmitted { run: run(1, 2) })
        );
        // A later attempt's link may come ahead of its deployment.
        assert_eq!(links.arrived((run(1, 4), 1), "ahead"), Handover::Kept);
        assert_eq!(links.awaited((run(1, 3), 2), "waiting"), Handover::Kept);
        // Attempt 4 claims the worker: attempt 3's wait and links go.
        assert_eq!(links.claim(run(1, 4)), Claim::Granted);
        assert_eq!(links.parked(), 1);
        assert_eq!(
            links.awaited((run(1, 3), 2), "stale"),
            Handover::Dropped("stale")
        );
        assert_eq!(
            links.awaited((run(1, 4), 1), "wait"),
            Handover::Deliver("wait", "ahead")
        );
    }

    #[test]
    fn an_ended_attempt_leaves_only_later_links_parked() {
        let mut links = Links::default();
        links.claim(run(1, 0));
        links.arrived((run(1, 0), 1), "own");
        links.arrived((run(1, 1), 1), "ahead");
        assert!(links.release(run(1, 0)));
        assert_eq!(links.parked(), 1);
        // A new run of the job claims the free worker; its links are new.
        links.claim(run(1, 1));
        assert_eq!(
            links.awaited((run(1, 1), 1), "wait"),
            Handover::Deliver("wait", "ahead")
        );
    }

    #[test]
    fn parked_links_are_bounded() {
        let mut links = Links::default();
        links.claim(run(1, 0));
        for from in 0..MAX_PARKED_LINKS as u32 {
            assert_eq!(links.arrived((run(1, 0), from), "link"), Handover::Kept);
        }
        let over = (run(1, 0), MAX_PARKED_LINKS as u32);
        assert_eq!(
            links.arrived(over, "one more"),
            Handover::Refused("one more", LinkRefusal::Full)
        );
        // A refusal for room takes no key: the real peer may come later.
        links.awaited((run(1, 0), 0), "wait");
        assert_eq!(links.arrived(over, "peer"), Handover::Kept);
    }

    #[test]
    fn a_wait_that_gave_up_is_forgotten() {
        let mut links = Links::default();
        links.claim(run(1, 0));
        links.awaited((run(1, 0), 1), "gave up");
        links.forget_waits(|w| *w == "gave up");
        assert_eq!(links.arrived((run(1, 0), 1), "link"), Handover::Kept);
    }
}
