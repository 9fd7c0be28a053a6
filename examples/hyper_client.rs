//! A hyper-util client with retries per route, and a streaming upload that is replayed.
//!
//! ```text
//! cargo run --example hyper_client
//! ```
//!
//! The example serves HTTP/1.1 on 127.0.0.1: every path answers its first request with
//! `503 Service Unavailable` and `Retry-After: 0`, and later ones with 200 and the request
//! body echoed back. The client is a hyper-util legacy `Client` whose request body is a
//! `BoxBody`, under a `RetryLayer` with one policy for `/api`:
//!
//! - a `PUT` with a body streamed from a channel is retried: the layer recorded the body
//!   while the first attempt sent it, and the retry sends the same bytes;
//! - a `POST` is not retried (it is not idempotent), unless a route opts in.

use std::collections::HashMap;
use std::convert::Infallible;
use std::error::Error;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tower::{ServiceBuilder, ServiceExt as _};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::HttpStatuses;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};

type Body = BoxBody<Bytes, BoxError>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(serve(listener));

    // 502, 503, 504 (and 429 with Retry-After) are retried, up to 3 attempts, 5 ms backoff
    // doubling; Retry-After is honoured as the exact delay.
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Exponential::new(
            Duration::from_millis(5),
            Duration::from_millis(50),
            2.0,
            Jitter::None,
        )?)
        .retryable(HttpStatuses::default())
        .build()?;
    let policies = Policies::builder()
        .route(Route::prefix("/api"), policy)
        .build();
    let client: Client<_, Body> = Client::builder(TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies.clone()))
        .service(client);

    // A PUT whose body is produced chunk by chunk, as an upload would be.
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
    tokio::spawn(async move {
        for part in ["first chunk, ", "second chunk, ", "last chunk"] {
            if tx.send(Ok(Frame::data(Bytes::from(part)))).await.is_err() {
                return;
            }
        }
    });
    let body = StreamBody::new(ReceiverStream::new(rx)).boxed();
    let request = Request::put(format!("http://{addr}/api/upload")).body(body)?;
    let response = svc.clone().oneshot(request).await?;
    report("PUT /api/upload (streamed)", response).await?;

    let body = Full::new(Bytes::from("order #1"))
        .map_err(|never| match never {})
        .boxed();
    let request = Request::post(format!("http://{addr}/api/orders")).body(body)?;
    let response = svc.oneshot(request).await?;
    report("POST /api/orders", response).await?;

    println!(
        "replay buffers in use after the calls: {} bytes",
        policies.buffer_limits().in_use()
    );
    server.abort();
    Ok(())
}

async fn report(what: &str, response: Response<Incoming>) -> Result<(), BoxError> {
    let status = response.status();
    let sent = Attempts::of(&response).sent();
    let body = response.into_body().collect().await?.to_bytes();
    println!("{what}: {status} after {sent} attempt(s); body {body:?}");
    Ok(())
}

/// Answers the first request of each path with 503 and `Retry-After: 0`, later ones with 200
/// and the request body echoed.
async fn serve(listener: TcpListener) {
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let seen = Arc::clone(&seen);
        let service = service_fn(move |request: Request<Incoming>| {
            let seen = Arc::clone(&seen);
            async move {
                let path = request.uri().path().to_owned();
                let method = request.method().clone();
                // Read the whole body first, as a server that validates uploads would.
                let body = match request.into_body().collect().await {
                    Ok(collected) => collected.to_bytes(),
                    Err(_) => Bytes::new(),
                };
                let attempt = {
                    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    let n = seen.entry(path.clone()).or_insert(0);
                    *n = n.saturating_add(1);
                    *n
                };
                println!(
                    "  [server] {method} {path} request {attempt}: {} body bytes",
                    body.len()
                );
                let response = if attempt == 1 {
                    let mut response = Response::new(Full::new(Bytes::new()));
                    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    response.headers_mut().insert(
                        http::header::RETRY_AFTER,
                        http::HeaderValue::from_static("0"),
                    );
                    response
                } else {
                    Response::new(Full::new(body))
                };
                Ok::<_, Infallible>(response)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
