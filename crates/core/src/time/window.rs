//! Windows on keyed streams (Flink's `WindowOperator`): tumbling, sliding
//! and session windows in event or processing time, aggregated
//! incrementally. A key's open windows and their accumulators are one keyed
//! value, their firing and cleanup times keyed timers or timers that value
//! implies: nothing about a window is special to checkpoints, rescaling or
//! either backend.

use super::timers::TimeDomain;
use crate::model::batch::Data;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A window of time, `[start, end)` in ms (Flink's `TimeWindow`; starts may
/// be negative, as in Flink, for sliding windows over the first timestamps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TimeWindow {
    /// First timestamp in the window.
    pub start: i64,
    /// First timestamp after it.
    pub end: i64,
}

impl TimeWindow {
    /// The largest timestamp in the window: when it fires.
    pub fn max_timestamp(&self) -> u64 {
        u64::try_from(self.end - 1).expect("a window holding a timestamp ends after 0")
    }

    /// Whether the two overlap or touch, so that sessions merge.
    pub fn intersects(&self, other: &TimeWindow) -> bool {
        self.start <= other.end && self.end >= other.start
    }

    /// The smallest window covering both.
    pub fn cover(&self, other: &TimeWindow) -> TimeWindow {
        TimeWindow {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// How records are put in windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    /// Fixed windows of `size` ms, starting at multiples of it.
    Tumbling {
        /// Length, ms.
        size: i64,
    },
    /// Windows of `size` ms starting at every multiple of `slide` ms.
    Sliding {
        /// Length, ms.
        size: i64,
        /// Distance between starts, ms.
        slide: i64,
    },
    /// A record opens `[ts, ts + gap)`; a key's windows that overlap or
    /// touch merge.
    Session {
        /// Inactivity that ends a session, ms.
        gap: i64,
    },
}

/// A window assigner and the clock it follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowAssigner {
    /// The windows.
    pub kind: WindowKind,
    /// Event time (by the records' timestamps) or processing time (by the
    /// clock when a record arrives).
    pub domain: TimeDomain,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl WindowAssigner {
    /// Tumbling event-time windows of `size`.
    pub fn tumbling(size: Duration) -> Self {
        Self::event(WindowKind::Tumbling { size: millis(size) })
    }

    /// Sliding event-time windows of `size`, one starting every `slide`.
    pub fn sliding(size: Duration, slide: Duration) -> Self {
        Self::event(WindowKind::Sliding {
            size: millis(size),
            slide: millis(slide),
        })
    }

    /// Session event-time windows closed by `gap` of inactivity.
    pub fn session(gap: Duration) -> Self {
        Self::event(WindowKind::Session { gap: millis(gap) })
    }

    fn event(kind: WindowKind) -> Self {
        WindowAssigner {
            kind,
            domain: TimeDomain::EventTime,
        }
    }

    /// The same windows in processing time.
    pub fn processing_time(mut self) -> Self {
        self.domain = TimeDomain::ProcessingTime;
        self
    }

    /// Whether windows of a key merge (sessions).
    pub fn is_merging(&self) -> bool {
        matches!(self.kind, WindowKind::Session { .. })
    }

    /// The windows a record of timestamp `timestamp` belongs to, before
    /// merging, latest start first.
    pub fn assign(&self, timestamp: u64) -> impl Iterator<Item = TimeWindow> {
        let ts = i64::try_from(timestamp).unwrap_or(i64::MAX - 1);
        let (size, slide) = match self.kind {
            WindowKind::Tumbling { size } => (size, size),
            WindowKind::Sliding { size, slide } => (size, slide),
            // One window, [ts, ts + gap): the start loop runs once.
            WindowKind::Session { gap } => (gap, gap.max(1)),
        };
        let first = match self.kind {
            WindowKind::Session { .. } => ts,
            _ => ts - ts.rem_euclid(slide),
        };
        let starts = std::iter::successors(Some(first), move |start| start.checked_sub(slide));
        starts
            .take_while(move |&start| start > ts - size)
            .map(move |start| TimeWindow {
                start,
                end: start.saturating_add(size),
            })
    }
}

/// An incremental aggregation (Flink's `AggregateFunction`): records are
/// added to an accumulator as they arrive; sessions merge accumulators.
pub trait AggregateFunction<T>: Send + Sync + 'static {
    /// What is kept per window, in keyed state.
    type Acc: Data + Default;
    /// What a window emits.
    type Result: Send;
    /// Adds `record` to `acc`.
    fn add(&self, acc: &mut Self::Acc, record: &T);
    /// Adds `other` into `acc` (two sessions became one).
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
    /// The window's result.
    fn result(&self, acc: &Self::Acc) -> Self::Result;
}

/// Counts the records of a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Count;

impl<T> AggregateFunction<T> for Count {
    type Acc = u64;
    type Result = u64;
    fn add(&self, acc: &mut u64, _record: &T) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn w(start: i64, end: i64) -> TimeWindow {
        TimeWindow { start, end }
    }

    #[test]
    fn windows_are_flinks() {
        let assign = |a: WindowAssigner, ts| a.assign(ts).collect::<Vec<_>>();
        let (tumbling, sliding) = (WindowAssigner::tumbling, WindowAssigner::sliding);
        assert_eq!(assign(tumbling(ms(1000)), 2500), [w(2000, 3000)]);
        assert_eq!(
            assign(sliding(ms(1000), ms(500)), 2500),
            [w(2500, 3500), w(2000, 3000)]
        );
        assert_eq!(
            assign(sliding(ms(1000), ms(400)), 100),
            [w(0, 1000), w(-400, 600), w(-800, 200)]
        );
        assert_eq!(assign(WindowAssigner::session(ms(10)), 5), [w(5, 15)]);
        assert_eq!(assign(WindowAssigner::session(ms(10)), 0), [w(0, 10)]);
        assert!(w(0, 10).intersects(&w(10, 20)), "touching sessions merge");
        assert!(!w(0, 10).intersects(&w(11, 20)));
        assert_eq!(w(0, 10).max_timestamp(), 9);
    }
}
