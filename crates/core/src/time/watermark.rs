//! Watermarks: generated per source subtask from the timestamps it read,
//! combined per subtask over its input channels (Flink's
//! `StatusWatermarkValve`), never decreasing.

use super::Millis;
pub use crate::model::event::{WatermarkEvent, WatermarkStatus};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a source derives watermarks from the timestamps it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watermarks {
    /// No watermarks, except the final one at the end of a bounded input.
    None,
    /// Timestamps never decrease: the watermark is the largest seen minus 1.
    Monotonous,
    /// Records are at most this much out of order: the watermark is the
    /// largest timestamp seen minus this minus 1 ms.
    BoundedOutOfOrderness(Duration),
}

/// A source's watermark strategy (Flink's `WatermarkStrategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatermarkStrategy {
    /// How the watermark follows the timestamps.
    pub watermarks: Watermarks,
    /// How often the source checks its watermark and idleness without
    /// records (Flink's `pipeline.auto-watermark-interval`, 200 ms).
    pub interval: Duration,
    /// A source subtask without records for this long is idle.
    pub idleness: Option<Duration>,
}

impl WatermarkStrategy {
    /// The default emission interval.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);

    fn of(watermarks: Watermarks) -> Self {
        WatermarkStrategy {
            watermarks,
            interval: Self::DEFAULT_INTERVAL,
            idleness: None,
        }
    }

    /// Watermarks `max_out_of_orderness` behind the largest timestamp.
    pub fn bounded_out_of_orderness(max_out_of_orderness: Duration) -> Self {
        Self::of(Watermarks::BoundedOutOfOrderness(max_out_of_orderness))
    }

    /// Watermarks for timestamps that never decrease.
    pub fn monotonous() -> Self {
        Self::of(Watermarks::Monotonous)
    }

    /// Only the final watermark of a bounded input.
    pub fn none() -> Self {
        Self::of(Watermarks::None)
    }

    /// Marks a source subtask idle after `timeout` without records.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idleness = Some(timeout);
        self
    }

    /// Checks watermark and idleness every `interval` (at least 1 ms)
    /// without records.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    fn lag(&self) -> Option<u64> {
        match self.watermarks {
            Watermarks::None => None,
            Watermarks::Monotonous => Some(1),
            Watermarks::BoundedOutOfOrderness(d) => Some(
                u64::try_from(d.as_millis())
                    .unwrap_or(u64::MAX)
                    .saturating_add(1),
            ),
        }
    }
}

/// What a source subtask's generator keeps in its checkpointed operator
/// state: a restored source never emits a lower watermark than it had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratorState {
    /// The largest timestamp read.
    pub max_timestamp: Option<u64>,
    /// The last watermark emitted.
    pub emitted: Option<u64>,
}

impl GeneratorState {
    /// The state of a source subtask after a rescale from `old`: the lowest
    /// of them, so that no new subtask is ahead of the records it still
    /// has to read.
    pub fn merge_for_rescale(old: &[GeneratorState]) -> GeneratorState {
        GeneratorState {
            max_timestamp: old.iter().map(|s| s.max_timestamp).min().flatten(),
            emitted: old.iter().map(|s| s.emitted).min().flatten(),
        }
    }
}

/// The watermark generator of one source subtask. Sans-IO: the shell tells
/// it what timestamps it read and the time, and emits what it returns.
#[derive(Clone, Debug)]
pub struct WatermarkGenerator {
    strategy: WatermarkStrategy,
    state: GeneratorState,
    last_record_at: Option<Millis>,
    idle: bool,
}

impl WatermarkGenerator {
    /// A generator following `strategy` from `state` (default on a fresh start).
    pub fn new(strategy: WatermarkStrategy, state: GeneratorState) -> Self {
        WatermarkGenerator {
            strategy,
            state,
            last_record_at: None,
            idle: false,
        }
    }

    /// The strategy it follows.
    pub fn strategy(&self) -> &WatermarkStrategy {
        &self.strategy
    }

    /// What to checkpoint.
    pub fn state(&self) -> GeneratorState {
        self.state
    }

    /// The subtask read records at `now`, the largest timestamp among them
    /// being `max_timestamp` (`None`: no records). Emits the return to
    /// activity of an idle source, then the watermark if it advanced.
    pub fn on_records(
        &mut self,
        max_timestamp: Option<u64>,
        now: Millis,
        out: &mut Vec<WatermarkEvent>,
    ) {
        if max_timestamp.is_some() {
            self.on_activity(now, out);
        }
        self.follow(max_timestamp);
        self.on_tick(now, out);
    }

    /// The subtask read records at `now`: it is not idle. Emits the return
    /// to activity of an idle source.
    pub fn on_activity(&mut self, now: Millis, out: &mut Vec<WatermarkEvent>) {
        self.last_record_at = Some(now);
        if self.idle {
            self.idle = false;
            out.push(WatermarkEvent::Status(WatermarkStatus::Active));
        }
    }

