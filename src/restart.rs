//! Restart strategies: how long the supervisor waits before the n-th restart
//! of a failed job, and when it gives up.

use std::time::Duration;

/// How a job recovers from a failure: Flink's `restart-strategy.type`
/// (`none`, `fixed-delay`, `exponential-delay`). Every restart counts
/// against `max_attempts`; unlike Flink's exponential delay, the backoff
/// never resets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RestartStrategy {
    /// A failure fails the job.
    None,
    /// The same delay before every restart.
    FixedDelay {
        /// Wait before each restart.
        delay: Duration,
        /// Restarts before the job gives up.
        max_attempts: u32,
    },
    /// `initial`, then times `multiplier` per restart, capped at `max`.
    ExponentialBackoff {
        /// Wait before the first restart.
        initial: Duration,
        /// The longest wait.
        max: Duration,
        /// Growth per restart; values below 1 count as 1.
        multiplier: f64,
        /// Restarts before the job gives up.
        max_attempts: u32,
    },
}

/// A few quick restarts: enough to ride out a transient failure, few enough
/// that a failure that comes back every time fails the job soon.
impl Default for RestartStrategy {
    fn default() -> Self {
        RestartStrategy::FixedDelay {
            delay: Self::DEFAULT_DELAY,
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
        }
    }
}

impl RestartStrategy {
    /// The default strategy's restarts; the `tidemark` command adds its
    /// injected failures to it.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
    /// The default strategy's wait before a restart.
    pub const DEFAULT_DELAY: Duration = Duration::from_millis(10);

    /// Delay before restart number `restart` (1 for the first), or `None`
    /// once the attempts are used up.
    pub fn delay(&self, restart: u32) -> Option<Duration> {
        match *self {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay {
                delay,
                max_attempts,
            } => (restart <= max_attempts).then_some(delay),
            RestartStrategy::ExponentialBackoff {
                initial,
                max,
                multiplier,
                max_attempts,
            } => (restart <= max_attempts).then(|| {
                let factor = multiplier.max(1.0).powi(restart.saturating_sub(1) as i32);
                initial.mul_f64(factor).min(max)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_delay_gives_up_after_max_attempts() {
        let s = RestartStrategy::FixedDelay {
            delay: Duration::from_millis(10),
            max_attempts: 2,
        };
        assert_eq!(s.delay(1), Some(Duration::from_millis(10)));
        assert_eq!(s.delay(2), Some(Duration::from_millis(10)));
        assert_eq!(s.delay(3), None);
        assert_eq!(RestartStrategy::None.delay(1), None);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let s = RestartStrategy::ExponentialBackoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            max_attempts: 5,
        };
        let delays: Vec<_> = (1..=6).map(|n| s.delay(n).map(|d| d.as_millis())).collect();
        assert_eq!(
            delays,
            [Some(10), Some(20), Some(40), Some(50), Some(50), None]
        );
    }
}
