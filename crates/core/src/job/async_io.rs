//! Async operators: a stream's records enriched by a user async function,
//! as Flink's `AsyncDataStream.orderedWait` and `unorderedWait`.

use super::stream::{plain_route, same, Stream};
use crate::dataflow::async_io::{AsyncFunction, AsyncStep, AsyncWait};
use crate::model::batch::Data;
use std::sync::Arc;

impl<T: Data> Stream<T> {
    /// Calls an async function for every record in a new operator, with
    /// up to `settings.capacity` records in flight per subtask, and emits
    /// their results as `settings` say (in input order, or as they
    /// complete). `open` makes each subtask's function (with its own
    /// clients). The operator is fed over forward edges where the
    /// parallelism allows and rebalance otherwise; it holds its records at
    /// a checkpoint and requests them again after a restore.
    pub fn async_wait<O, F>(
        self,
        name: &str,
        settings: AsyncWait,
        open: impl Fn() -> F + Send + Sync + 'static,
    ) -> Stream<O>
    where
        O: Data,
        F: AsyncFunction<T, O>,
    {
        let job = self.job.clone();
        let (op, out) = job.step_operator(name, vec![same()], move |ctx, next| {
            let runtime = ctx.async_runtime.clone();
            Box::new(AsyncStep::new(Arc::new(open()), settings, runtime, next))
        });
        job.connect_edges(&self.parts, op, 0, None, plain_route);
        out
    }
}
