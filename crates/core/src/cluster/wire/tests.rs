use super::*;
use crate::model::channel::{CreditReceiver, CreditSender};
use crate::model::event::{Alignment, CheckpointKind, CheckpointOptions};
use proptest::prelude::*;

fn channel() -> ChannelId {
    ChannelId {
        from: SubtaskId {
            operator: OperatorId(1),
            index: SubtaskIndex(2),
        },
        to: SubtaskId {
            operator: OperatorId(3),
            index: SubtaskIndex(70_000),
        },
    }
}

fn barrier(alignment: Alignment) -> Barrier {
    Barrier {
        id: CheckpointId(9),
        timestamp: 1_700_000_000_000,
        options: CheckpointOptions {
            kind: CheckpointKind::Checkpoint,
            alignment,
        },
    }
}

fn records(event: ChannelEvent) -> Vec<(String, u64)> {
    match event {
        ChannelEvent::Batch(batch) => batch.into_records().unwrap(),
        other => panic!("expected a batch, got {other:?}"),
    }
}

fn decode_all(bytes: &[u8]) -> Vec<Frame> {
    let mut decoder = FrameDecoder::default();
    decoder.feed(bytes);
    let frames = std::iter::from_fn(|| decoder.next_frame().unwrap()).collect();
    assert_eq!(decoder.buffered(), 0);
    frames
}

/// Every event kind crosses as itself; a batch arrives encoded and
/// decodes, in the consumer, to the records that were sent.
#[test]
fn every_frame_and_event_round_trips() {
    let sent = vec![("a".to_owned(), 1u64), ("bb".to_owned(), u64::MAX)];
    let events = vec![
        ChannelEvent::Batch(Batch::new(sent.clone())),
        ChannelEvent::Barrier(barrier(Alignment::Unaligned)),
        ChannelEvent::Barrier(barrier(Alignment::AlignedWithTimeout(
            std::time::Duration::from_millis(30),
        ))),
        ChannelEvent::CancelMarker(CheckpointId(4)),
        ChannelEvent::Watermark(123),
        ChannelEvent::WatermarkStatus(WatermarkStatus::Idle),
        ChannelEvent::WatermarkStatus(WatermarkStatus::Active),
        ChannelEvent::EndOfPartition,
    ];
    let hello = Hello {
        job: JobId(u64::MAX - 1),
        epoch: 1,
        attempt: Attempt(3),
        from: 0,
        to: 2,
    };
    let mut bytes = Vec::new();
    encode_hello(&hello, &mut bytes);
    for (seq, event) in events.iter().enumerate() {
        encode_data(channel(), seq as u64, event, &mut bytes).unwrap();
    }
    encode_credit(channel(), 5, &mut bytes);
    let mut frames = decode_all(&bytes).into_iter();
    assert!(matches!(frames.next(), Some(Frame::Hello(h)) if h == hello));
    for (seq, sent_event) in events.into_iter().enumerate() {
        let Some(Frame::Data {
            channel: c,
            seq: s,
            event,
        }) = frames.next()
        else {
            panic!("a data frame")
        };
        assert_eq!((c, s), (channel(), seq as u64));
        match (sent_event, event) {
            (ChannelEvent::Batch(_), event) => assert_eq!(records(event), sent),
            (sent, got) => assert_eq!(format!("{sent:?}"), format!("{got:?}")),
        }
    }
    assert!(matches!(
        frames.next(),
        Some(Frame::Credit { channel: c, credits: 5 }) if c == channel()
    ));
    assert!(frames.next().is_none());
}

