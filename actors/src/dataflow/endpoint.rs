//! Channel endpoints. The output endpoint holds what its subtask produced
//! until the input endpoint grants credit; the input endpoint holds what
//! arrived until its subtask consumes it. Both keep their queues in a core
//! `CreditSender` / `CreditReceiver`, in the open, so an unaligned checkpoint
//! can take the batches they hold.
//!
//! The two endpoints of a channel talk by actor messages when they share a
//! worker, and over the workers' TCP link (`net`) when they do not; either
//! way only batches the receiver granted credit for leave the output
//! endpoint.

use crate::dataflow::net::LinkSender;
use crate::messages::{
    Consumed, Credit, Deliver, DeliverPriority, OutputCredit, Push, PushPriority, Stop,
    SubtaskFailed, Transfer,
};
use crate::metrics::ChannelGauge;
use actix::{Actor, ActorContext, Addr, Context, Handler, Message, Recipient};
use std::sync::Arc;
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::model::batch::Batch;
use tidemark_core::model::channel::{CreditReceiver, CreditSender};
use tidemark_core::model::event::{Alignment, ChannelEvent};
use tidemark_core::model::ids::{Attempt, ChannelId};

/// Where an output endpoint sends what credit releases.
pub enum InputPeer {
    /// The input endpoint, on this worker.
    Local(Addr<InputEndpoint>),
    /// The link to the input endpoint's worker; `seq` numbers the frames.
    Remote {
        channel: ChannelId,
        link: LinkSender,
        seq: u64,
    },
}

/// Where an input endpoint returns credits.
pub enum OutputPeer {
    /// The output endpoint, on this worker.
    Local(Addr<OutputEndpoint>),
    /// The link to the output endpoint's worker.
    Remote {
        channel: ChannelId,
        link: LinkSender,
    },
}

/// Closes the cycle between an input endpoint and its sender.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ConnectUpstream(pub OutputPeer);

impl OutputPeer {
    fn grant(&self, credits: u32) {
        match self {
            OutputPeer::Local(output) => output.do_send(Credit(credits)),
            OutputPeer::Remote { channel, link } => link.credit(*channel, credits),
        }
    }
}

pub struct OutputEndpoint {
    producer: Recipient<OutputCredit>,
    /// Index of this channel among the producer's outputs.
    producer_channel: usize,
    downstream: InputPeer,
    link: CreditSender,
    capacity: u32,
    gauge: Arc<ChannelGauge>,
}

impl OutputEndpoint {
    pub fn new(
        producer: Recipient<OutputCredit>,
        producer_channel: usize,
        downstream: InputPeer,
        gauge: Arc<ChannelGauge>,
    ) -> Self {
        OutputEndpoint {
            producer,
            producer_channel,
            downstream,
            link: CreditSender::default(),
            capacity: gauge.output_credits,
            gauge,
        }
    }

    fn pump(&mut self) {
        while let Some(event) = self.link.poll_send() {
            if event.is_batch() {
                self.producer.do_send(OutputCredit {
                    channel: self.producer_channel,
                    credits: 1,
                });
            }
            match &mut self.downstream {
                InputPeer::Local(input) => input.do_send(Transfer(event)),
                InputPeer::Remote { channel, link, seq } => {
                    link.data(*channel, *seq, &event);
                    *seq += 1;
                }
            }
        }
    }
}

impl Actor for OutputEndpoint {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Context<Self>) {
        self.producer.do_send(OutputCredit {
            channel: self.producer_channel,
            credits: self.capacity,
        });
    }
}

impl Handler<Push> for OutputEndpoint {
    type Result = ();

    fn handle(&mut self, Push(event): Push, _ctx: &mut Context<Self>) {
        self.link.push(event);
        self.gauge.observe_output(self.link.queued_batches());
        self.pump();
    }
}

impl Handler<PushPriority> for OutputEndpoint {
    type Result = Vec<Batch>;

