//! Self-tests of the shared network peers in `tests/common`: they must behave
//! as scripted before any other test can trust them.
//!
//! These run on the real clock (a paused clock would auto-advance while the
//! runtime waits on sockets), assert on no durations, and wait on the
//! recorder rather than sleeping. `guard` only stops a broken peer from
//! hanging the test run.

#[path = "../common/mod.rs"]
mod common;

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::pb::echo_client::EchoClient;
use common::pb::{Chunk, EchoRequest};
use common::{
    Action, HttpAction, HttpOutcome, HttpScript, Method, Outcome, Script, http_client,
    http2_client, spawn_grpc, spawn_http,
};
use http::{Request, StatusCode, Version};
use http_body::{Body as _, Frame};
use http_body_util::{BodyExt as _, Empty, Full, StreamBody};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;

/// Fails the test instead of hanging it if a peer misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("peer did not answer within the hang guard")
}

fn request(call: u32, message: &str, payload: &[u8]) -> EchoRequest {
    EchoRequest {
        message: message.to_owned(),
        payload: payload.to_vec(),
        call,
    }
}

#[test]
fn script_applies_default_past_the_end() {
    let script = Script::new().call(1, [Action::fail(Code::Unavailable), Action::Hang]);
    assert_eq!(script.action(1, 0), Action::fail(Code::Unavailable));
    assert_eq!(script.action(1, 1), Action::Hang);
    assert_eq!(script.action(1, 2), Action::Ok);
    assert_eq!(script.action(2, 0), Action::Ok);
    let always = Script::always(Action::fail(Code::Internal));
    assert_eq!(always.action(9, 4), Action::fail(Code::Internal));

    let http = HttpScript::new()
        .call("a", [HttpAction::retry_after(503, "2")])
        .otherwise(HttpAction::status(500));
    assert_eq!(
        http.action("a", 0),
        HttpAction::Status {
            status: 503,
            headers: vec![("retry-after".to_owned(), "2".to_owned())],
        }
    );
    assert_eq!(http.action("a", 1), HttpAction::status(500));
    assert_eq!(
        HttpAction::delay(Duration::from_millis(1), HttpAction::status(429)).header("x", "y"),
        HttpAction::delay(
            Duration::from_millis(1),
            HttpAction::status(429).header("x", "y")
        )
    );
}

#[tokio::test]
async fn grpc_unavailable_carries_pushback_and_attempts_are_recorded() {
    let peer = spawn_grpc(Script::new().call(
        0,
        [
            Action::pushback(Code::Unavailable, "25"),
            Action::delay(Duration::from_millis(1), Action::Ok),
        ],
    ))
    .await;
    let mut client = EchoClient::new(peer.channel().await);

    let mut first = tonic::Request::new(request(0, "hello", b"\x00\x01\xff"));
    first
        .metadata_mut()
        .insert("grpc-timeout", MetadataValue::from_static("30S"));
    let status = guard(client.unary(first))
        .await
        .expect_err("attempt 0 is scripted to fail");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().expect("ascii")),
        Some("25")
    );

    let mut second = tonic::Request::new(request(0, "hello", b"\x00\x01\xff"));
    second.metadata_mut().insert(
        "grpc-previous-rpc-attempts",
        MetadataValue::from_static("1"),
    );
    let reply = guard(client.unary(second))
        .await
        .expect("attempt 1 is scripted to succeed")
        .into_inner();
    assert_eq!(reply.message, "hello");
    assert_eq!(reply.payload, b"\x00\x01\xff");
    assert_eq!(reply.attempt, 1);

    let recorder = peer.recorder();
    let attempts = recorder.attempts(0);
    assert_eq!(attempts.len(), 2);
    assert_eq!(recorder.total_attempts(), 2);
    assert_eq!(recorder.cancelled(0), 0);
    assert_eq!(attempts[0].attempt, 0);
    assert_eq!(attempts[0].method, Method::Unary);
    assert_eq!(attempts[0].previous_attempts, None);
    assert_eq!(attempts[0].grpc_timeout.as_deref(), Some("30S"));
    assert_eq!(
        attempts[0].outcome,
        Some(Outcome::Status {
            code: Code::Unavailable,
            pushback: Some("25".to_owned()),
        })
    );
    assert_eq!(attempts[1].attempt, 1);
    assert_eq!(attempts[1].previous_attempts.as_deref(), Some("1"));
    assert_eq!(attempts[1].grpc_timeout, None);
    assert_eq!(attempts[1].payload.as_ref(), b"\x00\x01\xff");
    assert_eq!(attempts[1].message, "hello");
    assert_eq!(attempts[1].outcome, Some(Outcome::Ok));
    assert!(attempts[1].arrived >= attempts[0].arrived);
    assert!(attempts.iter().all(|a| a.ended.is_some() && !a.cancelled));

    // The client still holds its connection: shutdown must close it anyway.
    guard(peer.shutdown()).await;
}

