//! Which of several drivers of one job leads: leader election over a shared
//! record that only a compare-and-swap writes, as a Kubernetes `Lease` is
//! (every update names the version it replaces, and a stale one is
//! refused).
//!
//! The rules are client-go's: a candidate takes a record that is absent,
//! released, or held by another and unchanged for the record's lease
//! duration of the candidate's own clock (so the holders' clocks never
//! need to agree); the leader rewrites the record every retry period and
//! stops leading once it has not managed to for the renew deadline, which
//! is shorter than the lease duration, so it has stopped before anybody
//! else may take over. A job that ran to its end leaves the record released
//! and marked finished, and a candidate that finds it so does not run the
//! job again.
//!
//! Leading alone never fences a stale leader's writes (a paused process
//! does not know it was paused): the job directory's lease
//! (`tidemark_storage::lease`) does that, by epoch, and an elected leader
//! takes it over.
//!
//! [`Elector`] is pure: the caller reads the record, asks what to write,
//! writes it with the version it read, and says how that went; times are
//! durations on the caller's monotonic clock and wall-clock milliseconds
//! that are only written down.

use std::time::Duration;
use thiserror::Error;

/// How long a lease lasts, how long a leader keeps trying to renew it, and
/// how often everybody tries: client-go's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTiming {
    /// A record unchanged this long may be taken over.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops leading.
    pub renew_deadline: Duration,
    /// Between two attempts to take or renew the record.
    pub retry_period: Duration,
}