    fn handle(
        &mut self,
        PushPriority(barrier): PushPriority,
        _ctx: &mut Context<Self>,
    ) -> Vec<Batch> {
        let overtaken = self.link.push_priority(ChannelEvent::Barrier(barrier));
        self.pump();
        overtaken
    }
}

impl Handler<Credit> for OutputEndpoint {
    type Result = ();

    fn handle(&mut self, Credit(credits): Credit, _ctx: &mut Context<Self>) {
        self.link.grant(credits);
        self.pump();
    }
}

pub struct InputEndpoint {
    channel: ChannelId,
    attempt: Attempt,
    consumer: Recipient<Deliver>,
    /// The consumer again, for the unaligned barriers that overtake what
    /// this endpoint holds.
    overtaking: Recipient<DeliverPriority>,
    /// Index of this channel in the consumer's input gate.
    consumer_channel: usize,
    upstream: Option<OutputPeer>,
    receiver: CreditReceiver,
    gauge: Arc<ChannelGauge>,
    failures: Recipient<SubtaskFailed>,
}

impl InputEndpoint {
    pub fn new<C>(
        channel: ChannelId,
        attempt: Attempt,
        consumer: Addr<C>,
        consumer_channel: usize,
        prefetch: u32,
        gauge: Arc<ChannelGauge>,
        failures: Recipient<SubtaskFailed>,
    ) -> Self
    where
        C: Actor<Context = Context<C>> + Handler<Deliver> + Handler<DeliverPriority>,
    {
        InputEndpoint {
            channel,
            attempt,
            overtaking: consumer.clone().recipient(),
            consumer: consumer.recipient(),
            consumer_channel,
            upstream: None,
            receiver: CreditReceiver::new(gauge.input_credits, prefetch),
            gauge,
            failures,
        }
    }

    fn pump(&mut self) {
        while let Some(event) = self.receiver.poll_deliver() {
            self.consumer.do_send(Deliver {
                channel: self.consumer_channel,
                event,
            });
        }
    }

    fn fail(&self, error: impl ToString) {
        self.failures.do_send(SubtaskFailed {
            attempt: self.attempt,
            subtask: self.channel.to,
            error: TaskError::Protocol(format!("channel {}: {}", self.channel, error.to_string())),
        });
    }
}

impl Actor for InputEndpoint {
    type Context = Context<Self>;
}

impl Handler<ConnectUpstream> for InputEndpoint {
    type Result = ();

    fn handle(&mut self, ConnectUpstream(upstream): ConnectUpstream, _ctx: &mut Context<Self>) {
        upstream.grant(self.receiver.initial_credits());
        self.upstream = Some(upstream);
    }
}

impl Handler<Transfer> for InputEndpoint {
    type Result = ();

    /// An unaligned barrier overtakes what this endpoint still holds.
    fn handle(&mut self, Transfer(event): Transfer, _ctx: &mut Context<Self>) {
        if let ChannelEvent::Barrier(barrier) = &event {
            if barrier.options.alignment == Alignment::Unaligned {
                return self.overtaking.do_send(DeliverPriority {
                    channel: self.consumer_channel,
                    barrier: *barrier,
                    overtaken: self.receiver.overtaken(),
                });
            }
        }
        if let Err(e) = self.receiver.receive(event) {
            return self.fail(e);
        }
        self.gauge.observe_input(self.receiver.buffered());
        self.pump();
    }
}

impl Handler<Consumed> for InputEndpoint {
    type Result = ();

    fn handle(&mut self, _: Consumed, _ctx: &mut Context<Self>) {
        match (self.receiver.consumed(), &self.upstream) {
            (Ok(credits), Some(upstream)) => upstream.grant(credits),
            (Ok(_), None) => return self.fail("consumed before the upstream was connected"),
            (Err(e), _) => return self.fail(e),
        }
        self.pump();
    }
}

impl Handler<Stop> for OutputEndpoint {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Stop> for InputEndpoint {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