/// TCP delivers a stream cut anywhere: every cut decodes to the same frames.
#[test]
fn frames_survive_every_cut_of_the_stream() {
    let mut bytes = Vec::new();
    encode_data(
        channel(),
        0,
        &ChannelEvent::Batch(Batch::new(vec![("x".to_owned(), 7u64)])),
        &mut bytes,
    )
    .unwrap();
    encode_credit(channel(), 1, &mut bytes);
    encode_data(channel(), 1, &ChannelEvent::EndOfPartition, &mut bytes).unwrap();
    for cut in 0..=bytes.len() {
        let mut decoder = FrameDecoder::default();
        let mut kinds = Vec::new();
        for part in [&bytes[..cut], &bytes[cut..]] {
            decoder.feed(part);
            while let Some(frame) = decoder.next_frame().unwrap() {
                kinds.push(match frame {
                    Frame::Data { seq, .. } => format!("data {seq}"),
                    Frame::Credit { credits, .. } => format!("credit {credits}"),
                    Frame::Hello(_) => "hello".into(),
                });
            }
        }
        assert_eq!(kinds, ["data 0", "credit 1", "data 1"], "cut at {cut}");
    }
}

fn first_error(bytes: &[u8]) -> WireError {
    let mut decoder = FrameDecoder::default();
    decoder.feed(bytes);
    loop {
        match decoder.next_frame() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error in {bytes:?}"),
            Err(e) => return e,
        }
    }
}

/// A peer that is not Tidemark, speaks another version or sends damaged
/// frames is refused with what is wrong, before anything is buffered for a
/// frame it announces beyond the limit.
#[test]
fn foreign_and_damaged_frames_are_refused() {
    assert_eq!(
        first_error(
            &(MAX_FRAME_BYTES + 1)
                .to_be_bytes()
                .iter()
                .chain(&[1])
                .copied()
                .collect::<Vec<_>>()
        ),
        WireError::Oversized(MAX_FRAME_BYTES + 1)
    );
    assert_eq!(
        first_error(b"GET / HTTP/1.1\r\n"),
        WireError::Oversized(0x4745_5420)
    );
    assert_eq!(first_error(&[0, 0, 0, 1, 9]), WireError::UnknownKind(9));
    assert_eq!(first_error(&[0, 0, 0, 0, 0]), WireError::Empty);

    let mut hello = Vec::new();
    let h = Hello {
        job: JobId(1),
        epoch: 1,
        attempt: Attempt(0),
        from: 0,
        to: 1,
    };
    encode_hello(&h, &mut hello);
    let mut other_version = hello.clone();
    other_version[9..11].copy_from_slice(&(VERSION + 1).to_be_bytes());
    assert_eq!(first_error(&other_version), WireError::Foreign);
    let mut other_magic = hello.clone();
    other_magic[5] = b'X';
    assert_eq!(first_error(&other_magic), WireError::Foreign);

    let mut data = Vec::new();
    encode_data(channel(), 0, &ChannelEvent::Watermark(5), &mut data).unwrap();
    let mut short = data[..data.len() - 1].to_vec();
    short[..4].copy_from_slice(&(data.len() as u32 - 5).to_be_bytes());
    assert_eq!(first_error(&short), WireError::Truncated("data"));
    let mut long = data.clone();
    long.push(0);
    long[..4].copy_from_slice(&(data.len() as u32 - 3).to_be_bytes());
    assert_eq!(first_error(&long), WireError::Trailing("data"));
    let mut unknown = data.clone();
    unknown[5 + 16 + 8] = 42;
    assert_eq!(first_error(&unknown), WireError::UnknownEvent(42));
    let mut bad_barrier = Vec::new();
    encode_data(
        channel(),
        0,
        &ChannelEvent::Barrier(barrier(Alignment::Aligned)),
        &mut bad_barrier,
    )
    .unwrap();
    bad_barrier.truncate(bad_barrier.len() - 2);
    let len = bad_barrier.len() as u32 - 4;
    bad_barrier[..4].copy_from_slice(&len.to_be_bytes());
    assert!(matches!(first_error(&bad_barrier), WireError::Barrier(_)));
}

