//! `RetryInterceptor` on a channel of the official gRPC crate (`grpc` 0.9), against the
//! scripted tonic peer of `tests/common` on 127.0.0.1: unary, client-, server- and
//! bidi-streaming calls, and the A6 rules the tower tests check (throttle, deadline across
//! attempts, hedges cancelled on a win, buffer commit, previous-attempts metadata).
//!
//! Everything runs on the real clock with backoffs of 1-10 ms; assertions are on counts,
//! metadata and bytes, never on durations. `guard` only stops a broken peer from hanging the
//! run. `mock.rs` checks on the paused clock, over a scripted `Invoke`, what `grpc` 0.9's
//! transport does not let a real server show: pushback (it drops the metadata of error
//! trailers) and the losers dropped (it cannot reset an attempt before its headers).

#[path = "../common/mod.rs"]
mod common;
mod lifecycle;
mod mock;
#[path = "../../examples/support/raw_message.rs"]
mod raw_message;
mod recv_timeout;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::pb::{Chunk, Digest, EchoReply, EchoRequest};
use common::{Action, CALL_METADATA, GrpcPeer, Script, expected_previous, spawn_grpc};
use grpc::client::interceptor::InvokeExt as _;
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::RequestHeaders;
use grpc::credentials::LocalChannelCredentials;
use grpc::metadata::MetadataMap;
use grpc::{StatusCodeError, StatusError};
use prost::Message as _;
use raw_message::{Raw, RawReply};
use tonic::Code;
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::grpc_channel::RetryInterceptor;
use tower_retry_hedge::throttle::ThrottleState;
use tower_retry_hedge::{BufferLimits, Policies};

const UNARY: &str = "/test.echo.Echo/Unary";
const CLIENT_STREAM: &str = "/test.echo.Echo/ClientStream";
const SERVER_STREAM: &str = "/test.echo.Echo/ServerStream";
const BIDI: &str = "/test.echo.BidiEcho/Bidi";

/// Fails the test instead of hanging it if a peer or the interceptor misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("the call did not end within the hang guard")
}

/// Both echo services retried (UNAVAILABLE, up to `max_attempts`, backoff 1-10 ms), with
/// `extra` JSON keys at the top level (a throttle).
fn retry_config(max_attempts: u32, extra: &str) -> Policies {
    let json = format!(
        r#"{{
          "methodConfig": [{{
            "name": [{{"service": "test.echo.Echo"}}, {{"service": "test.echo.BidiEcho"}}],
            "retryPolicy": {{
              "maxAttempts": {max_attempts}, "initialBackoff": "0.001s", "maxBackoff": "0.01s",
              "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
            }}
          }}]{extra}
        }}"#
    );
    let config: ServiceConfig = json.parse().expect("valid service config");
    config.policies()
}

fn hedge_config(max_attempts: u32, delay: &str) -> Policies {
    let json = format!(
        r#"{{
          "methodConfig": [{{
            "name": [{{"service": "test.echo.Echo"}}],
            "hedgingPolicy": {{
              "maxAttempts": {max_attempts}, "hedgingDelay": "{delay}",
              "nonFatalStatusCodes": ["UNAVAILABLE"]
            }}
          }}]
        }}"#
    );
    let config: ServiceConfig = json.parse().expect("valid service config");
    config.policies()
}

/// A `grpc` channel to the peer, with the interceptor.
fn channel(peer: &GrpcPeer, policies: &Policies) -> impl Invoke + use<> {
    let channel = Channel::new(
        format!("dns:///{}", peer.addr()),
        Arc::new(LocalChannelCredentials::new()),
        ChannelOptions::default(),
    );
    channel.with_interceptor(RetryInterceptor::new(policies.clone()))
}

/// What the application saw of one call.
#[derive(Debug)]
struct Seen {
    headers: Option<MetadataMap>,
    messages: Vec<Bytes>,
    status: Result<(), StatusError>,
    trailers: MetadataMap,
}

