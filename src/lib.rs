//! gRPC A6 retries and hedging for any [`tower_service::Service`].
//!
//! Crate docs are completed as the layers land.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
pub mod body;
pub mod classify;
pub mod config;
pub mod grpc_timeout;
pub mod pushback;
pub mod throttle;
