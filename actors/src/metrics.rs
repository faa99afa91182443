//! Live figures of a running job, shared between its actors and its handle.

use dashmap::DashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tidemark::ids::ChannelId;

/// High-water marks of one channel, against the credits that bound them.
#[derive(Debug, Default)]
pub struct ChannelGauge {
    pub output_credits: u32,
    pub input_credits: u32,
    max_output_queued: AtomicU32,
    max_input_buffered: AtomicU32,
}

impl ChannelGauge {
    pub fn new(output_credits: u32, input_credits: u32) -> Self {
        ChannelGauge {
            output_credits,
            input_credits,
            ..Default::default()
        }
    }

    pub fn observe_output(&self, queued: u32) {
        self.max_output_queued.fetch_max(queued, Ordering::Relaxed);
    }

    pub fn observe_input(&self, buffered: u32) {
        self.max_input_buffered
            .fetch_max(buffered, Ordering::Relaxed);
    }

    /// Most batches ever queued in the output endpoint.
    pub fn max_output_queued(&self) -> u32 {
        self.max_output_queued.load(Ordering::Relaxed)
    }

    /// Most batches ever in the input endpoint or handed to its subtask.
    pub fn max_input_buffered(&self) -> u32 {
        self.max_input_buffered.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
pub struct JobMetrics {
    records_in: AtomicU64,
    pub channels: DashMap<ChannelId, Arc<ChannelGauge>>,
}

impl JobMetrics {
    pub fn add_records_in(&self, n: u64) {
        self.records_in.fetch_add(n, Ordering::Relaxed);
    }

    /// Records read by all sources.
    pub fn records_in(&self) -> u64 {
        self.records_in.load(Ordering::Relaxed)
    }

    pub fn channel(
        &self,
        id: ChannelId,
        output_credits: u32,
        input_credits: u32,
    ) -> Arc<ChannelGauge> {
        self.channels
            .entry(id)
            .or_insert_with(|| Arc::new(ChannelGauge::new(output_credits, input_credits)))
            .clone()
    }
}