impl Seen {
    fn code(&self) -> Option<StatusCodeError> {
        self.status.as_ref().err().map(StatusError::code)
    }

    /// `grpc-previous-rpc-attempts` on the answer: in its headers, or its trailers.
    fn previous_attempts(&self) -> Option<String> {
        let read = |m: &MetadataMap| {
            m.get("grpc-previous-rpc-attempts")
                .map(|v| v.to_str().to_owned())
        };
        self.headers
            .as_ref()
            .and_then(read)
            .or_else(|| read(&self.trailers))
    }
}

/// Reads a call's receive stream to its end.
async fn read_all(recv: &mut impl RecvStream) -> Seen {
    let mut seen = Seen {
        headers: None,
        messages: Vec::new(),
        status: Ok(()),
        trailers: MetadataMap::new(),
    };
    loop {
        let mut reply = RawReply::default();
        match recv.recv(&mut reply).await {
            ResponseStreamItem::Headers(headers) => seen.headers = Some(headers.metadata().clone()),
            ResponseStreamItem::Message => seen.messages.extend(reply.0),
            ResponseStreamItem::Trailers(trailers) => {
                seen.status = trailers.status().clone();
                seen.trailers = trailers.metadata().clone();
                return seen;
            }
            ResponseStreamItem::StreamClosed => panic!("the stream closed without trailers"),
        }
    }
}

/// A call of `method` sending `requests`, then reading every answer.
async fn call(
    invoker: &impl Invoke,
    method: &str,
    metadata: MetadataMap,
    options: CallOptions,
    requests: Vec<Bytes>,
) -> Seen {
    let headers = RequestHeaders::new()
        .with_method_name(method)
        .with_metadata(metadata);
    let (mut send, mut recv) = invoker.invoke(headers, options).await;
    let last = requests.len();
    for (i, request) in requests.into_iter().enumerate() {
        let options = SendOptions::new().with_final_msg(i + 1 == last);
        if send.send(&Raw(request), options).await.is_err() {
            break;
        }
    }
    drop(send);
    read_all(&mut recv).await
}

/// A unary or server-streaming call of `method` with the echo request of `call`.
async fn echo_call(invoker: &impl Invoke, method: &str, call_id: u32, message: &str) -> Seen {
    let request = vec![echo(call_id, message)];
    guard(call(
        invoker,
        method,
        MetadataMap::new(),
        CallOptions::new(),
        request,
    ))
    .await
}

/// A client-streaming or bidi call of `method` for `call`, sending `requests`.
async fn stream_call(
    invoker: &impl Invoke,
    method: &str,
    call_id: u32,
    requests: Vec<Bytes>,
) -> Seen {
    let metadata = call_metadata(call_id);
    guard(call(
        invoker,
        method,
        metadata,
        CallOptions::new(),
        requests,
    ))
    .await
}

fn echo(call: u32, message: &str) -> Bytes {
    EchoRequest {
        message: message.to_owned(),
        payload: message.as_bytes().to_vec(),
        call,
    }
    .encode_to_vec()
    .into()
}

fn chunk(data: &[u8]) -> Bytes {
    Chunk {
        data: data.to_vec(),
    }
    .encode_to_vec()
    .into()
}

fn call_metadata(call: u32) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert(CALL_METADATA, call.to_string().parse().expect("ascii"));
    metadata
}

