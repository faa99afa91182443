//! The async operator's step: the head of its own operator's chain, which
//! issues requests on the subtask's executor and lets results and
//! watermarks go as its [`AsyncQueue`] releases them.

use super::queue::{AsyncQueue, Released, RequestId};
use super::{AsyncFunction, AsyncRuntime, AsyncWait};
use crate::checkpoint::entries::ASYNC_IN_FLIGHT;
use crate::dataflow::error::{TaskError, UserError};
use crate::dataflow::operator::{Downstream, Outgoing, Output, Step};
use crate::model::batch::Data;
use crate::model::ids::CheckpointId;
use crate::state::snapshot::{RestoreState, TaskSnapshot};
use crate::time::Millis;
use futures::future::{select, AbortHandle, Abortable, Either};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// How a record's requests ended.
enum Outcome<O> {
    Done(Result<Vec<O>, UserError>),
    TimedOut,
}

/// Completions the executor hands the subtask.
type Completions<O> = Arc<Mutex<Vec<(RequestId, Outcome<O>)>>>;

/// Runs [`AsyncFunction`]s per record; see the module's documentation.
pub struct AsyncStep<I, O> {
    function: Arc<dyn AsyncFunction<I, O>>,
    settings: AsyncWait,
    runtime: AsyncRuntime,
    queue: AsyncQueue<I, O>,
    /// Records taken while the queue was full, requested as it frees: at
    /// most a batch, as a full step takes no more input.
    waiting: VecDeque<I>,
    completions: Completions<O>,
    /// Requests in flight, to cancel when the step goes away.
    aborts: FxHashMap<RequestId, AbortHandle>,
    /// Watermarks released, for the shell to send on.
    released_watermarks: Vec<u64>,
    input_ended: bool,
    next: Output<O>,
}

impl<I: Data, O: Data> AsyncStep<I, O> {
    /// `function` run as `settings` say on `runtime`, feeding `next`.
    pub fn new(
        function: Arc<dyn AsyncFunction<I, O>>,
        settings: AsyncWait,
        runtime: AsyncRuntime,
        next: Output<O>,
    ) -> Self {
        AsyncStep {
            function,
            settings,
            runtime,
            queue: AsyncQueue::new(settings.mode, settings.capacity),
            waiting: VecDeque::new(),
            completions: Arc::default(),
            aborts: FxHashMap::default(),
            released_watermarks: Vec::new(),
            input_ended: false,
            next,
        }
    }

    /// Requests what waits, as far as the queue has room.
    fn issue_waiting(&mut self) {
        while self.queue.has_room() {
            let Some(record) = self.waiting.pop_front() else {
                return;
            };
            let id = self.queue.push(record.clone());
            let (abort, registration) = AbortHandle::new_pair();
            self.aborts.insert(id, abort);
            let request = request(
                self.function.clone(),
                record,
                self.settings,
                self.runtime.clone(),
            );
            let (completions, runtime) = (self.completions.clone(), self.runtime.clone());
            (self.runtime.spawn)(Box::pin(async move {
                if let Ok(outcome) = Abortable::new(request, registration).await {
                    let mut done = completions.lock().unwrap_or_else(PoisonError::into_inner);
                    done.push((id, outcome));
                    // The first completion since the last poll wakes it.
                    if done.len() == 1 {
                        drop(done);
                        runtime.wake();
                    }
                }
            }));
        }
    }

    /// Takes in the completions, requests what waits, and emits what the
    /// queue releases.
    fn poll(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        let done = std::mem::take(
            &mut *self
                .completions
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (id, outcome) in done {
            self.aborts.remove(&id);
            let results = match outcome {
                Outcome::Done(results) => results.map_err(TaskError::Async)?,
                Outcome::TimedOut => match self.queue.input(id) {
                    Some(record) => self.function.timeout(record).map_err(TaskError::Async)?,
                    None => continue,
                },
            };
            self.queue.complete(id, results);
        }
        self.issue_waiting();
        self.emit_released(out)
    }

    fn emit_released(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        let released: Vec<Released<O>> = self.queue.take_released().collect();
        for item in released {
            match item {
                Released::Results(mut results) => self.next.push_all(&mut results),
                Released::Watermark(watermark) => {
                    self.next.advance_watermark(watermark, out)?;
                    self.released_watermarks.push(watermark);
                }
            }
        }
        if self.input_ended && self.drained() {
            // Once: what the end of input waited for is out.
            self.input_ended = false;
            return self.next.end_input(out);
        }
        self.next.flush(out)
    }

    fn drained(&self) -> bool {
        self.queue.is_empty() && self.waiting.is_empty()
    }
}

/// One record's tries, all within the timeout, which the executor's clock
/// measures (the core reads none).
async fn request<I: Data, O: 'static>(
    function: Arc<dyn AsyncFunction<I, O>>,
    record: I,
    settings: AsyncWait,
    runtime: AsyncRuntime,
) -> Outcome<O> {
    let deadline = (runtime.sleep)(settings.timeout);
    let tries = Box::pin(tries(function, record, settings, runtime));
    match select(tries, deadline).await {
        Either::Left((outcome, _)) => outcome,
        Either::Right(_) => Outcome::TimedOut,
    }
}