/// The error is Trailers-Only on the wire: `grpc-status` and the pushback in
/// the response headers, which end the stream. Checked with a raw HTTP/2
/// client because tonic's client hides the difference.
#[tokio::test]
async fn grpc_failure_is_trailers_only_on_the_wire() {
    let peer = spawn_grpc(Script::always(Action::pushback(
        Code::ResourceExhausted,
        "-1",
    )))
    .await;
    let message = request(5, "raw", b"xyz").encode_to_vec();
    let mut framed = BytesMut::new();
    framed.extend_from_slice(&[0]);
    framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&message);
    let raw = Request::post(format!("{}/test.echo.Echo/Unary", peer.uri()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(framed.freeze()))
        .expect("request");

    let client = http2_client::<Full<Bytes>>();
    let response = guard(client.request(raw)).await.expect("http/2 exchange");
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(
        headers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"8"[..])
    );
    assert_eq!(
        headers.get("grpc-retry-pushback-ms").map(|v| v.as_bytes()),
        Some(&b"-1"[..])
    );
    assert!(
        response.body().is_end_stream(),
        "no body after Trailers-Only headers"
    );

    let attempts = peer.recorder().attempts(5);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].payload.as_ref(), b"xyz");
    drop(response);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn grpc_client_stream_records_every_byte() {
    let peer = spawn_grpc(Script::new()).await;
    let mut client = EchoClient::new(peer.channel().await);
    let chunks: Vec<Vec<u8>> = vec![
        (0..=255).collect(),
        Vec::new(),
        vec![0; 7],
        (0..100_000u32).map(|i| (i % 251) as u8).collect(),
        b"end".to_vec(),
    ];
    let expected: Vec<u8> = chunks.concat();

    let stream = tokio_stream::iter(chunks.clone().into_iter().map(|data| Chunk { data }));
    let mut call = tonic::Request::new(stream);
    call.metadata_mut()
        .insert("x-call", MetadataValue::from_static("7"));
    let digest = guard(client.client_stream(call))
        .await
        .expect("scripted Ok")
        .into_inner();
    assert_eq!(digest.bytes, expected.len() as u64);
    assert_eq!(digest.chunks, chunks.len() as u64);
    assert!(digest.sha_or_all == expected, "digest bytes differ");

    let attempts = peer.recorder().attempts(7);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].method, Method::ClientStream);
    assert_eq!(attempts[0].messages, chunks.len());
    assert!(attempts[0].payload == expected, "recorded bytes differ");
    assert_eq!(attempts[0].outcome, Some(Outcome::Ok));
    assert_eq!(peer.recorder().attempt_count(0), 0);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn grpc_hang_then_client_drop_records_cancellation() {
    let peer = spawn_grpc(Script::new().call(3, [Action::Hang])).await;
    let recorder = peer.recorder();
    let mut client = EchoClient::new(peer.channel().await);

    // Dropping the pending call (when the attempt has arrived) resets its stream.
    tokio::select! {
        result = client.unary(request(3, "wait", b"")) => panic!("hang answered: {result:?}"),
        () = guard(recorder.wait_for_attempts(3, 1)) => {}
    }
    guard(recorder.wait_for_cancelled(3, 1)).await;

    let attempts = recorder.attempts(3);
    assert_eq!(attempts.len(), 1);
    assert!(attempts[0].cancelled);
    assert!(attempts[0].ended.is_some());
    assert_eq!(attempts[0].outcome, None);
    assert_eq!(recorder.total_cancelled(), 1);

    // The connection is still usable afterwards.
    let reply = guard(client.unary(request(4, "after", b"")))
        .await
        .expect("call 4 defaults to Ok");
    assert_eq!(reply.into_inner().attempt, 0);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn grpc_shutdown_releases_a_hanging_attempt() {
    let peer = spawn_grpc(Script::always(Action::Hang)).await;
    let recorder = peer.recorder();
    let mut client = EchoClient::new(peer.channel().await);
    let pending = tokio::spawn(async move { client.unary(request(0, "", b"")).await });
    guard(recorder.wait_for_attempts(0, 1)).await;

    guard(peer.shutdown()).await;
    let status = guard(pending)
        .await
        .expect("client task")
        .expect_err("released with an error");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(recorder.attempts(0)[0].outcome, Some(Outcome::ShutDown));
    assert!(!recorder.attempts(0)[0].cancelled);
}

#[tokio::test]
async fn grpc_server_stream_fails_after_headers() {
    let peer = spawn_grpc(
        Script::new()
            .call(1, [Action::FailAfterHeaders(Code::Aborted)])
            .call(2, [Action::Ok]),
    )
    .await;
    let mut client = EchoClient::new(peer.channel().await);

    let mut stream = guard(client.server_stream(request(1, "s", b"p")))
        .await
        .expect("headers arrive: the call is committed")
        .into_inner();
    let first = guard(stream.message())
        .await
        .expect("one message")
        .expect("not the end");
    assert_eq!(first.message, "s");
    let status = guard(stream.message()).await.expect_err("then the error");
    assert_eq!(status.code(), Code::Aborted);

    let mut ok = guard(client.server_stream(request(2, "s", b"p")))
        .await
        .expect("ok")
        .into_inner();
    let mut replies = 0;
    while let Some(reply) = guard(ok.message()).await.expect("no error") {
        assert_eq!(reply.payload, b"p");
        replies += 1;
    }
    assert_eq!(replies, common::SERVER_STREAM_REPLIES);

    let recorder = peer.recorder();
    assert_eq!(
        recorder.attempts(1)[0].outcome,
        Some(Outcome::MessageThenStatus(Code::Aborted))
    );
    assert_eq!(recorder.attempts(1)[0].method, Method::ServerStream);
    assert_eq!(recorder.attempts(2)[0].outcome, Some(Outcome::Ok));
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn http_503_with_retry_after_reaches_the_client() {
    let peer = spawn_http(
        HttpScript::new()
            .call("h1", [HttpAction::retry_after(503, "2")])
            .call(
                "h2",
                [HttpAction::retry_after(
                    503,
                    "Fri, 31 Dec 1999 23:59:59 GMT",
                )],
            ),
    )
    .await;
    let h1 = http_client::<Full<Bytes>>();
    let h2 = http2_client::<Full<Bytes>>();

    for (call, retry_after, version) in [
        ("h1", "2", Version::HTTP_11),
        ("h2", "Fri, 31 Dec 1999 23:59:59 GMT", Version::HTTP_2),
    ] {
        let client = if version == Version::HTTP_2 { &h2 } else { &h1 };
        for attempt in 0..2u8 {
            let request = Request::post(peer.url("/route?q=1"))
                .header("x-call", call)
                .header("x-attempt", attempt.to_string())
                .body(Full::from(format!("body {attempt}")))
                .expect("request");
            let response = guard(client.request(request)).await.expect("exchange");
            assert_eq!(response.version(), version);
            let headers = response.headers().clone();
            assert_eq!(headers["x-peer-call"], call);
            assert_eq!(headers["x-peer-attempt"], attempt.to_string().as_str());
            let body = guard(response.into_body().collect())
                .await
                .expect("body")
                .to_bytes();
            if attempt == 0 {
                assert_eq!(headers["retry-after"], retry_after);
                assert!(body.is_empty());
            } else {
                assert!(!headers.contains_key("retry-after"));
                assert_eq!(body, format!("body {attempt}"));
            }
        }
        let attempts = peer.recorder().attempts(call);
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0].outcome, Some(HttpOutcome::Status(503)));
        assert_eq!(attempts[1].outcome, Some(HttpOutcome::Status(200)));
        assert_eq!(attempts[1].method, http::Method::POST);
        assert_eq!(attempts[1].path, "/route?q=1");
        assert_eq!(attempts[1].version, version);
        assert_eq!(attempts[1].header("x-attempt"), Some("1"));
        assert_eq!(attempts[1].body, "body 1");
        assert!(attempts[1].body_complete);
    }
    guard(peer.shutdown()).await;
}