#[tokio::test]
async fn a_unary_call_is_retried_until_it_succeeds_with_previous_attempts_on_each() {
    let peer = spawn_grpc(Script::new().call(
        1,
        [
            Action::fail(Code::Unavailable),
            Action::fail(Code::Unavailable),
            Action::Ok,
        ],
    ))
    .await;
    let policies = retry_config(4, "");
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 1, "again").await;

    assert!(seen.status.is_ok(), "{seen:?}");
    let reply = EchoReply::decode(&seen.messages[0][..]).expect("an echo reply");
    assert_eq!(reply.message, "again");
    assert_eq!(reply.attempt, 2, "the third attempt answered");
    assert_eq!(peer.previous_attempts(1), expected_previous(3));
    // The answer says how many attempts came before it.
    assert_eq!(seen.previous_attempts().as_deref(), Some("2"));
    // Every attempt was sent the request, byte for byte.
    for attempt in peer.recorder().attempts(1) {
        assert_eq!(attempt.payload, &b"again"[..]);
    }
    // Two retries, one of which failed.
    let stats = policies.stats().snapshot();
    let unary = &stats.methods[UNARY];
    assert_eq!(
        (unary.retry_attempts, unary.retry_failures),
        (2, 1),
        "{stats:?}"
    );
    peer.shutdown().await;
}

#[tokio::test]
async fn a_fatal_code_ends_the_call_and_max_attempts_bounds_it() {
    let peer = spawn_grpc(
        Script::new()
            .call(1, [Action::fail(Code::InvalidArgument)])
            .call(2, std::iter::repeat_n(Action::fail(Code::Unavailable), 9)),
    )
    .await;
    let policies = retry_config(3, "");
    let invoker = channel(&peer, &policies);

    let fatal = echo_call(&invoker, UNARY, 1, "x").await;
    assert_eq!(fatal.code(), Some(StatusCodeError::InvalidArgument));
    assert_eq!(peer.recorder().attempt_count(1), 1);
    // A call of one attempt is answered as it was: no marks.
    assert_eq!(fatal.previous_attempts(), None);

    let spent = echo_call(&invoker, UNARY, 2, "x").await;
    assert_eq!(spent.code(), Some(StatusCodeError::Unavailable));
    assert_eq!(peer.recorder().attempt_count(2), 3);
    assert_eq!(spent.previous_attempts().as_deref(), Some("2"));
    peer.shutdown().await;
}

#[tokio::test]
async fn a_client_stream_is_replayed_byte_for_byte_to_the_next_attempt() {
    let peer =
        spawn_grpc(Script::new().call(3, [Action::fail(Code::Unavailable), Action::Ok])).await;
    let policies = retry_config(3, "");
    let invoker = channel(&peer, &policies);
    // Varied sizes, an empty chunk among them.
    let parts: Vec<Vec<u8>> = vec![
        b"first".to_vec(),
        Vec::new(),
        vec![0xAB; 3000],
        b"end".to_vec(),
    ];
    let requests = parts.iter().map(|p| chunk(p)).collect();

    let seen = stream_call(&invoker, CLIENT_STREAM, 3, requests).await;

    assert!(seen.status.is_ok(), "{seen:?}");
    let digest = Digest::decode(&seen.messages[0][..]).expect("a digest");
    let all: Vec<u8> = parts.concat();
    assert_eq!(
        digest.sha_or_all, all,
        "the second attempt got every byte, in order"
    );
    assert_eq!(digest.chunks, 4, "every message, the empty one too");
    let attempts = peer.recorder().attempts(3);
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].payload, attempts[1].payload);
    assert_eq!(attempts[1].messages, 4);
    assert_eq!(
        policies.buffer_limits().in_use(),
        0,
        "the buffer is given back"
    );
    peer.shutdown().await;
}