/// A batch whose records own more than their in-memory size counts (long
/// strings) can outgrow a frame: the sender refuses it, whole, instead of
/// a receiver refusing it after every restart.
#[test]
fn an_acceptor_reads_a_hello_and_nothing_longer() {
    let mut bytes = Vec::new();
    encode_hello(&peer(), &mut bytes);
    assert!(bytes.len() <= 4 + MAX_HELLO_BYTES as usize);
    let mut decoder = FrameDecoder::default();
    for (i, byte) in bytes.iter().enumerate() {
        assert_eq!(decoder.next_hello(), Ok(None), "after {i} bytes");
        decoder.feed(&[*byte]);
    }
    assert_eq!(decoder.next_hello(), Ok(Some(peer())));

    // A stranger declaring a frame of 256 MiB is refused on its header.
    let mut decoder = FrameDecoder::default();
    decoder.feed(&MAX_FRAME_BYTES.to_be_bytes());
    assert_eq!(
        decoder.next_hello(),
        Err(WireError::HelloOversized(MAX_FRAME_BYTES))
    );
    // Any other first frame is no hello.
    let mut credit = Vec::new();
    encode_credit(channel(), 3, &mut credit);
    let mut decoder = FrameDecoder::default();
    decoder.feed(&credit);
    assert_eq!(decoder.next_hello(), Err(WireError::NoHello));
}

#[test]
fn a_batch_too_large_for_a_frame_is_refused_by_its_sender() {
    let long = "x".repeat(MAX_FRAME_BYTES as usize / 2 + 1);
    let batch = ChannelEvent::Batch(Batch::new(vec![long.clone(), long]));
    let mut out = vec![1, 2, 3];
    assert!(matches!(
        encode_data(channel(), 0, &batch, &mut out),
        Err(WireError::Oversized(len)) if len > MAX_FRAME_BYTES
    ));
    assert_eq!(out, [1, 2, 3], "nothing of it appended");
}

fn peer() -> Hello {
    Hello {
        job: JobId(5),
        epoch: 1,
        attempt: Attempt(2),
        from: 1,
        to: 0,
    }
}

fn data(channel: ChannelId, seq: u64) -> Frame {
    Frame::Data {
        channel,
        seq,
        event: ChannelEvent::EndOfPartition,
    }
}

/// A link end takes its peer's hello and nothing before it, refuses a
/// stranger's, and then data in sequence on each channel.
#[test]
fn an_end_takes_the_hello_first_then_each_channel_in_sequence() {
    let mut inbound = Inbound::new(peer());
    assert_eq!(
        inbound.accept(data(channel(), 0)).unwrap_err(),
        WireError::NoHello
    );
    let stranger = Hello {
        attempt: Attempt(1),
        ..peer()
    };
    assert_eq!(
        Inbound::new(peer())
            .accept(Frame::Hello(stranger))
            .unwrap_err(),
        WireError::Stranger {
            got: stranger,
            expected: peer()
        }
    );
    // The same attempt number of another run of the job (a driver that
    // took the job directory over restarts its attempts at 0).
    let other_run = Hello { epoch: 2, ..peer() };
    assert!(matches!(
        Inbound::new(peer()).accept(Frame::Hello(other_run)),
        Err(WireError::Stranger { .. })
    ));
    assert!(inbound.accept(Frame::Hello(peer())).unwrap().is_none());
    assert!(
        matches!(
            inbound.accept(Frame::Hello(peer())),
            Err(WireError::Stranger { .. })
        ),
        "a second hello"
    );
    assert!(matches!(
        inbound.accept(data(channel(), 0)),
        Ok(Some(Frame::Data { seq: 0, .. }))
    ));
    assert!(matches!(
        inbound.accept(Frame::Credit {
            channel: channel(),
            credits: 2
        }),
        Ok(Some(Frame::Credit { credits: 2, .. }))
    ));
    assert!(inbound.accept(data(channel(), 1)).is_ok());
    assert_eq!(
        inbound.accept(data(channel(), 1)).unwrap_err(),
        WireError::Sequence {
            channel: channel(),
            expected: 2,
            found: 1
        }
    );
    let other = ChannelId {
        from: channel().to,
        to: channel().from,
    };
    assert_eq!(
        inbound.accept(data(other, 1)).unwrap_err(),
        WireError::Sequence {
            channel: other,
            expected: 0,
            found: 1
        }
    );
}