impl Default for ElectionTiming {
    fn default() -> Self {
        ElectionTiming {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Timings under which a leader could still be leading when another takes
/// over.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TimingError {
    /// The leader must give up before the record may be taken.
    #[error("the renew deadline ({renew_deadline:?}) must be shorter than the lease duration ({lease_duration:?}), or a leader that cannot renew still leads when another takes over")]
    DeadlineNotBelowDuration {
        /// The renew deadline given.
        renew_deadline: Duration,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// A leader must get more than one attempt to renew within its deadline.
    #[error("the retry period ({retry_period:?}) must be under the renew deadline ({renew_deadline:?}) by a fifth, so that a leader tries to renew more than once before it gives up")]
    RetryNotBelowDeadline {
        /// The retry period given.
        retry_period: Duration,
        /// The renew deadline given.
        renew_deadline: Duration,
    },
    /// Without a pause between attempts, candidates hammer the store.
    #[error("the retry period must be more than zero")]
    ZeroRetry,
    /// Kubernetes keeps the lease duration in whole seconds.
    #[error("the lease duration ({0:?}) must be a whole number of seconds, at least one")]
    WholeSeconds(Duration),
}

impl ElectionTiming {
    /// Refuses timings under which two could lead at once.
    pub fn validate(&self) -> Result<(), TimingError> {
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.is_zero() {
            return Err(TimingError::WholeSeconds(self.lease_duration));
        }
        if self.retry_period.is_zero() {
            return Err(TimingError::ZeroRetry);
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(TimingError::DeadlineNotBelowDuration {
                renew_deadline: self.renew_deadline,
                lease_duration: self.lease_duration,
            });
        }
        if self.retry_period.mul_f64(1.2) >= self.renew_deadline {
            return Err(TimingError::RetryNotBelowDeadline {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        Ok(())
    }
}

/// What the shared record says (a Kubernetes Lease's spec).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LeaderRecord {
    /// Who leads; `None` once released.
    pub holder: Option<String>,
    /// How long the record lasts unchanged, in whole seconds.
    pub lease_duration_secs: u32,
    /// Wall-clock milliseconds at which the holder took the record.
    pub acquire_ms: u64,
    /// Wall-clock milliseconds of the holder's last renewal.
    pub renew_ms: u64,
    /// How many times the record changed hands.
    pub transitions: u32,
    /// The job ran to its end under this record's last holder.
    pub finished: bool,
    /// The store's version of the record (a Lease's `resourceVersion`):
    /// every write changes it, so a renewal counts as a change even where
    /// the holder's clock did not move. Written records carry the version
    /// they were made from; the store sets the new one.
    pub version: String,
}

/// What a candidate or leader does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Create the record (there was none).
    Create(LeaderRecord),
    /// Replace the record that was read with this one.
    Update(LeaderRecord),
    /// Another leads; read again after the retry period.
    Wait {
        /// Who leads.
        holder: String,
        /// The earliest time at which the record may be taken if it does
        /// not change, on the caller's clock.
        free_at: Duration,
    },
    /// The job ran to its end under `holder`: nothing left to lead.
    Finished {
        /// The leader under which it finished.
        holder: Option<String>,
    },
}

/// One candidate's view of the election.
#[derive(Debug)]
pub struct Elector {
    identity: String,
    timing: ElectionTiming,
    /// The record last read and when it was first seen so.
    observed: Option<(LeaderRecord, Duration)>,
    /// When this candidate last wrote the record as its leader.
    renewed: Option<Duration>,
}

impl Elector {
    /// A candidate named `identity` (unique among the candidates: a pod's
    /// name).
    pub fn new(identity: impl Into<String>, timing: ElectionTiming) -> Self {
        Elector {
            identity: identity.into(),
            timing,
            observed: None,
            renewed: None,
        }
    }

    /// This candidate's name.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timings it runs by.
    pub fn timing(&self) -> ElectionTiming {
        self.timing
    }

    /// What to write, given the record just read (`None`: there is none)
    /// at `now`, wall clock `wall_ms`.
    pub fn next(&mut self, current: Option<&LeaderRecord>, now: Duration, wall_ms: u64) -> Next {
        let Some(current) = current else {
            self.observed = None;
            return Next::Create(self.taken(None, wall_ms));
        };
        if self.observed.as_ref().map(|(r, _)| r) != Some(current) {
            self.observed = Some((current.clone(), now));
        }
        if current.holder.as_deref() != Some(self.identity.as_str()) || current.finished {
            // Another took the record, or this one finished: whatever this
            // candidate thought, it does not lead.
            self.renewed = None;
        }
        if current.finished {
            return Next::Finished {
                holder: current.holder.clone(),
            };
        }
        match current.holder.as_deref() {
            Some(holder) if holder == self.identity => Next::Update(LeaderRecord {
                renew_ms: wall_ms,
                lease_duration_secs: self.duration_secs(),
                ..current.clone()
            }),
            Some(holder) => {
                let seen = self.observed.as_ref().map_or(now, |(_, at)| *at);
                let free_at = seen + Duration::from_secs(current.lease_duration_secs.into());
                if now < free_at {
                    Next::Wait {
                        holder: holder.to_string(),
                        free_at,
                    }
                } else {
                    Next::Update(self.taken(Some(current), wall_ms))
                }
            }
            None => Next::Update(self.taken(Some(current), wall_ms)),
        }
    }

    fn taken(&self, from: Option<&LeaderRecord>, wall_ms: u64) -> LeaderRecord {
        LeaderRecord {
            holder: Some(self.identity.clone()),
            lease_duration_secs: self.duration_secs(),
            acquire_ms: wall_ms,
            renew_ms: wall_ms,
            transitions: from.map_or(0, |r| r.transitions + 1),
            finished: false,
            version: from.map(|r| r.version.clone()).unwrap_or_default(),
        }
    }

    fn duration_secs(&self) -> u32 {
        u32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(u32::MAX)
    }

    /// The record was written as `written` at `now`: the attempt to write it
    /// began at `began` (a renewal counts from when it was sent, since the
    /// store may have applied it at any moment after).
    pub fn written(&mut self, written: LeaderRecord, began: Duration, now: Duration) {
        if written.holder.as_deref() == Some(self.identity.as_str()) && !written.finished {
            self.renewed = Some(began);
        } else {
            self.renewed = None;
        }
        self.observed = Some((written, now));
    }

    /// Whether this candidate leads at `now`: it renewed within the renew
    /// deadline.
    pub fn leads(&self, now: Duration) -> bool {
        self.renewed
            .is_some_and(|at| now < at + self.timing.renew_deadline)
    }

    /// When, without another renewal, it stops leading.
    pub fn leads_until(&self) -> Option<Duration> {
        self.renewed.map(|at| at + self.timing.renew_deadline)
    }

    /// The record to write when this leader steps down at `wall_ms`:
    /// released at once (a one-second lease), or, when the job ran to its
    /// end, marked finished under this leader's name. `None` when it does
    /// not lead.
    pub fn release(&self, now: Duration, wall_ms: u64, finished: bool) -> Option<LeaderRecord> {
        if !self.leads(now) {
            return None;
        }
        let (record, _) = self.observed.as_ref()?;
        Some(LeaderRecord {
            holder: finished.then(|| self.identity.clone()),
            lease_duration_secs: 1,
            renew_ms: wall_ms,
            finished,
            ..record.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn elector(identity: &str) -> Elector {
        Elector::new(identity, ElectionTiming::default())
    }

    /// Asks `e` what to write and, for a write, carries it out as a store
    /// would if nobody else wrote meanwhile.
    fn step(e: &mut Elector, store: &mut Option<LeaderRecord>, now: Duration) -> Next {
        let next = e.next(store.as_ref(), now, now.as_millis() as u64);
        if let Next::Create(r) | Next::Update(r) = &next {
            *store = Some(r.clone());
            e.written(r.clone(), now, now);
        }
        next
    }

    #[test]
    fn the_first_candidate_creates_the_record_and_the_second_waits_out_its_lease() {
        let (mut a, mut b) = (elector("a"), elector("b"));
        let mut store = None;
        assert!(matches!(
            step(&mut a, &mut store, Duration::ZERO),
            Next::Create(_)
        ));
        assert!(a.leads(Duration::ZERO));
        assert_eq!(
            step(&mut b, &mut store, S),
            Next::Wait {
                holder: "a".into(),
                free_at: 16 * S
            }
        );
        // a renews at 2 s: b sees the record change and waits from then.
        assert!(matches!(step(&mut a, &mut store, 2 * S), Next::Update(_)));
        assert_eq!(
            step(&mut b, &mut store, 3 * S),
            Next::Wait {
                holder: "a".into(),
                free_at: 18 * S
            }
        );
        // a stops renewing (it died): it no longer leads at its deadline,
        // 12 s, well before b may take over at 18 s.
        assert!(a.leads(11 * S) && !a.leads(12 * S));
        assert!(matches!(
            step(&mut b, &mut store, 17 * S),
            Next::Wait { .. }
        ));
        let Next::Update(taken) = step(&mut b, &mut store, 18 * S) else {
            panic!("b takes the record over once it is unchanged for the lease duration");
        };
        assert_eq!(taken.holder.as_deref(), Some("b"));
        assert_eq!(taken.transitions, 1);
        assert_eq!(taken.acquire_ms, 18_000);
        assert!(b.leads(18 * S));
    }

    #[test]
    fn a_renewal_counts_as_a_change_even_when_the_holders_clock_stood_still() {
        let mut b = elector("b");
        let held = |version: &str| LeaderRecord {
            holder: Some("a".into()),
            lease_duration_secs: 15,
            renew_ms: 7,
            version: version.into(),
            ..LeaderRecord::default()
        };
        b.next(Some(&held("1")), Duration::ZERO, 0);
        assert!(matches!(
            b.next(Some(&held("2")), 14 * S, 0),
            Next::Wait { free_at, .. } if free_at == 29 * S
        ));
        assert!(matches!(
            b.next(Some(&held("2")), 29 * S, 0),
            Next::Update(_)
        ));
    }

    #[test]
    fn expiry_is_judged_on_the_candidates_own_clock_not_the_holders_timestamps() {
        let mut b = elector("b");
        // The holder's wall clock is far behind: its renewal looks ancient.
        let held = LeaderRecord {
            holder: Some("a".into()),
            lease_duration_secs: 15,
            renew_ms: 1,
            ..LeaderRecord::default()
        };
        assert!(matches!(
            b.next(Some(&held), 100 * S, 10_000_000),
            Next::Wait { free_at, .. } if free_at == 115 * S
        ));
    }

    #[test]
    fn a_leader_that_finds_the_record_taken_stops_leading_at_once() {
        let mut a = elector("a");
        let mut store = None;
        step(&mut a, &mut store, Duration::ZERO);
        assert!(a.leads(S));
        let taken = LeaderRecord {
            holder: Some("b".into()),
            transitions: 1,
            ..store.clone().unwrap()
        };
        assert!(matches!(
            a.next(Some(&taken), 2 * S, 2_000),
            Next::Wait { .. }
        ));
        assert!(!a.leads(2 * S));
        assert_eq!(a.release(2 * S, 2_000, false), None);
    }

    #[test]
    fn a_failed_renewal_counts_from_the_last_one_that_was_written() {
        let mut a = elector("a");
        let mut store = None;
        step(&mut a, &mut store, Duration::ZERO);
        // Renewals at 2, 4, ... 8 s fail (the API does not answer).
        for at in [2, 4, 6, 8] {
            assert!(matches!(a.next(store.as_ref(), at * S, 0), Next::Update(_)));
        }
        assert!(a.leads(9 * S));
        assert!(!a.leads(10 * S));
        assert_eq!(a.leads_until(), Some(10 * S));
    }

    #[test]
    fn a_released_record_is_taken_at_once_and_a_finished_one_not_at_all() {
        let (mut a, mut b, mut c) = (elector("a"), elector("b"), elector("c"));
        let mut store = None;
        step(&mut a, &mut store, Duration::ZERO);
        step(&mut b, &mut store, S);
        store = a.release(2 * S, 2_000, false);
        assert_eq!(store.as_ref().unwrap().holder, None);
        let Next::Update(taken) = step(&mut b, &mut store, 3 * S) else {
            panic!("a released record is free");
        };
        assert_eq!((taken.holder.as_deref(), taken.transitions), (Some("b"), 1));
        store = b.release(4 * S, 4_000, true);
        assert_eq!(
            c.next(store.as_ref(), 5 * S, 5_000),
            Next::Finished {
                holder: Some("b".into())
            }
        );
        // b itself, asked again, knows it no longer leads.
        assert!(matches!(
            b.next(store.as_ref(), 5 * S, 5_000),
            Next::Finished { .. }
        ));
        assert!(!b.leads(5 * S));
    }

    #[test]
    fn a_restarted_leader_of_the_same_name_renews_its_own_record() {
        let mut store = None;
        step(&mut elector("a"), &mut store, Duration::ZERO);
        let mut again = elector("a");
        let Next::Update(renewed) = step(&mut again, &mut store, S) else {
            panic!("the record is its own");
        };
        assert_eq!(renewed.transitions, 0);
        assert!(again.leads(S));
    }

    #[test]
    fn timings_under_which_two_could_lead_are_refused() {
        assert_eq!(ElectionTiming::default().validate(), Ok(()));
        let t = |lease, deadline, retry| ElectionTiming {
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(deadline),
            retry_period: Duration::from_millis(retry),
        };
        assert!(matches!(
            t(15_000, 15_000, 2_000).validate(),
            Err(TimingError::DeadlineNotBelowDuration { .. })
        ));
        assert!(matches!(
            t(15_000, 10_000, 9_000).validate(),
            Err(TimingError::RetryNotBelowDeadline { .. })
        ));
        assert!(matches!(
            t(1_500, 1_000, 100).validate(),
            Err(TimingError::WholeSeconds(_))
        ));
    }
}