/// The first try, and retries after failures as the settings say.
async fn tries<I: Data, O: 'static>(
    function: Arc<dyn AsyncFunction<I, O>>,
    record: I,
    settings: AsyncWait,
    runtime: AsyncRuntime,
) -> Outcome<O> {
    let mut failed = 0;
    loop {
        let error = match function.invoke(record.clone()).await {
            Ok(results) => return Outcome::Done(Ok(results)),
            Err(error) => error,
        };
        failed += 1;
        match settings.retry.delay(failed) {
            Some(delay) => (runtime.sleep)(delay).await,
            None => return Outcome::Done(Err(error)),
        }
    }
}

impl<I, O> Drop for AsyncStep<I, O> {
    fn drop(&mut self) {
        for abort in self.aborts.values() {
            abort.abort();
        }
    }
}

impl<I: Data, O: Data> Downstream<I> for AsyncStep<I, O> {
    fn push(&mut self, record: I) {
        self.waiting.push_back(record);
        self.issue_waiting();
    }
}

impl<I: Data, O: Data> Step for AsyncStep<I, O> {
    fn flush(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.emit_released(out)
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.input_ended = true;
        self.emit_released(out)
    }

    /// The records whose results have not left go into the snapshot, each
    /// encoded on its own so that a rescale can deal them out.
    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
        snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError> {
        let encode = |record: &I| {
            rmp_serde::to_vec(record)
                .map(serde_bytes::ByteBuf::from)
                .map_err(|e| {
                    TaskError::Protocol(format!("cannot encode a record of an async operator: {e}"))
                })
        };
        let held = (self.queue.inputs().into_iter())
            .chain(self.waiting.iter())
            .map(encode)
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = rmp_serde::to_vec(&held).map_err(|e| {
            TaskError::Protocol(format!("cannot encode the async operator's records: {e}"))
        })?;
        snapshot.operator.insert(ASYNC_IN_FLIGHT.into(), bytes);
        self.next.snapshot(checkpoint, out, snapshot)
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        self.next.notify_complete(checkpoint)
    }

    /// The records held at the snapshot are requested again, ahead of any
    /// new input.
    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
        let malformed = |e: rmp_serde::decode::Error| {
            TaskError::Protocol(format!("malformed records of an async operator: {e}"))
        };
        if let Some(bytes) = state.operator.get(ASYNC_IN_FLIGHT) {
            let held: Vec<serde_bytes::ByteBuf> =
                rmp_serde::from_slice(bytes).map_err(malformed)?;
            for record in held {
                self.waiting
                    .push_back(rmp_serde::from_slice(&record).map_err(malformed)?);
            }
        }
        self.next.restore(state)
    }

    fn advance_watermark(&mut self, watermark: u64, out: &mut Outgoing) -> Result<(), TaskError> {
        self.queue.watermark(watermark);
        self.emit_released(out)
    }

    fn advance_processing_time(
        &mut self,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError> {
        self.next.advance_processing_time(now, out)
    }

    fn poll_async(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.poll(out)
    }

    fn input_blocked(&self) -> bool {
        !self.waiting.is_empty() || !self.queue.has_room()
    }

    fn in_flight(&self) -> bool {
        !self.drained()
    }

    fn take_watermarks(&mut self, watermarks: &mut Vec<u64>) {
        watermarks.append(&mut self.released_watermarks);
    }

    fn holds_watermarks(&self) -> bool {
        true
    }
}