#[tokio::test]
async fn a_client_stream_past_the_buffer_commits_to_its_attempt() {
    let peer =
        spawn_grpc(Script::new().call(4, [Action::fail(Code::Unavailable), Action::Ok])).await;
    let config = retry_config(3, "");
    // 64 bytes per call: the second 50-byte message does not fit.
    let policies = Policies::builder()
        .service(
            "test.echo.Echo",
            config
                .lookup(&http::Method::POST, CLIENT_STREAM)
                .cloned()
                .expect("a policy"),
        )
        .buffer_limits(BufferLimits::new(64, 1 << 20))
        .build();
    let invoker = channel(&peer, &policies);
    let requests = vec![chunk(&[1; 50]), chunk(&[2; 50]), chunk(&[3; 50])];

    let seen = stream_call(&invoker, CLIENT_STREAM, 4, requests).await;

    // Committed: the failure of the only attempt is the answer.
    assert_eq!(seen.code(), Some(StatusCodeError::Unavailable), "{seen:?}");
    let attempts = peer.recorder().attempts(4);
    assert_eq!(attempts.len(), 1, "no attempt after the commit");
    assert_eq!(
        attempts[0].messages, 3,
        "the committed attempt was sent every message"
    );
    assert_eq!(policies.buffer_limits().in_use(), 0);
    peer.shutdown().await;
}

#[tokio::test]
async fn a_server_stream_is_retried_before_its_headers_and_committed_after() {
    let peer = spawn_grpc(
        Script::new()
            .call(5, [Action::fail(Code::Unavailable), Action::Ok])
            .call(6, [Action::FailAfterHeaders(Code::Unavailable)]),
    )
    .await;
    let policies = retry_config(3, "");
    let invoker = channel(&peer, &policies);

    let retried = echo_call(&invoker, SERVER_STREAM, 5, "s").await;
    assert!(retried.status.is_ok(), "{retried:?}");
    assert_eq!(retried.messages.len(), common::SERVER_STREAM_REPLIES);
    assert_eq!(peer.recorder().attempt_count(5), 2);

    // Headers came: the call is committed, and the failure in the trailers is final.
    let committed = echo_call(&invoker, SERVER_STREAM, 6, "s").await;
    assert_eq!(committed.code(), Some(StatusCodeError::Unavailable));
    assert_eq!(committed.messages.len(), 1);
    assert_eq!(peer.recorder().attempt_count(6), 1);
    peer.shutdown().await;
}

#[tokio::test]
async fn a_bidi_stream_is_retried_and_echoes_every_message() {
    let peer =
        spawn_grpc(Script::new().call(7, [Action::fail(Code::Unavailable), Action::Ok])).await;
    let policies = retry_config(3, "");
    let invoker = channel(&peer, &policies);
    let requests = vec![chunk(b"one"), chunk(b"two"), chunk(b"three")];

    let seen = stream_call(&invoker, BIDI, 7, requests.clone()).await;

    assert!(seen.status.is_ok(), "{seen:?}");
    assert_eq!(seen.messages, requests, "every chunk echoed, in order");
    assert_eq!(peer.recorder().attempt_count(7), 2);
    assert_eq!(peer.previous_attempts(7), expected_previous(2));
    peer.shutdown().await;
}

#[tokio::test]
async fn the_throttle_stops_retries_when_its_tokens_run_low() {
    // 4 tokens; a failure takes one; retries go while more than half (2) are left.
    let peer = spawn_grpc(Script::always(Action::fail(Code::Unavailable))).await;
    let policies = retry_config(
        5,
        r#", "retryThrottling": {"maxTokens": 4, "tokenRatio": 1}"#,
    );
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 8, "t").await;

    assert_eq!(seen.code(), Some(StatusCodeError::Unavailable));
    // 4 → 3 (retry) → 2 (no more).
    assert_eq!(peer.recorder().attempt_count(8), 2);
    let state = policies.throttle_state().expect("a throttle");
    assert!(
        matches!(state, ThrottleState::Bucket { tokens, .. } if tokens == 2.0),
        "{state:?}"
    );
    peer.shutdown().await;
}