    /// The watermark may follow timestamps up to `max_timestamp` (it never
    /// goes back); emitted at the next tick or records.
    pub fn follow(&mut self, max_timestamp: Option<u64>) {
        self.state.max_timestamp = self.state.max_timestamp.max(max_timestamp);
    }

    /// The periodic check: the watermark if it advanced, and idleness.
    pub fn on_tick(&mut self, now: Millis, out: &mut Vec<WatermarkEvent>) {
        if let Some(current) = self
            .strategy
            .lag()
            .zip(self.state.max_timestamp)
            .and_then(|(lag, max)| max.checked_sub(lag))
        {
            if Some(current) > self.state.emitted && !self.idle {
                self.state.emitted = Some(current);
                out.push(WatermarkEvent::Watermark(current));
            }
        }
        let last = *self.last_record_at.get_or_insert(now);
        if let Some(timeout) = self.strategy.idleness {
            let timeout = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            if !self.idle && now.saturating_sub(last) >= timeout {
                self.idle = true;
                out.push(WatermarkEvent::Status(WatermarkStatus::Idle));
            }
        }
    }

    /// The subtask is held back by its consumers: that is no idleness.
    pub fn on_backpressure(&mut self, now: Millis) {
        self.last_record_at = Some(now);
    }

    /// After a restore: the watermark of the restored state again, which
    /// the restored consumers never got if it was in flight at the snapshot.
    pub fn resend(&self, out: &mut Vec<WatermarkEvent>) {
        out.extend(self.state.emitted.map(WatermarkEvent::Watermark));
    }

