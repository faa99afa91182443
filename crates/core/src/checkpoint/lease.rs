//! How a run leases its job directory: the options and their bounds. The
//! lease itself, objects in the job directory, is the storage crate's
//! (`tidemark_storage::lease`).

use std::time::{Duration, Instant};

/// How long a lease lasts without renewal, unless configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The shortest time to live: renewal, every fifth of it, must fit a slow
/// store's round trip.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The longest: a crashed run's directory is free again within a day.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);

/// How a run leases its directory.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseConfig {
    /// Without renewal, the lease expires this long after the last one.
    pub ttl: Duration,
    /// Take the directory even from a live-looking holder: the user knows
    /// its run is dead.
    pub take_over: bool,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            ttl: DEFAULT_TTL,
            take_over: false,
        }
    }
}

/// How often a run renews its lease of time to live `ttl`: a fifth of it,
/// so that a renewal whose write takes up to 30 % of it still lands
/// before the holder fences itself, at half.
fn renew_every(ttl: Duration) -> Duration {
    ttl / 5
}

/// How soon a failed renewal is tried again (sooner if renewals are).
pub const RENEW_RETRY: Duration = Duration::from_secs(1);

/// What a renewal came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease object was written.
    Landed,
    /// Storage failed: the lease may still be held.
    Failed,
    /// A newer run took the directory over: the lease is lost for good.
    TakenOver,
}

/// When the renewal after one that started at `started` and came to
/// `renewal` at `now` starts, if any: on a beat from each landed one's
/// start, so that a slow write does not push the next one back; soon
/// after a failure; never after a takeover.
pub fn next_renewal(
    ttl: Duration,
    started: Instant,
    now: Instant,
    renewal: Renewal,
) -> Option<Instant> {
    let every = renew_every(ttl);
    match renewal {
        Renewal::Landed => Some(started + every),
        Renewal::Failed => Some(now + every.min(RENEW_RETRY)),
        Renewal::TakenOver => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_keep_their_beat_retry_soon_and_end_with_a_takeover() {
        let ttl = Duration::from_secs(30);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // A quick write: the next one a fifth of the TTL after the start.
        assert_eq!(
            next_renewal(ttl, t0, t0 + s(1), Renewal::Landed),
            Some(t0 + s(6))
        );
        // A write as slow as the beat: the next one starts at once.
        assert_eq!(
            next_renewal(ttl, t0, t0 + s(6), Renewal::Landed),
            Some(t0 + s(6))
        );
        assert_eq!(
            next_renewal(ttl, t0, t0 + s(2), Renewal::Failed),
            Some(t0 + s(3))
        );
        // A short TTL retries on its own beat, not a second later.
        let short = Duration::from_millis(1_000);
        let ms = Duration::from_millis;
        assert_eq!(
            next_renewal(short, t0, t0, Renewal::Failed),
            Some(t0 + ms(200))
        );
        assert_eq!(next_renewal(ttl, t0, t0 + s(1), Renewal::TakenOver), None);
    }
}