#[derive(Clone, Debug)]
enum Step {
    /// The producer emits a batch of this many records.
    Push(usize),
    /// The producer emits a watermark.
    Watermark,
    /// This many bytes cross toward the consumer.
    Forward(usize),
    /// The consumer finishes a batch it was handed.
    Consume,
    /// This many bytes of credit frames cross back.
    Back(usize),
    /// The producer's subtask takes an unaligned checkpoint.
    Unaligned,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..40).prop_map(Step::Push),
        1 => Just(Step::Watermark),
        4 => (1usize..400).prop_map(Step::Forward),
        3 => Just(Step::Consume),
        3 => (1usize..40).prop_map(Step::Back),
        1 => Just(Step::Unaligned),
    ]
}

/// One channel across a link: the output endpoint's sender, the bytes on
/// the wire cut at random, the input endpoint's receiver and a consumer;
/// credits travel back the same way.
struct Link {
    sender: CreditSender,
    seq: u64,
    wire: Vec<u8>,
    decoder: FrameDecoder,
    inbound: Inbound,
    receiver: CreditReceiver,
    credit_wire: Vec<u8>,
    credit_decoder: FrameDecoder,
    /// Batch and control frames sent and not yet decoded.
    batches_in_flight: u32,
    controls_in_flight: u32,
    /// Batches (by their first record) the consumer holds, in order.
    held: Vec<u64>,
    /// Batches (by their first record) the consumer was handed, in order.
    delivered: Vec<u64>,
    next_record: u64,
    /// Every batch pushed (by its first record), in order.
    pushed: Vec<u64>,
    /// An unaligned checkpoint in progress: the batches pushed before its
    /// barrier and those the producer overtook.
    checkpoint: Option<(Vec<u64>, Vec<u64>)>,
    largest_batch_frame: usize,
}

const CAPACITY: u32 = 4;
const PREFETCH: u32 = 2;
/// Bytes of the largest control frame (a barrier).
const CONTROL_FRAME: usize = 64;

fn first(batch: &Batch) -> u64 {
    batch.clone().into_records::<u64>().unwrap()[0]
}

impl Link {
    fn new() -> Self {
        let receiver = CreditReceiver::new(CAPACITY, PREFETCH);
        let mut credit_wire = Vec::new();
        encode_credit(channel(), receiver.initial_credits(), &mut credit_wire);
        Link {
            sender: CreditSender::default(),
            seq: 0,
            wire: Vec::new(),
            decoder: FrameDecoder::default(),
            inbound: {
                let mut inbound = Inbound::new(peer());
                inbound.accept(Frame::Hello(peer())).unwrap();
                inbound
            },
            receiver,
            credit_wire,
            credit_decoder: FrameDecoder::default(),
            batches_in_flight: 0,
            controls_in_flight: 0,
            held: Vec::new(),
            delivered: Vec::new(),
            next_record: 0,
            pushed: Vec::new(),
            checkpoint: None,
            largest_batch_frame: 0,
        }
    }

    /// The output endpoint's pump: only what the sender releases is encoded.
    fn pump(&mut self) {
        while let Some(event) = self.sender.poll_send() {
            let before = self.wire.len();
            encode_data(channel(), self.seq, &event, &mut self.wire).unwrap();
            self.seq += 1;
            if event.is_batch() {
                self.batches_in_flight += 1;
                self.largest_batch_frame = self.largest_batch_frame.max(self.wire.len() - before);
            } else {
                self.controls_in_flight += 1;
                assert!(self.wire.len() - before <= CONTROL_FRAME);
            }
        }
    }

