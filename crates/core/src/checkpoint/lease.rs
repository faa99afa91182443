//! How a run leases its job directory: the options and their bounds. The
//! lease itself, objects in the job directory, is the storage crate's
//! (`tidemark_storage::lease`).

use std::time::Duration;

/// How long a lease lasts without renewal, unless configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The shortest time to live: renewal, every third of it, must fit a slow
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
