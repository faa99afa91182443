//! Windows on a keyed stream: a keyed operator whose function is the
//! window operator.

use super::window_operator::{LateData, WindowConfig, WindowOperator};
use super::{KeyedStream, Stream};
use crate::dataflow::operator::Collector;
use crate::model::batch::Data;
use crate::state::Key;
use crate::time::{AggregateFunction, TimeWindow, Timestamped, WindowAssigner};
use std::sync::Arc;
use std::time::Duration;

impl<K: Key, T: Data + Timestamped> KeyedStream<K, T> {
    /// Groups each key's records into the windows of `assigner`.
    pub fn window(self, assigner: WindowAssigner) -> WindowedStream<K, T> {
        WindowedStream {
            keyed: self,
            assigner,
            settings: WindowConfig::default(),
        }
    }
}

/// A keyed stream cut into windows, waiting for its aggregation.
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    assigner: WindowAssigner,
    settings: WindowConfig,
}

impl<K: Key, T: Data + Timestamped> WindowedStream<K, T> {
    /// Keeps event-time windows open for late records this long after their
    /// end (default 0); each late record fires its window again.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.settings.allowed_lateness = u64::try_from(lateness.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Also fires every open event-time window every `every` of processing
    /// time (at least 1 ms), before the watermark fires it for good.
    pub fn early_firing(mut self, every: Duration) -> Self {
        self.settings.early_firing =
            Some(u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1));
        self
    }

    /// Aggregates each window with `aggregate` and emits, when it fires,
    /// what `emit` makes of the key, the window and the result. Records too
    /// late for every window are dropped and counted.
    pub fn aggregate<A, O, E>(self, name: &str, aggregate: A, emit: E) -> Stream<O>
    where
        A: AggregateFunction<T>,
        O: Data,
        E: Fn(&K, &TimeWindow, A::Result, &mut Collector<'_, O>) + Send + Sync + 'static,
    {
        self.build(name, aggregate, emit, None)
    }

    /// As [`aggregate`](Self::aggregate), with the late records handed to
    /// `late`, whose output joins the window results (a late-data output).
    pub fn aggregate_with_late_data<A, O, E, L>(
        self,
        name: &str,
        aggregate: A,
        emit: E,
        late: L,
    ) -> Stream<O>
    where
        A: AggregateFunction<T>,
        O: Data,
        E: Fn(&K, &TimeWindow, A::Result, &mut Collector<'_, O>) + Send + Sync + 'static,
        L: Fn(T, &mut Collector<'_, O>) + Send + Sync + 'static,
    {
        self.build(name, aggregate, emit, Some(Arc::new(late)))
    }

    fn build<A, O, E>(
        self,
        name: &str,
        aggregate: A,
        emit: E,
        late: Option<LateData<T, O>>,
    ) -> Stream<O>
    where
        A: AggregateFunction<T>,
        O: Data,
        E: Fn(&K, &TimeWindow, A::Result, &mut Collector<'_, O>) + Send + Sync + 'static,
    {
        let WindowedStream {
            keyed,
            assigner,
            settings,
        } = self;
        let (aggregate, emit) = (Arc::new(aggregate), Arc::new(emit));
        keyed.process(name, move |states| {
            WindowOperator::open(
                states,
                assigner,
                settings,
                aggregate.clone(),
                emit.clone(),
                late.clone(),
            )
        })
    }
}
