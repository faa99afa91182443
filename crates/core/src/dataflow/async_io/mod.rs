//! Async I/O, as Flink's `AsyncDataStream`: an operator that calls a user
//! async function per record (a request to a database or a service), with
//! many requests in flight, a timeout and retries, and emits the results in
//! input order or as they complete ([`queue`]). The requests run as futures
//! on the subtask's own executor, which the runtime hands over in
//! [`AsyncRuntime`]; their completions wake the subtask, which then polls
//! the operator. A full operator takes no more input, so its input channels
//! stop granting credit. The records whose results have not left are
//! operator state: a restore requests them again.

pub mod queue;
mod step;

pub use queue::OutputMode;
pub use step::AsyncStep;

use crate::dataflow::error::UserError;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A future the subtask's executor runs: on the subtask's thread, so it
/// need not be `Send`.
pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T> + 'static>>;

/// A user function that enriches a record with the results of a request
/// (Flink's `AsyncFunction`). The subtask shares one instance among all its
/// requests: clone clients into the future.
pub trait AsyncFunction<I, O>: Send + Sync + 'static {
    /// Requests `record`'s results; an error is retried as the operator's
    /// [`AsyncRetry`] says, and fails the job once the retries are spent.
    fn invoke(&self, record: I) -> LocalFuture<Result<Vec<O>, UserError>>;

    /// `record`'s request, with its retries, outlived the operator's
    /// timeout: what to emit instead. By default the job fails, as in
    /// Flink.
    fn timeout(&self, record: &I) -> Result<Vec<O>, UserError> {
        let _ = record;
        Err("an async request timed out".into())
    }
}

/// How a failed request is retried (Flink's `AsyncRetryStrategy`), within
/// the operator's timeout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AsyncRetry {
    /// A failed request fails the job.
    None,
    /// Up to `retries` more tries, `delay` apart.
    FixedDelay {
        /// Tries after the first.
        retries: u32,
        /// Between two tries.
        delay: Duration,
    },
    /// Up to `retries` more tries, the delay growing from `initial` by
    /// `multiplier` each time, to at most `max`.
    ExponentialBackoff {
        /// Tries after the first.
        retries: u32,
        /// Before the second try.
        initial: Duration,
        /// The longest delay.
        max: Duration,
        /// The growth of the delay per try.
        multiplier: f64,
    },
}

impl AsyncRetry {
    /// The delay before the next try after `failed` tries failed, or
    /// `None` when they are spent.
    pub fn delay(&self, failed: u32) -> Option<Duration> {
        match *self {
            AsyncRetry::None => None,
            AsyncRetry::FixedDelay { retries, delay } => (failed <= retries).then_some(delay),
            AsyncRetry::ExponentialBackoff {
                retries,
                initial,
                max,
                multiplier,
            } => (failed <= retries).then(|| {
                let grown = initial.as_secs_f64() * multiplier.powi(failed as i32 - 1);
                Duration::try_from_secs_f64(grown).map_or(max, |d| d.min(max))
            }),
        }
    }
}

/// An async operator's settings: the output mode, how many records it
/// holds at most (in flight, or done and waiting to leave), how long a
/// record's requests may take with their retries, and the retries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AsyncWait {
    /// In which order results leave.
    pub mode: OutputMode,
    /// Records held at once; at least 1.
    pub capacity: usize,
    /// From a record's first try to its last result.
    pub timeout: Duration,
    /// How failed tries are retried.
    pub retry: AsyncRetry,
}

impl AsyncWait {
    /// Results in input order (Flink's `orderedWait`).
    pub fn ordered(timeout: Duration, capacity: usize) -> Self {
        AsyncWait {
            mode: OutputMode::Ordered,
            capacity,
            timeout,
            retry: AsyncRetry::None,
        }
    }

    /// Results as they complete, never across a watermark (Flink's
    /// `unorderedWait`).
    pub fn unordered(timeout: Duration, capacity: usize) -> Self {
        AsyncWait {
            mode: OutputMode::Unordered,
            ..Self::ordered(timeout, capacity)
        }
    }

    /// Retries failed tries as `retry` says (Flink's `...WithRetry`).
    pub fn with_retry(self, retry: AsyncRetry) -> Self {
        AsyncWait { retry, ..self }
    }
}

/// The subtask's executor, as the runtime hands it to async operators:
/// what runs their futures, their clock's sleeps, and what wakes the
/// subtask when a request completes. The waker is set once the subtask
/// runs.
#[derive(Clone)]
pub struct AsyncRuntime {
    spawn: Arc<dyn Fn(LocalFuture<()>) + Send + Sync>,
    sleep: Arc<dyn Fn(Duration) -> LocalFuture<()> + Send + Sync>,
    waker: Arc<OnceLock<Arc<dyn Fn() + Send + Sync>>>,
}

impl AsyncRuntime {
    /// An executor that runs futures with `spawn` and sleeps with `sleep`.
    pub fn new(
        spawn: impl Fn(LocalFuture<()>) + Send + Sync + 'static,
        sleep: impl Fn(Duration) -> LocalFuture<()> + Send + Sync + 'static,
    ) -> Self {
        AsyncRuntime {
            spawn: Arc::new(spawn),
            sleep: Arc::new(sleep),
            waker: Arc::new(OnceLock::new()),
        }
    }

    /// Sets what wakes the subtask; once.
    pub fn set_waker(&self, wake: impl Fn() + Send + Sync + 'static) {
        // A second subtask never shares the runtime of a first.
        let _ = self.waker.set(Arc::new(wake));
    }

    fn wake(&self) {
        if let Some(wake) = self.waker.get() {
            wake();
        }
    }
}

impl std::fmt::Debug for AsyncRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AsyncRuntime")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_spent_after_their_count_and_backoff_grows_to_its_max() {
        let ms = Duration::from_millis;
        assert_eq!(AsyncRetry::None.delay(1), None);
        let fixed = AsyncRetry::FixedDelay {
            retries: 2,
            delay: ms(5),
        };
        assert_eq!(
            (1..=3).map(|n| fixed.delay(n)).collect::<Vec<_>>(),
            [Some(ms(5)), Some(ms(5)), None]
        );
        let backoff = AsyncRetry::ExponentialBackoff {
            retries: 4,
            initial: ms(10),
            max: ms(30),
            multiplier: 2.0,
        };
        assert_eq!(
            (1..=5).map(|n| backoff.delay(n)).collect::<Vec<_>>(),
            [Some(ms(10)), Some(ms(20)), Some(ms(30)), Some(ms(30)), None]
        );
    }
}