    /// End of a bounded input: the maximal watermark, which fires every
    /// event-time timer downstream; emitted once.
    pub fn on_end(&mut self, out: &mut Vec<WatermarkEvent>) {
        if self.state.emitted == Some(u64::MAX) {
            return;
        }
        if self.idle {
            self.idle = false;
            out.push(WatermarkEvent::Status(WatermarkStatus::Active));
        }
        self.state.emitted = Some(u64::MAX);
        out.push(WatermarkEvent::Watermark(u64::MAX));
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct ChannelWatermark {
    watermark: Option<u64>,
    idle: bool,
    /// Its watermark has caught up with the output: it takes part in the
    /// minimum. A channel returning from idleness behind the output does not
    /// until it catches up, so the output never goes back.
    aligned: bool,
}

/// Combines the watermarks of a subtask's input channels: the output is the
/// minimum over the active channels, emitted when it advances; when every
/// channel is idle the subtask is idle too.
#[derive(Clone, Debug)]
pub struct WatermarkValve {
    channels: Vec<ChannelWatermark>,
    output: Option<u64>,
    idle: bool,
}

impl WatermarkValve {
    /// A valve over `channels` input channels, none with a watermark yet.
    pub fn new(channels: usize) -> Self {
        WatermarkValve {
            channels: vec![
                ChannelWatermark {
                    aligned: true,
                    ..Default::default()
                };
                channels
            ],
            output: None,
            idle: false,
        }
    }

    /// The subtask's current watermark.
    pub fn current(&self) -> Option<u64> {
        self.output
    }

    /// `channel` delivered watermark `watermark`.
    pub fn on_watermark(&mut self, channel: usize, watermark: u64, out: &mut Vec<WatermarkEvent>) {
        let output = self.output;
        let c = &mut self.channels[channel];
        if c.idle || Some(watermark) <= c.watermark {
            return;
        }
        c.watermark = Some(watermark);
        if Some(watermark) >= output {
            c.aligned = true;
        }
        self.advance(out);
    }

    /// `channel` delivered a status change.
    pub fn on_status(
        &mut self,
        channel: usize,
        status: WatermarkStatus,
        out: &mut Vec<WatermarkEvent>,
    ) {
        let output = self.output;
        let c = &mut self.channels[channel];
        match status {
            WatermarkStatus::Idle if !c.idle => {
                c.idle = true;
                c.aligned = false;
                if self.channels.iter().all(|c| c.idle) {
                    // Nothing holds the others back: catch up with the most
                    // advanced channel before going idle (as Flink does).
                    let max = self.channels.iter().filter_map(|c| c.watermark).max();
                    if max > self.output {
                        self.output = max;
                        out.extend(max.map(WatermarkEvent::Watermark));
                    }
                    self.idle = true;
                    out.push(WatermarkEvent::Status(WatermarkStatus::Idle));
                } else {
                    self.advance(out);
                }
            }
            WatermarkStatus::Active if c.idle => {
                c.idle = false;
                c.aligned = c.watermark >= output;
                if self.idle {
                    self.idle = false;
                    out.push(WatermarkEvent::Status(WatermarkStatus::Active));
                }
            }
            _ => {}
        }
    }

    fn advance(&mut self, out: &mut Vec<WatermarkEvent>) {
        let mut active = self.channels.iter().filter(|c| !c.idle && c.aligned);
        let Some(first) = active.next() else { return };
        let min = active.fold(first.watermark, |min, c| min.min(c.watermark));
        if min > self.output {
            self.output = min;
            out.extend(min.map(WatermarkEvent::Watermark));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WatermarkEvent::{Status, Watermark};
    use WatermarkStatus::{Active, Idle};

    fn bounded(ms: u64) -> WatermarkGenerator {
        WatermarkGenerator::new(
            WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(ms))
                .with_idleness(Duration::from_millis(1000)),
            GeneratorState::default(),
        )
    }

    #[test]
    fn generator_trails_the_largest_timestamp_and_never_goes_back() {
        let mut g = bounded(100);
        let mut out = Vec::new();
        g.on_records(Some(50), 0, &mut out);
        assert_eq!(out, []);
        g.on_records(Some(500), 1, &mut out);
        g.on_records(Some(300), 2, &mut out);
        g.on_records(Some(601), 3, &mut out);
        assert_eq!(out, [Watermark(399), Watermark(500)]);
        let mut restored = WatermarkGenerator::new(*g.strategy(), g.state());
        out.clear();
        restored.resend(&mut out);
        restored.on_records(Some(550), 10, &mut out);
        assert_eq!(
            out,
            [Watermark(500)],
            "a restored source sends its watermark again, and nothing below it"
        );
        out.clear();
        restored.on_end(&mut out);
        restored.on_end(&mut out);
        assert_eq!(out, [Watermark(u64::MAX)]);
    }

    #[test]
    fn generator_goes_idle_without_records_and_back_with_them() {
        let mut g = bounded(0);
        let mut out = Vec::new();
        g.on_records(Some(10), 0, &mut out);
        g.on_tick(999, &mut out);
        // Held back by its consumers: not idle.
        g.on_backpressure(999);
        g.on_tick(1000, &mut out);
        g.on_tick(1998, &mut out);
        assert_eq!(out, [Watermark(9)]);
        g.on_tick(1999, &mut out);
        g.on_tick(2200, &mut out);
        assert_eq!(out, [Watermark(9), Status(Idle)]);
        out.clear();
        g.on_records(Some(20), 2300, &mut out);
        assert_eq!(out, [Status(Active), Watermark(19)]);
    }

    #[test]
    fn valve_takes_the_minimum_over_active_channels() {
        let mut v = WatermarkValve::new(3);
        let mut out = Vec::new();
        v.on_watermark(0, 10, &mut out);
        v.on_watermark(1, 20, &mut out);
        assert_eq!(out, [], "channel 2 has no watermark yet");
        v.on_watermark(2, 5, &mut out);
        assert_eq!(out, [Watermark(5)]);
        v.on_watermark(2, 30, &mut out);
        assert_eq!(out, [Watermark(5), Watermark(10)]);
        out.clear();
        v.on_watermark(0, 8, &mut out);
        assert_eq!(out, [], "a channel's watermark never goes back");
        v.on_status(0, Idle, &mut out);
        assert_eq!(out, [Watermark(20)], "an idle channel holds nothing back");
        out.clear();
        v.on_status(0, Active, &mut out);
        v.on_watermark(0, 15, &mut out);
        assert_eq!(
            out,
            [],
            "a channel back from idleness behind the output waits"
        );
        v.on_watermark(0, 25, &mut out);
        v.on_watermark(1, 40, &mut out);
        assert_eq!(out, [Watermark(25)]);
        assert_eq!(v.current(), Some(25));
    }

    #[test]
    fn valve_is_idle_when_every_channel_is() {
        let mut v = WatermarkValve::new(2);
        let mut out = Vec::new();
        v.on_watermark(0, 10, &mut out);
        v.on_watermark(1, 3, &mut out);
        v.on_status(1, Idle, &mut out);
        v.on_status(0, Idle, &mut out);
        assert_eq!(out, [Watermark(3), Watermark(10), Status(Idle)]);
        out.clear();
        v.on_status(1, Active, &mut out);
        assert_eq!(out, [Status(Active)]);
        v.on_watermark(1, 12, &mut out);
        assert_eq!(out, [Status(Active), Watermark(12)]);
    }

    #[test]
    fn rescaled_sources_start_from_the_lowest_state() {
        let merged = GeneratorState::merge_for_rescale(&[
            GeneratorState {
                max_timestamp: Some(500),
                emitted: Some(399),
            },
            GeneratorState {
                max_timestamp: Some(450),
                emitted: Some(349),
            },
        ]);
        assert_eq!(merged.max_timestamp, Some(450));
        assert_eq!(merged.emitted, Some(349));
    }
}
