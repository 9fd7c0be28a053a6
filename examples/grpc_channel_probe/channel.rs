//! The calls of `grpc_channel_probe`: the same calls, record and output as `grpc_probe`'s,
//! sent through a channel of the official gRPC crate (`grpc` 0.9) with the crate's
//! [`RetryInterceptor`] built from the service config.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use grpc::client::interceptor::InvokeExt as _;
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::RequestHeaders;
use grpc::credentials::LocalChannelCredentials;
use grpc::metadata::MetadataMap;
use grpc::{StatusCodeError, StatusError};
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::grpc_channel::RetryInterceptor;

#[path = "../support/raw_message.rs"]
mod raw_message;

use self::raw_message::{Raw, RawReply};
use crate::probe::{CallRecord, in_call_order, status_name};

/// The `grpc` target for the probe's `--target` (`http://HOST:PORT`): `dns:///HOST:PORT`.
/// `None` for a URI that is not plain-text `http`.
pub fn grpc_target(target: &str) -> Option<String> {
    let authority = target.strip_prefix("http://")?.trim_end_matches('/');
    Some(format!("dns:///{authority}"))
}

/// The channel, counting the attempts the interceptor starts on it.
#[derive(Clone)]
struct Counting {
    channel: Channel,
    sent: Arc<AtomicU32>,
}

impl Invoke for Counting {
    type SendStream = <Channel as Invoke>::SendStream;
    type RecvStream = <Channel as Invoke>::RecvStream;

    async fn invoke(
        &self,
        headers: RequestHeaders,
        options: CallOptions,
    ) -> (Self::SendStream, Self::RecvStream) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.channel.invoke(headers, options).await
    }
}

/// The attempt count an answer carried in `grpc-previous-rpc-attempts`.
fn attempts_from(metadata: &MetadataMap) -> Option<u32> {
    metadata
        .get("grpc-previous-rpc-attempts")
        .and_then(|value| value.to_str().parse::<u32>().ok())
        .map(|previous| previous.saturating_add(1))
}

/// A client for one method over a `grpc` channel, configured by a service config.
pub struct ChannelProbe {
    channel: Channel,
    interceptor: RetryInterceptor,
    method: String,
    deadline: Option<Duration>,
}

impl ChannelProbe {
    /// The client for `method` on `target` (a `grpc` target, see [`grpc_target`]): the
    /// interceptor gets the config's policy table and throttle; `deadline` and the method
    /// config's `timeout` both bound each call (the shorter wins; `0s` is no timeout, as
    /// C-core reads it). `grpc` 0.9 has no message size limits to apply.
    pub fn new(
        target: &str,
        config: &ServiceConfig,
        method: String,
        deadline: Option<Duration>,
    ) -> ChannelProbe {
        let policies = config.policies();
        let timeout = policies
            .lookup(&http::Method::POST, &method)
            .and_then(|policy| policy.timeout())
            .filter(|t| !t.is_zero());
        let deadline = match (deadline, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Local credentials: plain text, and loopback peers only.
        let channel = Channel::new(
            target,
            Arc::new(LocalChannelCredentials::new()),
            ChannelOptions::default(),
        );
        ChannelProbe {
            channel,
            interceptor: RetryInterceptor::new(policies),
            method,
            deadline,
        }
    }

    /// Makes call number `call` with `payload` as its message.
    pub async fn call(&self, call: u32, payload: Bytes) -> CallRecord {
        let sent = Arc::new(AtomicU32::new(0));
        let counting = Counting {
            channel: self.channel.clone(),
            sent: Arc::clone(&sent),
        };
        let invoker = counting.with_interceptor(self.interceptor.clone());
        let started = Instant::now();
        let mut options = CallOptions::new();
        if let Some(deadline) = self.deadline {
            options.set_deadline(started + deadline);
        }
        let headers = RequestHeaders::new().with_method_name(self.method.clone());
        let (mut send, mut recv) = invoker.invoke(headers, options).await;
        // A send that fails means the call is over already; its status comes below.
        let _ = send
            .send(&Raw(payload), SendOptions::new().with_final_msg(true))
            .await;
        drop(send);
        let mut response = Bytes::new();
        let mut reported = None;
        let status = loop {
            let mut reply = RawReply::default();
            match recv.recv(&mut reply).await {
                ResponseStreamItem::Headers(headers) => {
                    reported = attempts_from(headers.metadata())
                }
                ResponseStreamItem::Message => response = reply.0.unwrap_or_default(),
                ResponseStreamItem::Trailers(trailers) => {
                    reported = reported.or_else(|| attempts_from(trailers.metadata()));
                    break trailers.status().clone();
                }
                ResponseStreamItem::StreamClosed => {
                    break Err(StatusError::new(
                        StatusCodeError::Internal,
                        "the stream closed without a status",
                    ));
                }
            }
        };
        let elapsed = started.elapsed();
        let (code, message) = match status {
            Ok(()) => (0, String::new()),
            Err(error) => (error.code() as i32, error.message().to_owned()),
        };
        CallRecord {
            call,
            code,
            status: status_name(code),
            message,
            reported_attempts: reported,
            sent: sent.load(Ordering::Relaxed),
            response: if code == 0 { response } else { Bytes::new() },
            elapsed,
        }
    }

    /// Makes calls `0..calls`, at most `concurrency` at a time, and yields their records in
    /// call order.
    pub fn run(
        &self,
        payload: &str,
        calls: u32,
        concurrency: usize,
    ) -> impl Stream<Item = CallRecord> + '_ {
        in_call_order(payload, calls, concurrency, move |call, payload| {
            self.call(call, payload)
        })
    }
}