#[tokio::test]
async fn the_deadline_spans_the_attempts_and_each_is_told_the_time_left() {
    let peer = spawn_grpc(Script::new().call(
        9,
        [
            Action::fail(Code::Unavailable),
            Action::fail(Code::Unavailable),
            Action::Hang,
        ],
    ))
    .await;
    let policies = retry_config(5, "");
    let invoker = channel(&peer, &policies);
    let mut options = CallOptions::new();
    options.set_deadline(std::time::Instant::now() + Duration::from_millis(300));

    let seen = guard(call(
        &invoker,
        UNARY,
        MetadataMap::new(),
        options,
        vec![echo(9, "hurry")],
    ))
    .await;

    assert_eq!(
        seen.code(),
        Some(StatusCodeError::DeadlineExceeded),
        "{seen:?}"
    );
    guard(peer.recorder().wait_for_cancelled(9, 1)).await;
    let attempts = peer.recorder().attempts(9);
    assert_eq!(attempts.len(), 3, "no attempt after the deadline");
    let timeouts: Vec<Duration> = attempts
        .iter()
        .map(|a| {
            let header = a
                .grpc_timeout
                .as_deref()
                .expect("each attempt is told its deadline");
            let value = http::HeaderValue::from_str(header).expect("a header value");
            tower_retry_hedge::grpc_timeout::parse(&value).expect("a valid grpc-timeout")
        })
        .collect();
    assert!(timeouts[0] <= Duration::from_millis(300), "{timeouts:?}");
    assert!(
        timeouts[1] < timeouts[0] && timeouts[2] < timeouts[1],
        "{timeouts:?}"
    );
    peer.shutdown().await;
}

#[tokio::test]
async fn a_hedge_wins_and_the_call_does_not_wait_for_the_others() {
    // The first attempt hangs; the hedge sent 20 ms later answers. Two attempts at most, so
    // that the count the answer carries (every attempt made, A6) is known: on the real
    // clock, a third hedge may or may not have gone out before the win.
    let peer = spawn_grpc(Script::new().call(10, [Action::Hang, Action::Ok])).await;
    let policies = hedge_config(2, "0.02s");
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 10, "h").await;

    assert!(seen.status.is_ok(), "{seen:?}");
    let reply = EchoReply::decode(&seen.messages[0][..]).expect("an echo reply");
    assert_eq!(reply.attempt, 1, "the hedge answered");
    assert_eq!(seen.previous_attempts().as_deref(), Some("1"));
    let attempts = peer.recorder().attempts(10);
    assert_eq!(
        attempts[0].outcome, None,
        "the first attempt still hangs: {attempts:#?}"
    );
    assert_eq!(attempts[1].previous_attempts.as_deref(), Some("1"));
    // `grpc` 0.9 cannot reset an attempt that has no response headers yet (dropping its
    // receive stream only ends its request stream), so the server sees no cancellation;
    // that the interceptor drops the losers is checked in `mock.rs`.
    peer.shutdown().await;
}

#[tokio::test]
async fn a_non_fatal_failure_sends_the_next_hedge_at_once() {
    // A hedging delay of 100 s: only the failure's rule can send the second attempt in time.
    let peer =
        spawn_grpc(Script::new().call(11, [Action::fail(Code::Unavailable), Action::Ok])).await;
    let policies = hedge_config(3, "100s");
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 11, "n").await;

    assert!(seen.status.is_ok(), "{seen:?}");
    assert_eq!(peer.recorder().attempt_count(11), 2);
    assert_eq!(peer.previous_attempts(11), expected_previous(2));
    peer.shutdown().await;
}

#[tokio::test]
async fn a_method_without_a_policy_is_neither_retried_nor_hedged() {
    let peer = spawn_grpc(Script::always(Action::fail(Code::Unavailable))).await;
    let policies = hedge_config(3, "0.005s");
    let invoker = channel(&peer, &policies);

    // BidiEcho has no policy in this table.
    let seen = stream_call(&invoker, BIDI, 12, vec![chunk(b"x")]).await;

    assert_eq!(seen.code(), Some(StatusCodeError::Unavailable));
    assert_eq!(peer.recorder().attempt_count(12), 1);
    peer.shutdown().await;
}
