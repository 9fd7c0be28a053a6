//! The one place where the tests and benchmarks of `balance` turn the per-call record of tried
//! backends on.
//!
//! The retry and hedge layers copy a request's extensions to every attempt of its call, and
//! clones of a `TriedBackends` share one list: a fresh record inserted into each request above
//! the layers is the call's record, which the balancer below reads and fills. When the policy
//! table can turn the record on for both layers, this function becomes that option.
//!
//! Included with `#[path = ".../examples/support/track_backends.rs"] mod track_backends;` by
//! `tests/balance`, `tests/balance_network` and `examples/several_backends.rs`.
#![allow(dead_code)]

use tower::util::MapRequest;
use tower_retry_hedge::metadata::TriedBackends;

/// What [`track_backends`] does to each request.
pub type WithTriedBackends<B> = fn(http::Request<B>) -> http::Request<B>;

/// Gives every call through `service` (the retry or hedge layer, over the balancer) a fresh
/// record of the backends its attempts tried.
pub fn track_backends<S, B>(service: S) -> MapRequest<S, WithTriedBackends<B>> {
    MapRequest::new(service, with_tried_backends::<B> as WithTriedBackends<B>)
}

fn with_tried_backends<B>(mut request: http::Request<B>) -> http::Request<B> {
    request.extensions_mut().insert(TriedBackends::default());
    request
}
