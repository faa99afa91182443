//! Which attempt a worker process hosts: the rule that keeps a stale
//! driver's deployment from displacing a newer one.

use crate::ids::{Attempt, JobId};

/// The attempt a worker hosts, one at a time. A newer attempt of the same
/// job replaces it (the driver restarted the job); an older one, or an
/// attempt of another job while one runs, is refused.
#[derive(Debug, Default)]
pub struct HostedAttempt {
    current: Option<(JobId, Attempt)>,
}

/// The answer to a claim.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The claimant runs; it first stops the attempt it replaces, if any.
    Granted {
        /// The attempt that ran here until now.
        replaces: Option<(JobId, Attempt)>,
    },
    /// Another attempt runs and stays.
    Refused {
        /// The attempt that runs.
        hosting: (JobId, Attempt),
    },
}

impl HostedAttempt {
    /// `attempt` of `job` asks to run here.
    pub fn claim(&mut self, job: JobId, attempt: Attempt) -> Claim {
        match self.current {
            Some(hosting) if hosting.0 != job || hosting.1 > attempt => Claim::Refused { hosting },
            replaces => {
                self.current = Some((job, attempt));
                Claim::Granted {
                    replaces: replaces.filter(|r| *r != (job, attempt)),
                }
            }
        }
    }

    /// `attempt` of `job` ended here; the worker is free unless a newer
    /// one has claimed it meanwhile.
    pub fn release(&mut self, job: JobId, attempt: Attempt) {
        if self.current == Some((job, attempt)) {
            self.current = None;
        }
    }

    /// Whether what arrives for `attempt` of `job` (a peer's link) may
    /// still be used: it is not of an attempt that can no longer run here.
    pub fn admits(&self, job: JobId, attempt: Attempt) -> bool {
        self.current.is_none_or(|(j, a)| j != job || a <= attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: JobId = JobId(1);
    const B: JobId = JobId(2);

    #[test]
    fn a_newer_attempt_replaces_and_an_older_one_is_refused() {
        let mut hosted = HostedAttempt::default();
        assert_eq!(
            hosted.claim(A, Attempt(0)),
            Claim::Granted { replaces: None }
        );
        assert_eq!(
            hosted.claim(A, Attempt(2)),
            Claim::Granted {
                replaces: Some((A, Attempt(0)))
            }
        );
        // The driver of attempt 1 was slow: its deployment comes too late.
        assert_eq!(
            hosted.claim(A, Attempt(1)),
            Claim::Refused {
                hosting: (A, Attempt(2))
            }
        );
        assert!(!hosted.admits(A, Attempt(1)));
        assert!(hosted.admits(A, Attempt(2)));
        assert!(hosted.admits(A, Attempt(3)));
    }

    #[test]
    fn another_job_waits_until_the_attempt_ends() {
        let mut hosted = HostedAttempt::default();
        hosted.claim(A, Attempt(4));
        assert_eq!(
            hosted.claim(B, Attempt(0)),
            Claim::Refused {
                hosting: (A, Attempt(4))
            }
        );
        // An older attempt's end does not free the worker.
        hosted.release(A, Attempt(3));
        assert!(matches!(hosted.claim(B, Attempt(0)), Claim::Refused { .. }));
        hosted.release(A, Attempt(4));
        assert_eq!(
            hosted.claim(B, Attempt(0)),
            Claim::Granted { replaces: None }
        );
    }
}
