//! Messages between the actors of a running job.

use crate::endpoint::{InputEndpoint, OutputEndpoint};
use actix::{Addr, Message};
use tidemark::error::TaskError;
use tidemark::event::ChannelEvent;
use tidemark::ids::SubtaskId;

/// Output endpoint → its producer subtask: room for `credits` more batches.
#[derive(Message)]
#[rtype(result = "()")]
pub struct OutputCredit {
    pub channel: usize,
    pub credits: u32,
}

/// Producer subtask → output endpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Push(pub ChannelEvent);

/// Output endpoint → input endpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Transfer(pub ChannelEvent);

/// Input endpoint → output endpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Credit(pub u32);

/// Input endpoint → consumer subtask.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deliver {
    pub channel: usize,
    pub event: ChannelEvent,
}

/// Consumer subtask → input endpoint: a delivered batch was processed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Consumed;

/// Closes the cycle between an input endpoint and its sender.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ConnectUpstream(pub Addr<OutputEndpoint>);

/// Supervisor → subtask: its endpoints exist; start.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wire {
    pub outputs: Vec<Addr<OutputEndpoint>>,
    pub inputs: Vec<Addr<InputEndpoint>>,
}

/// Source subtask → itself: read the next batch.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Produce;

/// Subtask → supervisor: end of input processed and handed downstream.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubtaskFinished(pub SubtaskId);

/// Any actor → supervisor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubtaskFailed {
    pub subtask: SubtaskId,
    pub error: TaskError,
}

/// Job handle → supervisor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel;
