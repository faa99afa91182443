//! A link's end against a peer that misbehaves, over a real loopback
//! socket: each way a link can break fails its attempt, named.

use super::*;
use actix::System;
use std::io::Write;
use tidemark_core::model::ids::{JobId, OperatorId, SubtaskIndex};

const JOB: JobId = JobId(7);
const ATTEMPT: Attempt = Attempt(3);

/// Stands in for the supervisor: hands on what it is told.
struct Failures(mpsc::UnboundedSender<SubtaskFailed>);

impl Actor for Failures {
    type Context = Context<Self>;
}

impl Handler<SubtaskFailed> for Failures {
    type Result = ();

    fn handle(&mut self, failed: SubtaskFailed, _ctx: &mut Context<Self>) {
        let _ = self.0.send(failed);
    }
}

fn subtask(operator: u32, index: u32) -> SubtaskId {
    SubtaskId {
        operator: OperatorId(operator),
        index: SubtaskIndex(index),
    }
}

fn channel() -> ChannelId {
    ChannelId {
        from: subtask(0, 1),
        to: subtask(1, 0),
    }
}

/// Starts worker 0's end of a link to worker 1, and hands worker 1's raw
/// socket to `peer`, blocking; returns the first failure reported.
fn first_failure(peer: impl FnOnce(std::net::TcpStream) + Send + 'static) -> SubtaskFailed {
    accepted_first_failure(Vec::new(), peer)
}

/// As `first_failure`, for an end that its acceptor had read `read` from.
fn accepted_first_failure(
    read: Vec<u8>,
    peer: impl FnOnce(std::net::TcpStream) + Send + 'static,
) -> SubtaskFailed {
    System::new().block_on(async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let failures = Failures(tx).start().recipient();
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().unwrap();
        let hello = Hello {
            job: JOB,
            epoch: 1,
            attempt: ATTEMPT,
            from: 0,
            to: 1,
        };
        ours.set_nonblocking(true).unwrap();
        let ours = tokio::net::TcpStream::from_std(ours).unwrap();
        let ours = LinkEnd::opened(Box::new(ours), read, hello, &failures);
        let _link = LinkActor::new(ours, Arc::default(), Arc::default(), subtask(1, 0)).start();
        let peer = std::thread::spawn(move || peer(stream));
        // A guard against a link that never reports, not a timing: the
        // failure comes as soon as the peer's bytes or close arrive.
        let failed = tokio::time::timeout(std::time::Duration::from_secs(60), rx.recv())
            .await
            .expect("a failure within a minute")
            .expect("the failure recipient lives");
        peer.join().unwrap();
        failed
    })
}

/// The hello of worker `from`'s end.
fn hello(attempt: Attempt, from: u32, to: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    wire::encode_hello(
        &Hello {
            job: JOB,
            epoch: 1,
            attempt,
            from,
            to,
        },
        &mut bytes,
    );
    bytes
}

fn assert_failure(failed: &SubtaskFailed, wanted: &str) {
    assert_eq!(failed.attempt, ATTEMPT);
    assert_eq!(failed.subtask, subtask(1, 0), "the subtask the link feeds");
    let error = failed.error.to_string();
    assert!(
        error.contains("link of worker 0 to worker 1") && error.contains(wanted),
        "{error}"
    );
}

/// A worker that dies closes its sockets: its peers fail the attempt
/// instead of waiting for an end of partition that never comes. (With our
/// hello unread, the peer's close would reset the connection instead: a
/// failure too, reported as a read error.)
#[test]
fn a_peer_that_closes_the_link_fails_the_attempt() {
    let failed = first_failure(|mut stream| {
        let expected = hello(ATTEMPT, 0, 1);
        let mut ours = vec![0; expected.len()];
        std::io::Read::read_exact(&mut stream, &mut ours).unwrap();
        assert_eq!(ours, expected);
        let mut half = hello(ATTEMPT, 1, 0);
        half.extend_from_slice(&[0, 0, 0, 9, 1]);
        stream.write_all(&half).unwrap();
    });
    assert_failure(
        &failed,
        "the peer closed the link (5 bytes of a frame pending)",
    );
}

/// What the acceptor read with the peer's hello is decoded at once, not
/// once more bytes come: here a frame for a channel the link does not
/// carry, from a peer that then waits.
#[test]
fn frames_read_with_the_hello_are_handled_before_the_next_read() {
    let mut read = hello(ATTEMPT, 1, 0);
    wire::encode_credit(channel(), 1, &mut read);
    let failed = accepted_first_failure(read, |mut stream| {
        let mut ours = [0; 64];
        // Our hello, then nothing until the link fails and closes.
        let _ = std::io::Read::read(&mut stream, &mut ours);
        let _ = std::io::Read::read(&mut stream, &mut ours);
    });
    assert_failure(&failed, "which does not cross here");
}

#[test]
fn a_peer_of_another_attempt_is_refused() {
    let failed = first_failure(|mut stream| {
        stream.write_all(&hello(Attempt(2), 1, 0)).unwrap();
        let _ = std::io::Read::read(&mut stream, &mut [0; 64]);
    });
    assert_failure(&failed, "introduced itself");
}

#[test]
fn a_frame_before_the_hello_is_refused() {
    let failed = first_failure(|mut stream| {
        let mut credit = Vec::new();
        wire::encode_credit(channel(), 1, &mut credit);
        stream.write_all(&credit).unwrap();
        let _ = std::io::Read::read(&mut stream, &mut [0; 64]);
    });
    assert_failure(&failed, "a frame before the peer's hello");
}

#[test]
fn a_frame_out_of_sequence_or_for_a_channel_not_here_is_refused() {
    for (seq, wanted) in [
        (1, "frame 1 arrived where 0 was due"),
        (0, "does not cross here"),
    ] {
        let failed = first_failure(move |mut stream| {
            let mut bytes = hello(ATTEMPT, 1, 0);
            wire::encode_data(channel(), seq, &ChannelEvent::Watermark(1), &mut bytes).unwrap();
            stream.write_all(&bytes).unwrap();
            let _ = std::io::Read::read(&mut stream, &mut [0; 64]);
        });
        assert_failure(&failed, wanted);
    }
}
