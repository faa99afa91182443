//! Token bucket for rate-limited sources, sans-IO: the caller passes `now`.

use std::time::{Duration, Instant};

/// The longest wait [`RateLimiter::acquire`] asks for.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// Limits a source to `per_second` records on average, with bursts of at
/// most `burst` after a stall.
///
/// A wait is at most [`MAX_WAIT`]: at a rate so low that the next record is
/// further away, the caller waits again.
#[derive(Debug)]
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// `burst` bounds how far a source may run ahead after a stall. A rate
    /// that is not positive (zero after dividing a tiny rate among
    /// subtasks, or NaN) grants nothing.
    pub fn new(per_second: f64, burst: usize, now: Instant) -> Self {
        RateLimiter {
            per_second: per_second.max(0.0),
            burst: burst.max(1) as f64,
            tokens: 0.0,
            last: now,
        }
    }

    /// Records that may be emitted now, at most `want`; when none may, how
    /// long to wait for the next one.
    pub fn acquire(&mut self, want: usize, now: Instant) -> Result<usize, Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        let granted = (self.tokens.floor() as usize).min(want);
        if granted == 0 {
            let missing = 1.0 - self.tokens;
            let wait = Duration::try_from_secs_f64(missing / self.per_second);
            return Err(wait.map_or(MAX_WAIT, |wait| wait.min(MAX_WAIT)));
        }
        self.tokens -= granted as f64;
        Ok(granted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_the_rate_over_time_and_says_how_long_to_wait() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1000.0, 100, t0);
        assert_eq!(r.acquire(10, t0), Err(Duration::from_millis(1)));
        assert_eq!(r.acquire(100, t0 + Duration::from_millis(50)), Ok(50));
        // A long stall is capped at the burst.
        assert_eq!(r.acquire(1000, t0 + Duration::from_secs(10)), Ok(100));
        let mut total = 0;
        for ms in 1..=1000 {
            total += r
                .acquire(
                    4096,
                    t0 + Duration::from_secs(10) + Duration::from_millis(ms),
                )
                .unwrap_or(0);
        }
        assert_eq!(total, 1000);
    }

    #[test]
    fn extreme_rates_wait_at_most_max_wait_and_never_panic() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(3600);
        for rate in [f64::MIN_POSITIVE, 1e-300, 0.0, -1.0, f64::NAN] {
            let mut r = RateLimiter::new(rate, 100, t0);
            assert_eq!(r.acquire(10, t0), Err(MAX_WAIT), "{rate}");
            assert_eq!(r.acquire(10, later), Err(MAX_WAIT), "{rate}");
        }
        for rate in [f64::MAX, f64::INFINITY] {
            let mut r = RateLimiter::new(rate, 100, t0);
            let first = r.acquire(10, t0);
            assert!(
                matches!(first, Ok(10) | Err(Duration::ZERO)),
                "{rate}: {first:?}"
            );
            assert_eq!(r.acquire(1000, later), Ok(100), "{rate}");
        }
        // One record an hour: waits of MAX_WAIT until the hour is up.
        let mut r = RateLimiter::new(1.0 / 3600.0, 1, t0);
        assert_eq!(r.acquire(1, t0), Err(MAX_WAIT));
        assert_eq!(r.acquire(1, later + Duration::from_secs(1)), Ok(1));
    }
}
