//! Credit-based flow control under a sink 100× slower than the source: the
//! batches buffered on every channel stay within its credits, and the source
//! is held back instead of filling memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidemark::job::JobConfig;
use tidemark::model::channel::ChannelConfig;
use tidemark::BatchLimits;
use tidemark_actors::prelude::*;
use tidemark_actors::runtime::Runtime;
use tidemark_cli::topologies::wordcount::{Counter, Emit, Generator};

/// Takes 100× longer per record than the source, and records the most
/// records ever read but not yet written.
struct Slow {
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
    max_in_flight: Arc<AtomicU64>,
}

impl Sink<(u64, u64)> for Slow {
    fn write(&mut self, records: &mut Vec<(u64, u64)>) -> Result<(), UserError> {
        std::thread::sleep(Duration::from_micros(20 * records.len() as u64));
        let written = self
            .written
            .fetch_add(records.len() as u64, Ordering::SeqCst)
            + records.len() as u64;
        let in_flight = self.read.load(Ordering::SeqCst) - written;
        self.max_in_flight.fetch_max(in_flight, Ordering::SeqCst);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        Ok(())
    }
}

#[test]
fn buffered_batches_never_exceed_credits_when_the_sink_is_slow() {
    slow_sink_is_held_within_credits(Runtime::default());
}

/// Subtask 0 and subtask 1 on workers of their own: half the channels cross
/// loopback TCP, and what the sockets hold counts in the records in flight,
/// so the same bound shows that a link buffers nothing beyond the credits.
#[test]
fn buffered_batches_never_exceed_credits_across_workers_when_the_sink_is_slow() {
    slow_sink_is_held_within_credits(Runtime {
        local_workers: 2,
        ..Runtime::default()
    });
}

fn slow_sink_is_held_within_credits(runtime: Runtime) {
    let parallelism = 2u32;
    let spread = runtime.local_workers > 1;
    let batch = 64usize;
    let channels = ChannelConfig {
        output_credits: 2,
        input_credits: 3,
        prefetch: 1,
    };
    let records = 20_000u64;
    let read = Arc::new(AtomicU64::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let max_in_flight = Arc::new(AtomicU64::new(0));
    let config = JobConfig {
        parallelism,
        batch_limits: BatchLimits {
            max_records: batch,
            max_bytes: 1 << 20,
        },
        channels,
        ..JobConfig::default()
    };
    let (source_read, sink_read) = (read.clone(), read.clone());
    let (sink_written, sink_max) = (written.clone(), max_in_flight.clone());
    let job = Job::builder("slow-sink")
        .config(config)
        .split_source("generator", Generator::new(records, 1_000, 0))
        // Chained to the source: counts what it has read.
        .map(move |key: u64| {
            source_read.fetch_add(1, Ordering::SeqCst);
            key
        })
        .key_by(|k: &u64| *k)
        .process("count", |states| Counter::open(states, Emit::Updates))
        .rebalance()
        .sink("slow", move |_| Slow {
            read: sink_read.clone(),
            written: sink_written.clone(),
            max_in_flight: sink_max.clone(),
        })
        .build();
    let handle = runtime.run(job).unwrap();
    let metrics = handle.metrics().clone();
    let report = handle.wait().unwrap();
    assert_eq!(report.records_in, records);
    assert_eq!(written.load(Ordering::SeqCst), records);
    assert_eq!(
        metrics.link_bytes_sent.load(Ordering::Relaxed) > 0,
        spread,
        "bytes crossed links exactly when spread over workers"
    );

    let mut saturated = 0;
    for gauge in metrics.channels.iter() {
        let (id, g) = (gauge.key(), gauge.value());
        assert!(
            g.max_output_queued() <= channels.output_credits,
            "{id}: {} queued",
            g.max_output_queued()
        );
        assert!(
            g.max_input_buffered() <= channels.input_credits,
            "{id}: {} buffered",
            g.max_input_buffered()
        );
        if g.max_input_buffered() == channels.input_credits {
            saturated += 1;
        }
    }
    assert_eq!(metrics.channels.len(), 2 * 2 * parallelism as usize);
    assert!(
        saturated > 0,
        "the slow sink must have filled some channel to its credits"
    );

    // Everything between source and sink: two edges of p×p channels, each
    // holding at most its credits in batches, plus what each of the 2p
    // subtasks holds locally (one batch per output channel) or is working on.
    let channel_count = 2 * (parallelism * parallelism) as u64;
    let per_channel = u64::from(channels.output_credits + channels.input_credits);
    let local = 2 * u64::from(parallelism) * (u64::from(parallelism) + 1);
    let bound = (channel_count * per_channel + local) * batch as u64;
    let seen = max_in_flight.load(Ordering::SeqCst);
    assert!(seen <= bound, "{seen} records in flight, bound {bound}");
    assert!(
        seen < records / 2,
        "the source must have been held back: {seen} in flight"
    );
}
