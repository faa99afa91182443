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
    /// `initial`, then times `multiplier` per restart, capped at `max`
    /// (also where the product overflows).
    ExponentialBackoff {
        /// Wait before the first restart.
        initial: Duration,
        /// The longest wait.
        max: Duration,
        /// Growth per restart; values below 1 (and NaN) count as 1.
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
                let exponent = i32::try_from(restart.saturating_sub(1)).unwrap_or(i32::MAX);
                let factor = multiplier.max(1.0).powi(exponent);
                // Infinite or past `Duration::MAX`: `max`.
                Duration::try_from_secs_f64(initial.as_secs_f64() * factor)
                    .map_or(max, |delay| delay.min(max))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn backoff(initial: Duration, max: Duration, multiplier: f64) -> RestartStrategy {
        RestartStrategy::ExponentialBackoff {
            initial,
            max,
            multiplier,
            max_attempts: u32::MAX,
        }
    }

    #[test]
    fn extreme_backoffs_stay_between_zero_and_max() {
        let (ms, max) = (Duration::from_millis, Duration::from_secs(60));
        for (initial, multiplier) in [
            (Duration::MAX, 2.0),
            (ms(10), f64::MAX),
            (ms(10), f64::INFINITY),
            (Duration::ZERO, f64::INFINITY),
            (ms(10), f64::NAN),
            (ms(10), -3.0),
        ] {
            for restart in [1, 2, 64, 1 << 31, u32::MAX] {
                let delay = backoff(initial, max, multiplier).delay(restart);
                assert!(
                    delay.is_some_and(|d| d <= max),
                    "{initial:?} x {multiplier} at {restart}: {delay:?}"
                );
            }
        }
        // Past 2^31 restarts a doubling delay does not wrap back to small.
        assert_eq!(backoff(ms(10), max, 2.0).delay(u32::MAX), Some(max));
        // A NaN multiplier counts as 1.
        assert_eq!(backoff(ms(10), max, f64::NAN).delay(5), Some(ms(10)));
    }

    proptest! {
        #[test]
        fn any_backoff_is_at_most_max(
            initial in (any::<u64>(), 0..1_000_000_000u32),
            max in (any::<u64>(), 0..1_000_000_000u32),
            multiplier in any::<f64>(),
            restart in any::<u32>(),
        ) {
            let (initial, max) = (Duration::new(initial.0, initial.1), Duration::new(max.0, max.1));
            let delay = backoff(initial, max, multiplier).delay(restart);
            prop_assert!(delay.is_some_and(|d| d <= max));
        }
    }
}
