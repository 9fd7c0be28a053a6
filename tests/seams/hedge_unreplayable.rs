//! A body too large to record (its size hint is over the per-call limit already) is given
//! back untouched by the replay body and sent once, with the first attempt. Under a hedging
//! policy whose delay passes while that attempt is in flight, no hedge can be made: the call
//! must go on with its only attempt, not cancel it, and return its answer.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tower::{ServiceBuilder, ServiceExt as _};
use tower_retry_hedge::classify::HttpStatuses;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{BoxError, BufferLimits, HedgeLayer, HedgePolicy, Policies};

use super::common::{
    CALL_HEADER, HttpAction, HttpOutcome, HttpScript, PEER_ATTEMPT_HEADER, http_client,
    http2_client, spawn_http,
};
use super::{chain_text, guard};

type Body = BoxBody<Bytes, BoxError>;

/// The per-call limit, and the body's size, ten times over it.
const PER_CALL: usize = 1024;
const BODY: usize = 10 * 1024;

/// `len` deterministic, varied bytes.
fn bytes(len: usize, seed: u32) -> Bytes {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state.to_be_bytes()[0]
        })
        .collect::<Vec<u8>>()
        .into()
}

async fn one_call(client: Client<HttpConnector, Body>, version: Version) {
    // Every attempt is answered OK, 100 ms after its body has arrived; the hedging delay
    // (20 ms) passes long before.
    let peer = spawn_http(HttpScript::always(HttpAction::delay(
        Duration::from_millis(100),
        HttpAction::Ok,
    )))
    .await;
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(Duration::from_millis(20))
        .non_fatal(HttpStatuses::default())
        .build()
        .expect("a valid policy");
    let policies = Policies::builder()
        .route(Route::prefix("/"), policy)
        .buffer_limits(BufferLimits::new(PER_CALL, 1024 * 1024))
        .build();
    let service = ServiceBuilder::new()
        .layer(HedgeLayer::new(policies.clone()))
        .service(client);

    let sent = bytes(BODY, 0x5eed);
    let body = BoxBody::new(Full::new(sent.clone()).map_err(|never| match never {}));
    let request = Request::builder()
        .method(Method::PUT)
        .uri(peer.url("/items"))
        .header(CALL_HEADER, "big")
        .body(body)
        .expect("a valid request");

    let response = match guard(service.oneshot(request)).await {
        Ok(response) => response,
        Err(error) => panic!(
            "{version:?}: the call failed instead of returning its only attempt's answer: {}",
            chain_text(&*error)
        ),
    };
    assert_eq!(response.status(), StatusCode::OK, "{version:?}");
    assert_eq!(
        response
            .headers()
            .get(PEER_ATTEMPT_HEADER)
            .and_then(|v| v.to_str().ok()),
        Some("0"),
        "{version:?}: the answer is the first attempt's"
    );
    assert_eq!(
        Attempts::of(&response),
        Attempts::new(1, 0),
        "{version:?}: one attempt sent"
    );
    let echoed = guard(response.into_body().collect())
        .await
        .expect("the whole response body")
        .to_bytes();
    assert!(
        echoed == sent,
        "{version:?}: the echo differs from the body"
    );

    let attempts = peer.recorder().attempts("big");
    assert_eq!(attempts.len(), 1, "{version:?}: sent once: {attempts:#?}");
    let attempt = &attempts[0];
    assert_eq!(attempt.version, version);
    assert!(
        !attempt.cancelled,
        "{version:?}: the only attempt was cancelled"
    );
    assert!(attempt.body_complete, "{version:?}");
    assert!(
        attempt.body == sent,
        "{version:?}: the server received {} bytes, not the body",
        attempt.body.len()
    );
    assert_eq!(attempt.outcome, Some(HttpOutcome::Status(200)));
    assert_eq!(policies.buffer_limits().in_use(), 0);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn http2_a_hedge_due_for_a_body_too_large_to_record_leaves_the_original_running() {
    one_call(http2_client::<Body>(), Version::HTTP_2).await;
}

#[tokio::test]
async fn http1_a_hedge_due_for_a_body_too_large_to_record_leaves_the_original_running() {
    one_call(http_client::<Body>(), Version::HTTP_11).await;
}