    fn deliver(&mut self) {
        while let Some(event) = self.receiver.poll_deliver() {
            if let ChannelEvent::Batch(batch) = event {
                self.held.push(first(&batch));
                self.delivered.push(first(&batch));
            }
        }
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Push(n) => {
                let records: Vec<u64> = (self.next_record..self.next_record + n as u64).collect();
                self.pushed.push(self.next_record);
                self.next_record += n as u64;
                self.sender.push(ChannelEvent::Batch(Batch::new(records)));
                self.pump();
            }
            Step::Watermark => {
                self.sender.push(ChannelEvent::Watermark(self.next_record));
                self.pump();
            }
            Step::Unaligned if self.checkpoint.is_none() => {
                let before = self.pushed.clone();
                let overtaken = self
                    .sender
                    .push_priority(ChannelEvent::Barrier(barrier(Alignment::Unaligned)));
                self.checkpoint = Some((before, overtaken.iter().map(first).collect()));
                self.pump();
            }
            Step::Unaligned => {}
            Step::Forward(n) => {
                let n = n.min(self.wire.len());
                self.decoder.feed(&self.wire[..n]);
                self.wire.drain(..n);
                while let Some(frame) = self.decoder.next_frame().unwrap() {
                    let Some(Frame::Data { event, .. }) = self.inbound.accept(frame).unwrap()
                    else {
                        panic!("only data flows forward")
                    };
                    if event.is_batch() {
                        self.batches_in_flight -= 1;
                    } else {
                        self.controls_in_flight -= 1;
                    }
                    if let ChannelEvent::Barrier(_) = event {
                        self.barrier_arrived();
                        continue;
                    }
                    self.receiver.receive(event).unwrap();
                }
                self.deliver();
            }
            Step::Consume => {
                if !self.held.is_empty() {
                    self.held.remove(0);
                    let credits = self.receiver.consumed().unwrap();
                    encode_credit(channel(), credits, &mut self.credit_wire);
                    self.deliver();
                }
            }
            Step::Back(n) => {
                let n = n.min(self.credit_wire.len());
                self.credit_decoder.feed(&self.credit_wire[..n]);
                self.credit_wire.drain(..n);
                while let Some(frame) = self.credit_decoder.next_frame().unwrap() {
                    let Frame::Credit { credits, .. } = frame else {
                        panic!("only credits flow back")
                    };
                    self.sender.grant(credits);
                }
                self.pump();
            }
        }
    }

    /// The input endpoint hands an unaligned barrier to its consumer ahead
    /// of what it holds: what the producer and the receiver overtook, with
    /// what the consumer was handed before, is every batch pushed before
    /// the barrier, each once.
    fn barrier_arrived(&mut self) {
        let (before, by_producer) = self.checkpoint.take().expect("a barrier was sent");
        let mut accounted = self.delivered.clone();
        accounted.extend(self.receiver.overtaken().iter().map(first));
        accounted.extend(by_producer);
        accounted.sort_unstable();
        assert_eq!(accounted, before);
    }

    /// What the issue asks of a remote channel: the wire never holds more
    /// than the credits allow.
    fn check_bounds(&self) {
        assert!(
            self.batches_in_flight + self.receiver.buffered() <= CAPACITY,
            "{} batches on the wire and {} held, {CAPACITY} credits",
            self.batches_in_flight,
            self.receiver.buffered()
        );
        // In bytes: the credits not taken up by what the receiver holds,
        // at most a frame of the largest batch each, and control frames.
        let on_wire = self.wire.len() + self.decoder.buffered();
        let credited = (CAPACITY - self.receiver.buffered()) as usize;
        assert!(
            on_wire
                <= credited * self.largest_batch_frame
                    + self.controls_in_flight as usize * CONTROL_FRAME,
            "{on_wire} bytes in flight"
        );
        assert!(self.pushed.starts_with(&self.delivered), "order, each once");
    }
}

proptest! {
    /// Credits bound a remote channel end to end: under any interleaving of
    /// producing, cutting the byte stream, consuming and returning credit,
    /// batches on the wire plus those held by the consumer's side never
    /// exceed the credits, bytes on the wire never exceed those batches'
    /// frames plus control frames, order and sequence hold, and an
    /// unaligned barrier accounts for every batch pushed before it once.
    #[test]
    fn a_remote_channel_never_exceeds_its_credits(
        steps in proptest::collection::vec(step(), 1..300)
    ) {
        let mut link = Link::new();
        for step in steps {
            link.run(step);
            link.check_bounds();
        }
        // Drain: everything pushed arrives, in order, once.
        for _ in 0..link.pushed.len() + 2 {
            link.run(Step::Back(usize::MAX));
            link.run(Step::Forward(usize::MAX));
            link.run(Step::Consume);
            link.check_bounds();
        }
        prop_assert!(link.sender.is_empty());
        prop_assert_eq!(link.receiver.buffered(), 0);
        prop_assert_eq!(&link.delivered, &link.pushed);
    }
}
