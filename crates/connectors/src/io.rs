//! The runtime connectors do their IO on: a small pool of threads of its
//! own, so that a slow listing or read never stalls the actor threads, and
//! its object store clients live as long as the process.

use std::sync::LazyLock;
use tokio::runtime::Runtime;

static IO: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tidemark-io")
        .enable_all()
        .build()
        .expect("the connectors' IO runtime starts")
});

/// Runs `future` on the IO runtime; the result comes back through the
/// returned future, which any runtime (or none) may await.
#[cfg(any(feature = "files", feature = "postgres"))]
pub(crate) fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    IO.spawn(future)
}

/// Runs `call`, which blocks (a librdkafka request), on the IO runtime's
/// blocking threads.
#[cfg(feature = "kafka")]
pub(crate) fn spawn_blocking<F, R>(call: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    IO.spawn_blocking(call)
}

/// Runs `future` on the IO runtime and waits for it: sinks' calls are
/// synchronous.
#[cfg(any(feature = "files", feature = "postgres"))]
pub(crate) fn wait<F>(future: F) -> Result<F::Output, tidemark_core::UserError>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    futures::executor::block_on(spawn(future))
        .map_err(|e| format!("a connector's IO task failed: {e}").into())
}
