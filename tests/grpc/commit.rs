//! A committed call gives its replay buffer back at once, over a real tonic channel, while its
//! request stream goes on: a bidi call committed by its response headers, and 200
//! client-streaming calls committed by outgrowing their per-call limit, which must leave the
//! shared budget to a retryable unary call made while they are all still in flight.
//!
//! The request streams are fed through channels by the test while tonic's connection task
//! sends them, as a program streaming an upload would.

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::AsciiMetadataValue;
use tower::ServiceBuilder;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{BufferLimits, Policies, RetryLayer};

use super::common::pb::Chunk;
use super::common::pb::bidi_echo_client::BidiEchoClient;
use super::common::pb::echo_client::EchoClient;
use super::common::{Action, CALL_METADATA, Method, Outcome, Script, spawn_grpc};
use super::{SERVICE, chunks, echo, guard, metadata_str, retry_policy};

const BIDI_SERVICE: &str = "test.echo.BidiEcho";
/// The size of every chunk the streams below send.
const CHUNK: usize = 1000;

/// A request whose stream is fed, chunk by chunk, through the returned sender.
fn fed_request(call: u32) -> (mpsc::Sender<Chunk>, tonic::Request<ReceiverStream<Chunk>>) {
    let (sender, receiver) = mpsc::channel(4);
    let mut request = tonic::Request::new(ReceiverStream::new(receiver));
    request
        .metadata_mut()
        .insert(CALL_METADATA, AsciiMetadataValue::from(call));
    (sender, request)
}

#[tokio::test]
async fn a_bidi_call_committed_by_its_headers_records_nothing_while_it_streams_on() {
    // The peer answers with headers once the first chunk has arrived, then echoes every chunk.
    // 64 KiB per call: the 51 000 bytes sent never outgrow it, so only the headers commit.
    let peer = spawn_grpc(Script::new()).await;
    let policies = Policies::builder()
        .service(BIDI_SERVICE, retry_policy(3))
        .buffer_limits(BufferLimits::new(64 * 1024, 1024 * 1024))
        .build();
    let limits = policies.buffer_limits().clone();
    let mut client = BidiEchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies.clone()))
            .service(peer.channel().await),
    );
    let (all, sent) = chunks(51 * CHUNK, CHUNK, 0xb1d1);
    let mut all = all.into_iter();
    let (sender, request) = fed_request(1);
    sender
        .send(all.next().expect("a first chunk"))
        .await
        .expect("the stream is open");

    let response = guard(client.bidi(request)).await.expect("response headers");
    assert_eq!(response.extensions().get::<Attempts>(), None, "one attempt");
    assert!(
        limits.in_use() <= CHUNK,
        "committed by its headers, the call holds {} bytes",
        limits.in_use()
    );
    let mut echoes = response.into_inner();
    let first = guard(echoes.message())
        .await
        .expect("an echo")
        .expect("not the end");
    let mut echoed = first.data;

    // 50 chunks more: each is checked back through the echo, so it has left the client's
    // body, and the buffer is checked at every step.
    let (feed, mut fed) = mpsc::unbounded_channel();
    let pump = tokio::spawn(async move {
        for chunk in all {
            if sender.send(chunk).await.is_err() {
                return;
            }
            // One chunk at a time: the next goes once the test has seen this one echoed.
            if fed.recv().await.is_none() {
                return;
            }
        }
    });
    let mut peak = limits.in_use();
    for _ in 0..50 {
        let echo = guard(echoes.message())
            .await
            .expect("an echo")
            .expect("not the end");
        assert_eq!(echo.data.len(), CHUNK);
        echoed.extend_from_slice(&echo.data);
        peak = peak.max(limits.in_use());
        assert!(
            limits.in_use() <= CHUNK,
            "the buffer holds {} bytes after {} bytes were streamed",
            limits.in_use(),
            echoed.len()
        );
        let _ = feed.send(());
    }
    guard(pump).await.expect("the pump ends");
    assert!(
        guard(echoes.message())
            .await
            .expect("the call ends well")
            .is_none(),
        "no echo more than the chunks sent"
    );
    assert_eq!(limits.in_use(), 0, "nothing left once the call is over");
    assert!(peak <= CHUNK, "at most one chunk at any time: {peak} bytes");

    assert!(echoed == sent, "the echoes differ from what was sent");
    let attempts = peer.recorder().attempts(1);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].method, Method::Bidi);
    assert_eq!(attempts[0].messages, 51);
    assert!(
        attempts[0].payload.as_ref() == sent.as_slice(),
        "the server received different bytes"
    );
    assert_eq!(attempts[0].outcome, Some(Outcome::Ok));
    guard(peer.shutdown()).await;
}

