//! The clock the shells hand to the core: monotonic for timers, wall time
//! for barrier timestamps. A leaf, so that every actor reads the same one.

use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tidemark_core::checkpoint::coordinator::Now;

/// The time now, as the core's machines take it.
pub(crate) fn now() -> Now {
    Now {
        instant: Instant::now(),
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}
