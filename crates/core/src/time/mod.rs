//! Event time: record timestamps, watermarks from the sources to every
//! operator, keyed timers and windows. Watermarks are channel events that
//! travel in-band like barriers; timers are keyed state, so every snapshot,
//! incremental checkpoint, savepoint and rescale carries them with the key
//! groups they belong to, or implied by keyed state and named again from
//! it on restore. The operators built on them, the window operator
//! and the interval join, are the job builder's (`crate::job`): they use
//! keyed state, which is above time.

pub mod split_watermarks;
pub mod timers;
pub mod watermark;
pub mod window;

pub use timers::{TimeCounters, TimeDomain, TimeMarks, TimeMetrics};
pub use watermark::{
    WatermarkEvent, WatermarkGenerator, WatermarkStatus, WatermarkStrategy, WatermarkValve,
};
pub use window::{AggregateFunction, Count, Slicing, TimeWindow, WindowAssigner};

/// A record that carries its event timestamp, in milliseconds. Sources with
/// a [`WatermarkStrategy`] and event-time windows read it through this trait.
pub trait Timestamped {
    /// The record's event time, in milliseconds.
    fn timestamp(&self) -> u64;
}

#[cfg(test)]
mod join_tests;
#[cfg(test)]
mod tests;

/// Processing time in milliseconds since the Unix epoch, as the shell gives
/// it to the core.
pub type Millis = u64;
