//! What flows through a job and how it is addressed: ids, the
//! [`graph::JobGraph`], key groups and key hashing, batches and channel
//! events, the positions of index sources' splits, credit-based flow
//! control on a channel and the input gate over a subtask's channels. The
//! bottom of the core: it imports no other group.

pub mod batch;
pub mod channel;
pub mod event;
pub mod gate;
pub mod graph;
pub mod ids;
pub mod key_group;
pub mod key_hash;
pub mod rng;
pub mod split;