/// The body is recorded as it streams in, frame by frame, and ends exact.
#[tokio::test]
async fn http_streaming_body_is_recorded_exactly() {
    let peer = spawn_http(HttpScript::new()).await;
    let recorder = peer.recorder();
    let pieces: [&[u8]; 4] = [b"first,", b"", &[0, 255, 13, 10], b"last"];

    for (call, http2) in [("h1", false), ("h2", true)] {
        let (frames, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
        let body = StreamBody::new(ReceiverStream::new(rx));
        let client = if http2 {
            http2_client::<StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>>()
        } else {
            http_client()
        };
        let request = Request::put(peer.url("/upload"))
            .header("x-call", call)
            .header("te", "trailers")
            .body(body)
            .expect("request");
        let exchange = tokio::spawn(async move { client.request(request).await });

        let mut sent = Vec::new();
        for piece in pieces {
            frames
                .send(Ok(Frame::data(Bytes::from_static(piece))))
                .await
                .expect("body open");
            sent.extend_from_slice(piece);
            let expected = sent.clone();
            // The peer records what arrived so far before the body ends.
            guard(
                recorder.wait_until(|all| all.iter().any(|r| r.call == call && r.body == expected)),
            )
            .await;
        }
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("42"));
        if http2 {
            frames
                .send(Ok(Frame::trailers(trailers.clone())))
                .await
                .expect("body open");
        }
        drop(frames);

        let response = guard(exchange).await.expect("task").expect("exchange");
        assert_eq!(response.status(), StatusCode::OK);
        let echoed = guard(response.into_body().collect())
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(echoed, sent);

        let attempts = recorder.attempts(call);
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].body, sent);
        assert!(attempts[0].body_complete);
        assert!(!attempts[0].cancelled);
        if http2 {
            assert_eq!(attempts[0].trailers.as_ref(), Some(&trailers));
        }
    }
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn http_hang_then_client_drop_records_cancellation() {
    let peer = spawn_http(HttpScript::always(HttpAction::Hang)).await;
    let recorder = peer.recorder();
    // HTTP/2 resets the stream; HTTP/1.1 closes the connection.
    for (call, client) in [
        ("h2", http2_client::<Empty<Bytes>>()),
        ("h1", http_client::<Empty<Bytes>>()),
    ] {
        let request = Request::get(peer.url("/slow"))
            .header("x-call", call)
            .body(Empty::new())
            .expect("request");
        tokio::select! {
            result = client.request(request) => panic!("hang answered: {result:?}"),
            () = guard(recorder.wait_for_attempts(call, 1)) => {}
        }
        guard(recorder.wait_for_cancelled(call, 1)).await;
        let attempts = recorder.attempts(call);
        assert!(attempts[0].cancelled);
        assert_eq!(attempts[0].outcome, None);
        assert!(attempts[0].body_complete);
    }
    assert_eq!(recorder.total_cancelled(), 2);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn http_shutdown_releases_a_hang_and_abort_fails_the_exchange() {
    let peer = spawn_http(
        HttpScript::new()
            .call("abort", [HttpAction::Abort])
            .call("hang", [HttpAction::Hang]),
    )
    .await;
    let recorder = peer.recorder();
    let client = http_client::<Empty<Bytes>>();
    let get = |call: &str| {
        Request::get(peer.url("/"))
            .header("x-call", call)
            .body(Empty::<Bytes>::new())
            .expect("request")
    };

    let error = guard(client.request(get("abort")))
        .await
        .expect_err("aborted exchange");
    assert!(!error.is_connect(), "the request reached the peer: {error}");
    assert_eq!(
        recorder.attempts("abort")[0].outcome,
        Some(HttpOutcome::Aborted)
    );

    let pending = tokio::spawn(client.request(get("hang")));
    guard(recorder.wait_for_attempts("hang", 1)).await;
    guard(peer.shutdown()).await;
    let response = guard(pending).await.expect("task").expect("released");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        recorder.attempts("hang")[0].outcome,
        Some(HttpOutcome::ShutDown)
    );
}
