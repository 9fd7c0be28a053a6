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
mod call;
pub mod classify;
pub mod config;
pub mod error;
pub mod grpc_timeout;
pub mod hedge;
pub mod latency;
pub mod metadata;
pub mod policy;
pub mod pushback;
pub mod retry;
pub mod stats;
pub mod throttle;

pub use body::BufferLimits;
pub use policy::{HedgePolicy, MethodPolicy, Policies, RetryPolicy};
pub use hedge::{Hedge, HedgeLayer};
pub use retry::{Retry, RetryLayer};
pub use throttle::Throttle;

/// The boxed error the layers return: the inner service's error, unchanged inside the box,
/// or one of the layers' own [`error`]s.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
