//! Windows on keyed streams (Flink's `WindowOperator`): tumbling, sliding
//! and session windows in event or processing time, aggregated
//! incrementally. A key's open windows (or, for tumbling and sliding
//! windows in event time, the slices they are cut into) and their
//! accumulators are one keyed value, their firing and cleanup times keyed
//! timers or timers that value implies: nothing about a window is special
//! to checkpoints, rescaling or either backend.

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

    /// How tumbling and sliding windows are sliced; sessions are not.
    pub fn slicing(&self) -> Option<Slicing> {
        let (size, slide) = match self.kind {
            WindowKind::Tumbling { size } => (size, size),
            WindowKind::Sliding { size, slide } => (size, slide),
            WindowKind::Session { .. } => return None,
        };
        let gcd = |mut a: i64, mut b: i64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        Some(Slicing {
            size,
            slide,
            width: gcd(size, slide),
        })
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

/// Tumbling or sliding windows cut into slices (Flink SQL's
/// `SliceAssigner`): slices as wide as the greatest common divisor of size
/// and slide, so that each window is a run of whole slices and a record adds
/// to its one slice rather than to each of its windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slicing {
    size: i64,
    slide: i64,
    width: i64,
}

impl Slicing {
    /// Distance between window ends, ms.
    pub fn slide(&self) -> i64 {
        self.slide
    }

    /// The start of the slice holding `timestamp`.
    pub fn start(&self, timestamp: u64) -> i64 {
        let ts = i64::try_from(timestamp).unwrap_or(i64::MAX - 1);
        ts - ts.rem_euclid(self.width)
    }

    /// The end of the first window holding the slice that starts at `start`:
    /// the first window start at or after `start + width - size`.
    pub fn first_end(&self, start: i64) -> i64 {
        let from = start.saturating_add(self.width).saturating_sub(self.size);
        let first = from.div_euclid(self.slide) + i64::from(from.rem_euclid(self.slide) != 0);
        first.saturating_mul(self.slide).saturating_add(self.size)
    }

    /// The end of the last window holding the slice that starts at `start`.
    pub fn last_end(&self, start: i64) -> i64 {
        (start.div_euclid(self.slide) * self.slide).saturating_add(self.size)
    }

    /// Whether `window` is one of these windows, not a slice of them.
    pub fn is_window(&self, window: &TimeWindow) -> bool {
        window.end.checked_sub(window.start) == Some(self.size)
    }

    /// The window ending at `end` that holds the slice starting at
    /// `start`. One whose end is clamped to the largest timestamp, as
    /// `WindowAssigner::assign` clamps it, is the slice's last.
    pub fn window(&self, start: i64, end: i64) -> TimeWindow {
        let first = match end {
            i64::MAX => start.div_euclid(self.slide) * self.slide,
            _ => end - self.size,
        };
        TimeWindow { start: first, end }
    }

    /// The windows from the one ending at `from` to the last holding the
    /// slice that starts at `start`.
    pub fn windows(&self, start: i64, from: i64) -> impl Iterator<Item = TimeWindow> + use<> {
        let (last, this) = (self.last_end(start), *self);
        let step = usize::try_from(self.slide).expect("a slide is positive");
        (from..=last)
            .step_by(step)
            .map(move |end| this.window(start, end))
    }
}

/// An incremental aggregation (Flink's `AggregateFunction`): records are
/// added to an accumulator as they arrive; sessions and sliced windows
/// merge accumulators, so `merge` must give what adding the records would
/// have given, in whatever order they came.
pub trait AggregateFunction<T>: Send + Sync + 'static {
    /// What is kept per window, in keyed state.
    type Acc: Data + Default;
    /// What a window emits.
    type Result: Send;
    /// Adds `record` to `acc`.
    fn add(&self, acc: &mut Self::Acc, record: &T);
    /// Adds `other` into `acc`: two sessions became one, or a window fires
    /// with the accumulators of its slices, merged in the order the key's
    /// records opened them.
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

    /// A record's slice lies in exactly the windows the assigner puts the
    /// record in: those ending from the slice's first end to its last, one
    /// slide apart, at the end of time too (ends clamped, as assign clamps
    /// them).
    #[test]
    fn slices_lie_in_the_windows_of_their_records() {
        let shapes = [(10, 10), (10, 5), (1000, 400), (7, 3), (6, 4), (5, 10)];
        for (size, slide) in shapes {
            let assigner = WindowAssigner::sliding(ms(size), ms(slide));
            let slicing = assigner.slicing().unwrap();
            for ts in 0..60 {
                let start = slicing.start(ts);
                let mut windows: Vec<TimeWindow> = assigner.assign(ts).collect();
                windows.sort();
                let first = slicing.first_end(start);
                let from_slice: Vec<TimeWindow> = slicing.windows(start, first).collect();
                assert_eq!(from_slice, windows, "size {size}, slide {slide}, ts {ts}");
                for t in start..start + slicing.width {
                    assert_eq!(slicing.start(t as u64), start, "one slice");
                }
            }
        }
        let tumbling = WindowAssigner::tumbling(ms(10));
        let slicing = tumbling.slicing().unwrap();
        let last = i64::MAX as u64 - 3;
        let start = slicing.start(last);
        let from_slice: Vec<TimeWindow> =
            slicing.windows(start, slicing.first_end(start)).collect();
        assert_eq!(from_slice, tumbling.assign(last).collect::<Vec<_>>());
        assert!(!slicing.is_window(&w(-10, i64::MAX)), "no overflow");
        assert_eq!(WindowAssigner::session(ms(10)).slicing(), None);
    }
}
