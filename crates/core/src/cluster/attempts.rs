//! Which attempt a worker process hosts: the rule that keeps a stale
//! driver's deployment from displacing a newer one.

use crate::model::ids::{Attempt, JobId};

/// One attempt of one run of a job. Attempts count from 0 in every run,
/// and a run that took the job directory over holds a newer lease epoch:
/// attempts of one job are ordered by epoch, then number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunAttempt {
    /// The job.
    pub job: JobId,
    /// The lease epoch of the run.
    pub epoch: u64,
    /// The attempt within the run.
    pub attempt: Attempt,
}

impl std::fmt::Display for RunAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "attempt {} of job {} (lease epoch {})",
            self.attempt.0, self.job, self.epoch
        )
    }
}

impl RunAttempt {
    /// Whether this is a later attempt of the same job than `other`.
    pub fn supersedes(&self, other: &RunAttempt) -> bool {
        self.job == other.job && (self.epoch, self.attempt) > (other.epoch, other.attempt)
    }
}

/// The attempt a worker hosts, one at a time. A later attempt of the same
/// job replaces it (the driver restarted the job, or a new driver took the
/// job over); an earlier one, or an attempt of another job while one runs,
/// is refused.
#[derive(Debug, Default)]
pub struct HostedAttempt {
    current: Option<RunAttempt>,
}

/// The answer to a claim.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The claimant runs; whatever ran here first stops.
    Granted,
    /// Another attempt runs and stays.
    Refused {
        /// The attempt that runs.
        hosting: RunAttempt,
    },
}

impl HostedAttempt {
    /// `claimant` asks to run here.
    pub fn claim(&mut self, claimant: RunAttempt) -> Claim {
        match self.current {
            // The same attempt again is a second call of one driver's
            // attempt, which a driver never opens: refused too.
            Some(hosting) if !claimant.supersedes(&hosting) => Claim::Refused { hosting },
            _ => {
                self.current = Some(claimant);
                Claim::Granted
            }
        }
    }

    /// `ended` ended here; true if that frees the worker (no later attempt
    /// claimed it meanwhile).
    pub fn release(&mut self, ended: RunAttempt) -> bool {
        let frees = self.current == Some(ended);
        if frees {
            self.current = None;
        }
        frees
    }

    /// Whether what arrives for `attempt` (a peer's link) may be kept until
    /// it is asked for: not if another attempt runs that it cannot replace.
    pub fn admits(&self, attempt: RunAttempt) -> bool {
        self.current
            .is_none_or(|hosting| hosting == attempt || attempt.supersedes(&hosting))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(job: u64, epoch: u64, attempt: u32) -> RunAttempt {
        RunAttempt {
            job: JobId(job),
            epoch,
            attempt: Attempt(attempt),
        }
    }

    #[test]
    fn a_later_attempt_replaces_and_an_earlier_one_is_refused() {
        let mut hosted = HostedAttempt::default();
        assert_eq!(hosted.claim(of(1, 1, 0)), Claim::Granted);
        assert_eq!(hosted.claim(of(1, 1, 2)), Claim::Granted);
        assert!(matches!(hosted.claim(of(1, 1, 2)), Claim::Refused { .. }));
        // The driver of attempt 1 was slow: its deployment comes too late.
        assert_eq!(
            hosted.claim(of(1, 1, 1)),
            Claim::Refused {
                hosting: of(1, 1, 2)
            }
        );
        assert!(!hosted.admits(of(1, 1, 1)));
        assert!(hosted.admits(of(1, 1, 2)));
        assert!(hosted.admits(of(1, 1, 3)));
        // A new driver took the job over: its attempt 0 is the later one,
        // and the old driver's attempts no longer get in.
        assert_eq!(hosted.claim(of(1, 2, 0)), Claim::Granted);
        assert!(matches!(hosted.claim(of(1, 1, 7)), Claim::Refused { .. }));
        assert!(!hosted.admits(of(1, 1, 7)));
    }

    #[test]
    fn another_job_waits_until_the_attempt_ends() {
        let mut hosted = HostedAttempt::default();
        hosted.claim(of(1, 1, 4));
        assert_eq!(
            hosted.claim(of(2, 1, 0)),
            Claim::Refused {
                hosting: of(1, 1, 4)
            }
        );
        assert!(!hosted.admits(of(2, 1, 0)));
        // An earlier attempt's end does not free the worker.
        assert!(!hosted.release(of(1, 1, 3)));
        assert!(matches!(hosted.claim(of(2, 1, 0)), Claim::Refused { .. }));
        assert!(hosted.release(of(1, 1, 4)));
        assert_eq!(hosted.claim(of(2, 1, 0)), Claim::Granted);
    }
}
