//! An axum 0.8 gateway that forwards every request to a flaky hyper upstream through the
//! retry layer: the code of the README's "Gateways (axum)" section, with real servers on
//! 127.0.0.1.
//!
//! Two things a first attempt gets wrong, and this code gets right:
//!
//! - axum's `Body` is not `Sync` and cannot be replayed: the handler boxes it as an
//!   `UnsyncBoxBody<Bytes, BoxError>`, which the layers replay, and the hyper-util client
//!   takes that body type.
//! - Awaiting `upstream.oneshot(request)` directly in the handler makes rustc reject the
//!   route with "implementation of `Service` is not general enough": proving the handler's
//!   future `Send` loses the `'static` of the `BoxError` inside the body type (a rustc
//!   limitation, rust-lang/rust#110338). Boxing that one future (`Box::pin` into a
//!   `BoxFuture`) hides its type from the proof, and the handler compiles.
//!
//! Runs on the real clock with a 1 ms backoff; assertions are on counts and bytes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::routing::any;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::ServiceBuilder;
use tower::ServiceExt;
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::HttpStatuses;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{BoxError, Policies, Retry, RetryLayer, RetryPolicy};

// --- The gateway, as in the README --------------------------------------------------------

/// The body the gateway sends upstream: axum's body boxed, which the layers can replay.
type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// The retrying client, held as it is (it is cheap to clone).
type Upstream = Retry<Client<HttpConnector, UpstreamBody>>;

#[derive(Clone)]
struct Gateway {
    upstream: Upstream,
    /// Where requests go: `http://host:port`.
    origin: String,
}

fn upstream(policies: Policies) -> Upstream {
    let client = Client::builder(TokioExecutor::new()).build_http::<UpstreamBody>();
    ServiceBuilder::new()
        .layer(RetryLayer::new(policies))
        .service(client)
}

async fn proxy(State(gateway): State<Gateway>, request: Request) -> Result<Response, StatusCode> {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri =
        Uri::try_from(format!("{}{path}", gateway.origin)).map_err(|_| StatusCode::BAD_REQUEST)?;
    let body = body.map_err(BoxError::from).boxed_unsync();
    // Boxed: the future's own type, named in the handler's, trips rustc's
    // "implementation of `Service` is not general enough".
    let call: BoxFuture<'static, Result<http::Response<Incoming>, BoxError>> = Box::pin(
        gateway
            .upstream
            .oneshot(http::Request::from_parts(parts, body)),
    );
    let response = call.await.map_err(|_| StatusCode::BAD_GATEWAY)?;
    Ok(response.map(Body::new))
}

fn app(gateway: Gateway) -> Router {
    Router::new()
        .route("/{*path}", any(proxy))
        .with_state(gateway)
}

// --- The test harness ---------------------------------------------------------------------

/// Fails the test instead of hanging it if a server misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("the request did not end within the hang guard")
}

/// One request as the upstream received it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: http::Method,
    path: String,
    body: Bytes,
}

/// A hyper HTTP/1.1 upstream on 127.0.0.1:0 that answers the first request to each path
/// with 503 and every later one with 200 and the request's body.
struct Flaky {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Flaky {
    async fn spawn() -> Flaky {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
        let (stop, mut stopped) = oneshot::channel::<()>();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let stream = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => break,
                    },
                    _ = &mut stopped => break,
                };
                let log = log.clone();
                let service =
                    hyper::service::service_fn(move |request: http::Request<Incoming>| {
                        let log = log.clone();
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body.collect().await?.to_bytes();
                            let mut seen = log.lock().unwrap_or_else(PoisonError::into_inner);
                            let path = parts.uri.path().to_owned();
                            let earlier = seen.iter().filter(|s| s.path == path).count();
                            seen.push(Seen {
                                method: parts.method,
                                path,
                                body: body.clone(),
                            });
                            let (status, body) = if earlier == 0 {
                                (StatusCode::SERVICE_UNAVAILABLE, Bytes::new())
                            } else {
                                (StatusCode::OK, body)
                            };
                            let response = http::Response::builder()
                                .status(status)
                                .body(Full::new(body))
                                .expect("valid response");
                            Ok::<_, hyper::Error>(response)
                        }
                    });
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            connections.shutdown().await;
        });
        Flaky {
            addr,
            seen,
            stop: Some(stop),
            task,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.expect("upstream task");
    }
}

