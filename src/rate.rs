//! Token bucket for rate-limited sources, sans-IO: the caller passes `now`.

use std::time::{Duration, Instant};

/// Limits a source to `per_second` records on average, with bursts of at
/// most `burst` after a stall.
#[derive(Debug)]
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// `burst` bounds how far a source may run ahead after a stall.
    pub fn new(per_second: f64, burst: usize, now: Instant) -> Self {
        assert!(per_second > 0.0, "rate must be positive");
        RateLimiter {
            per_second,
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
            return Err(Duration::from_secs_f64(missing / self.per_second));
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
}