/// How many client-streaming calls stay open at once.
const OPEN_CALLS: u32 = 200;
/// The call number of the unary call made while they are open.
const UNARY_CALL: u32 = 1_000;

#[tokio::test]
async fn two_hundred_committed_streams_in_flight_leave_the_budget_to_a_retry() {
    // A client-streaming call is answered once its stream ends, so what commits these calls
    // while they are open is their body: 3 chunks of 1000 bytes (1008 on the wire each)
    // outgrow the 2 KiB per-call limit. The 64 KiB total could hold the records of about 30
    // such calls; kept after their commit, the records of 200 would exhaust it, and the unary
    // call below could not record its body, so could not be retried.
    let script = Script::new().call(UNARY_CALL, [Action::fail(Code::Unavailable), Action::Ok]);
    let peer = spawn_grpc(script).await;
    let policies = Policies::builder()
        .service(SERVICE, retry_policy(3))
        .buffer_limits(BufferLimits::new(2 * 1024, 64 * 1024))
        .build();
    let limits = policies.buffer_limits().clone();
    let client = EchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies.clone()))
            .service(peer.channel().await),
    );

    // One call after another, one chunk at a time, each chunk seen by the peer before the
    // next is sent (tonic would otherwise send chunks that are ready together as one frame):
    // each call records 2 chunks, and its third commits it.
    let mut open = JoinSet::new();
    let mut senders = Vec::new();
    let mut bodies = Vec::new();
    for call in 0..OPEN_CALLS {
        let (chunks, sent) = chunks(3 * CHUNK, CHUNK, call);
        let (sender, request) = fed_request(call);
        let mut client = client.clone();
        open.spawn(async move { (call, client.client_stream(request).await) });
        for (n, chunk) in chunks.into_iter().enumerate() {
            sender.send(chunk).await.expect("the stream is open");
            guard(
                peer.recorder()
                    .wait_until(|all| all.iter().any(|a| a.call == call && a.messages == n + 1)),
            )
            .await;
        }
        assert!(
            limits.in_use() <= CHUNK,
            "call {call} is committed, yet the calls hold {} bytes",
            limits.in_use()
        );
        senders.push(sender);
        bodies.push(sent);
    }
    assert!(
        limits.in_use() <= CHUNK,
        "{OPEN_CALLS} committed calls hold {} bytes of the budget",
        limits.in_use()
    );
    assert!(open.try_join_next().is_none(), "every stream is still open");

    // A retryable unary call, made while all of them are in flight.
    let mut unary = client.clone();
    let response = guard(unary.unary(echo(UNARY_CALL, "still retried")))
        .await
        .expect("the second attempt succeeds");
    assert_eq!(
        response.extensions().get::<Attempts>(),
        Some(&Attempts::new(2, 0))
    );
    assert_eq!(
        metadata_str(response.metadata(), "grpc-previous-rpc-attempts"),
        Some("1")
    );
    assert_eq!(response.into_inner().message, "still retried");
    let attempts = peer.recorder().attempts(UNARY_CALL);
    assert_eq!(attempts.len(), 2, "the server saw exactly 2 attempts");
    assert_eq!(
        attempts[1].previous_attempts.as_deref(),
        Some("1"),
        "the retry carries its attempt count"
    );
    assert!(open.try_join_next().is_none(), "every stream is still open");

    // The streams end; each was sent once, byte for byte.
    drop(senders);
    let mut ended = 0;
    while let Some(joined) = guard(open.join_next()).await {
        let (call, result) = joined.expect("the call task ends");
        let digest = result.expect("the stream is answered").into_inner();
        assert!(
            digest.sha_or_all == bodies[call as usize],
            "call {call}: the peer received different bytes"
        );
        ended += 1;
    }
    assert_eq!(ended, OPEN_CALLS);
    for call in 0..OPEN_CALLS {
        assert_eq!(peer.recorder().attempt_count(call), 1, "call {call}");
    }
    assert_eq!(limits.in_use(), 0);
    guard(peer.shutdown()).await;
}