/// The gateway served by axum on 127.0.0.1:0, in front of `upstream`.
struct Served {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

async fn serve(gateway: Gateway) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(
        axum::serve(listener, app(gateway))
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .into_future(),
    );
    Served { addr, stop, task }
}

impl Served {
    async fn shutdown(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("gateway task")
            .expect("gateway server");
    }
}

fn policies() -> Policies {
    let backoff = Duration::from_millis(1);
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Exponential::new(backoff, backoff, 1.0, Jitter::None).expect("valid backoff"))
        .retryable(HttpStatuses::default())
        .build()
        .expect("valid policy");
    Policies::builder()
        .route(Route::prefix("/"), policy)
        .build()
}

/// A streaming body of `chunks`, as a client that does not know its size sends it.
fn streaming(chunks: &[&'static str]) -> UnsyncBoxBody<Bytes, BoxError> {
    let frames = chunks
        .iter()
        .map(|chunk| Ok::<_, BoxError>(Frame::data(Bytes::from_static(chunk.as_bytes()))))
        .collect::<Vec<_>>();
    StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
}

#[tokio::test]
async fn the_gateway_retries_a_flaky_upstream_and_replays_the_body() {
    let flaky = Flaky::spawn().await;
    let gateway = serve(Gateway {
        upstream: upstream(policies()),
        origin: format!("http://{}", flaky.addr),
    })
    .await;
    let client =
        Client::builder(TokioExecutor::new()).build_http::<UnsyncBoxBody<Bytes, BoxError>>();
    let url = |path: &str| format!("http://{}{path}", gateway.addr);

    // A GET: the upstream's 503 is retried by the gateway; the caller sees only the 200.
    let request = http::Request::get(url("/items"))
        .body(
            Full::new(Bytes::new())
                .map_err(BoxError::from)
                .boxed_unsync(),
        )
        .expect("request");
    let response = guard(client.request(request))
        .await
        .expect("gateway answers");
    assert_eq!(response.status(), StatusCode::OK);

    // A PUT with a streaming body of unknown size: the retry sends the same bytes again.
    let request = http::Request::put(url("/items/7"))
        .body(streaming(&["chunk one, ", "chunk two"]))
        .expect("request");
    let response = guard(client.request(request))
        .await
        .expect("gateway answers");
    assert_eq!(response.status(), StatusCode::OK);
    let echoed = guard(response.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(echoed, "chunk one, chunk two");

    let seen = flaky.seen();
    let put = |path: &str| Seen {
        method: http::Method::PUT,
        path: path.to_owned(),
        body: Bytes::from_static(b"chunk one, chunk two"),
    };
    let get = Seen {
        method: http::Method::GET,
        path: "/items".to_owned(),
        body: Bytes::new(),
    };
    assert_eq!(
        seen,
        [get.clone(), get, put("/items/7"), put("/items/7")],
        "two attempts each, the second with the same body"
    );

    gateway.shutdown().await;
    flaky.shutdown().await;
}

#[tokio::test]
async fn a_post_is_not_retried_by_default() {
    let flaky = Flaky::spawn().await;
    let gateway = serve(Gateway {
        upstream: upstream(policies()),
        origin: format!("http://{}", flaky.addr),
    })
    .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("http://{}/orders", gateway.addr))
        .body(Full::new(Bytes::from_static(b"one order")))
        .expect("request");
    let response = guard(client.request(request))
        .await
        .expect("gateway answers");
    // The upstream's 503 comes back: a POST may have been applied, so it is sent once.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(flaky.seen().len(), 1);

    gateway.shutdown().await;
    flaky.shutdown().await;
}
