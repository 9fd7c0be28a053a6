//! gRFC A6 retries and hedging for any [`tower_service::Service`] of `http::Request`s:
//! tonic channels, hyper-util clients, and any tower stack.
//!
//! One layer, [`RetryLayer`] (also named [`HedgeLayer`]: the same type), drives every call by
//! its method's policy:
//!
//! - a [`RetryPolicy`]: exponential backoff with jitter, retryable status codes, server
//!   pushback (`grpc-retry-pushback-ms`, `Retry-After`), a deadline across attempts, the A6
//!   retry throttle, transparent retries, attempt metadata and statistics;
//! - a [`HedgePolicy`]: several copies of a request in flight, the first good answer wins;
//!   non-fatal codes, pushback, throttle gating, a fixed or adaptive delay, a budget on the
//!   extra load ([`throttle::HedgeBudget`], on by default).
//! - Request bodies are replayed from a record within buffer limits ([`body`]), so streaming
//!   bodies (tonic's, hyper's) can be retried: the reason no Rust crate could retry a tonic
//!   channel before.
//! - Policies come from code ([`Policies`]) or from the same gRPC service-config JSON that a
//!   grpc-go or grpc-java client is given ([`config::ServiceConfig`]).
//! - Several backends: [`balance`] (feature `balance`) sends a call's retries and hedges to
//!   backends the call has not tried.
//! - The building blocks stand alone: [`backoff`] schedules for a reconnect loop,
//!   [`throttle`], the header parsers in [`pushback`] and [`grpc_timeout`].
//!
//! Where to read next: [the guide](crate::guide) says how to choose (retry or hedge, which
//! throttle, which hedging delay, which jitter) and how a retried call runs; the README's
//! "Defaults" table lists every default, for policies built in code and from service-config
//! JSON side by side.
//!
//! # Quick start: tonic
//!
//! ```no_run
//! # #[cfg(feature = "tonic")]
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use tower::ServiceBuilder;
//! use tower_retry_hedge::config::ServiceConfig;
//! use tower_retry_hedge::RetryLayer;
//!
//! // The JSON a grpc-go client would be given.
//! let policies = ServiceConfig::from_json(r#"{
//!   "methodConfig": [{
//!     "name": [{"service": "helloworld.Greeter"}],
//!     "retryPolicy": {
//!       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
//!     }
//!   }],
//!   "retryThrottling": {"maxTokens": 20, "tokenRatio": 1}
//! }"#)?
//! .policies();
//!
//! let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect().await?;
//! // Retries and hedges alike: the layer drives each call by its method's policy.
//! let svc = ServiceBuilder::new().layer(RetryLayer::new(policies)).service(channel);
//! // let mut client = GreeterClient::new(svc);  // generated code, unchanged
//! # let _ = svc;
//! # Ok(())
//! # }
//! ```
//!
//! # Quick start: hyper
//!
//! ```no_run
//! # async fn example() -> Result<(), tower_retry_hedge::BoxError> {
//! use bytes::Bytes;
//! use http_body_util::{combinators::BoxBody, BodyExt, Full};
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_retry_hedge::classify::HttpStatuses;
//! use tower_retry_hedge::policy::Route;
//! use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};
//!
//! let policy = RetryPolicy::builder()
//!     .max_attempts(3)
//!     .retryable(HttpStatuses::default()) // 502, 503, 504, and 429 with Retry-After
//!     .build()?;
//! let policies = Policies::builder().route(Route::prefix("/api"), policy).build();
//!
//! let client = Client::builder(TokioExecutor::new()).build_http::<BoxBody<Bytes, BoxError>>();
//! let svc = ServiceBuilder::new().layer(RetryLayer::new(policies)).service(client);
//! let body = Full::new(Bytes::from("hello")).map_err(|e| match e {}).boxed();
//! let request = http::Request::put("http://127.0.0.1:8080/api/items/1").body(body)?;
//! let response = svc.oneshot(request).await?;
//! # let _ = response;
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tonic` | yes | `tonic::body::Body` can be replayed; a gRPC call past its deadline fails with `tonic::Status::deadline_exceeded`, one whose last attempt outlived its per-attempt timeout with `tonic::Status::cancelled` (as gRPC C-core ends it) |
//! | `h2` | yes | HTTP/2 `REFUSED_STREAM` and `GOAWAY` errors are recognised as never processed, so such a stream is resent transparently |
//! | `hyper-util` | no | hyper-util's client "connect" errors are recognised as never sent (resent with wait-for-ready, retried whatever the HTTP method) |
//! | `balance` | no | [`balance::Balance`]: a balancer over a `tower::discover::Discover` that sends each attempt of a call to a backend the call has not tried |
//! | `tonic-transport` | no | [`balance::BalancedChannel`]: that balancer over tonic `Endpoint`s, in place of `Channel::balance_list` (pulls tonic's client transport) |
//! | `retry-info` | no | `GrpcCodes::with_retry_info`: `google.rpc.RetryInfo` in `grpc-status-details-bin` (Google APIs) read as pushback, through tonic-types |
//! | `grpc` | no | [`grpc_channel::RetryInterceptor`]: A6 for the official gRPC crate (`grpc` 0.9.0, pinned; a preview), as an interceptor on its `Channel` |
//! | `opentelemetry` | no | [`PoliciesBuilder::metrics`](policy::PoliciesBuilder::metrics): gRFC A96's retry metrics (`grpc.client.call.retries`, `…transparent_retries`, `…hedges`, `…retry_delay`), with gRFC A108's optional `grpc.client.call.custom` label, on an OpenTelemetry `Meter`, through the `opentelemetry` API crate ([`telemetry`]) |
//!
//! # Jitter: which gRPC?
//!
//! The 2017 text of gRFC A6 draws each backoff from `random(0, min(initial·mult^(n−1), max))`
//! (full jitter). gRPC revised this in 2024, and grpc-go, grpc-java and C-core now all compute
//! `min(initial·mult^(n−1), max) · U(0.8, 1.2)`. Policies built from service-config JSON use
//! the current behaviour, so the same JSON behaves as it does in grpc-go;
//! [`ServiceConfig::policies_builder_with`](config::ServiceConfig::policies_builder_with)`(Jitter::Full)`
//! selects the 2017 formula.
//!
//! # Where the implementations disagree, this crate follows the spec
//!
//! Integer and lower-case status codes are accepted in service config; `maxTokens` above
//! 1000 is rejected; a method config with both a retry and a hedging policy is rejected;
//! pushback on a non-retryable code does not retry; a non-fatal hedge failure sends the next
//! hedge at once; an absent `hedgingDelay` sends all hedges at once; every successful call
//! through the layers credits the throttle.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
#[cfg(feature = "balance")]
#[cfg_attr(docsrs, doc(cfg(feature = "balance")))]
pub mod balance;
pub mod body;
pub mod classify;
pub mod config;
mod drive;
mod engine;
pub mod error;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc_channel;
mod grpc_path;
pub mod grpc_timeout;
pub mod guide;
pub mod hedge;
pub mod latency;
pub mod metadata;
#[cfg(feature = "opentelemetry")]
mod metrics;
pub mod policy;
pub mod pushback;
mod resets;
pub mod retry;
pub mod stats;
pub mod telemetry;
pub mod throttle;
mod window;

/// The README's code blocks, compiled as doctests (`cargo test --doc --all-features`), so
/// that what the README shows is what the crate does. Its blocks use the `grpc`,
/// `tonic-transport` and `opentelemetry` features.
#[cfg(all(
    doctest,
    feature = "grpc",
    feature = "tonic-transport",
    feature = "opentelemetry"
))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use body::BufferLimits;
pub use config::ServiceConfig;
pub use error::BoxError;
pub use hedge::{Hedge, HedgeLayer};
pub use policy::{HedgePolicy, MethodPolicy, Policies, RetryPolicy};
pub use retry::{Retry, RetryLayer};
pub use throttle::Throttle;
