//! gRFC A6 for the official gRPC crate: [`RetryInterceptor`] runs the crate's engine behind
//! the interceptor API of [`grpc`] 0.9 (feature `grpc`), so a `grpc::client::Channel`
//! gets retries, hedging and the throttle from the same [`Policies`] the tower layers take.
//!
//! `grpc` is not a tower `Service`: a call is started with `Invoke::invoke` and gives a send
//! stream and a receive stream of messages. The interceptor starts each attempt on the
//! channel it wraps, as often as the method's policy says:
//!
//! - **Replay per message**, as A6 describes it. The messages the application sends are kept
//!   encoded, one by one (as the `Bytes` the encoder gives, without a copy when it gives
//!   `Bytes`; empty messages too), within the table's [`BufferLimits`], which count each
//!   message's bytes and its 5-byte gRPC header; each new attempt is sent every message so far, byte for byte and as it was cut,
//!   then the rest as they come. A message that
//!   would take the call past a limit commits it to the attempt that sends it: the others
//!   are cancelled and no new attempt starts.
//! - **Commit on response headers**: the first attempt to answer with headers (or a status
//!   the policy does not retry) is the call's; the application reads it straight from that
//!   attempt's stream, and every other attempt is cancelled.
//! - **The rules of the tower layers**, decided by the same engine: backoff with jitter,
//!   retryable codes, hedging delays and `nonFatalStatusCodes`, the throttle of
//!   [`Policies`] (the table's shared one: an interceptor does not see the channel's
//!   authority, so a per-authority table does not apply), pushback, `maxAttempts`, the method's `timeout`
//!   and the call's deadline (`CallOptions::deadline`, read on tokio's clock), per-attempt
//!   timeouts, `grpc-previous-rpc-attempts` on every attempt after the first, statistics
//!   ([`Policies::stats`]) and A96 metrics.
//! - **Each attempt is told the time left**: its `CallOptions` carry the call's deadline and
//!   its metadata a `grpc-timeout` of what is left (`grpc` 0.9 sends none of its own).
//! - **The answer says what happened**: when the call made retry attempts, the headers (or
//!   the trailers of a Trailers-Only answer, or of the interceptor's own `DEADLINE_EXCEEDED`)
//!   the application reads carry `grpc-previous-rpc-attempts`, their number (every counted
//!   attempt but one, hedges included), as the layers mark their responses.
//! - **Dropping the receive stream cancels the call**: its timers and every attempt in
//!   flight.
//! - **Deadlines hold**: `grpc` 0.9 enforces none, so a call with a deadline is driven even
//!   when its method has no policy, and ends with `DEADLINE_EXCEEDED` when it passes. A call
//!   with neither a policy nor a deadline (and a table without a throttle) goes straight to
//!   the channel, at no cost.
//!
//! What `grpc` 0.9 cannot tell yet, and so this interceptor cannot do:
//!
//! - **Transparent retries and wait-for-ready.** Every failure comes to an interceptor as a
//!   status in trailers, with nothing that tells an attempt that never left the client from
//!   one the server answered; so each failure counts as an attempt, by the method's policy.
//! - **Pushback and `google.rpc.RetryInfo` from a real server.** `grpc` 0.9 drops the
//!   metadata of error trailers on its tonic transport, so `grpc-retry-pushback-ms` never
//!   reaches the interceptor. The interceptor reads it where it arrives (a transport that
//!   keeps it, or an interceptor below), and its rules are those of the layers.
//! - **Resetting an attempt before its response headers.** The interceptor drops a losing
//!   hedge, or an attempt cut off by a commit or the deadline, but `grpc` 0.9 cannot reset
//!   such a stream: dropping it ends its request stream, and the server runs on until it
//!   answers (or its `grpc-timeout` passes). A server of a client-streaming method may so
//!   see a cut-off attempt's request end early, and answer an attempt nobody reads.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use grpc::client::interceptor::InvokeExt as _;
//! use grpc::client::{Channel, ChannelOptions};
//! use grpc::credentials::LocalChannelCredentials;
//! use tower_retry_hedge::config::ServiceConfig;
//! use tower_retry_hedge::grpc_channel::RetryInterceptor;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config: ServiceConfig = r#"{
//!   "methodConfig": [{
//!     "name": [{"service": "echo.Echo"}],
//!     "retryPolicy": {
//!       "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
//!     }
//!   }]
//! }"#
//! .parse()?;
//! let channel = Channel::new(
//!     "dns:///127.0.0.1:50051",
//!     Arc::new(LocalChannelCredentials::new()),
//!     ChannelOptions::default(),
//! );
//! // Any `grpc` client built on this invoker gets A6, unchanged.
//! let client = channel.with_interceptor(RetryInterceptor::new(config.policies()));
//! # let _ = client;
//! # Ok(())
//! # }
//! ```
//!
//! [`BufferLimits`]: crate::body::BufferLimits

mod driver;
mod message;

use std::fmt;
use std::sync::Arc;

use ::grpc::client::interceptor::Intercept;
use ::grpc::client::{
    CallOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions, SendStream,
};
use ::grpc::core::{RecvMessage, RequestHeaders, SendMessage};
use http::{HeaderMap, Method};
use tokio::sync::{mpsc, oneshot};

use self::driver::{AbortOnDrop, Answer};
use self::message::Messages;
use crate::body::ReplayBody;
use crate::engine::{self, CallFacts, Entrance, Start};
use crate::policy::{Policies, ThrottleHandle};
use crate::throttle::Padded;

/// How many messages wait between the application's sends and the attempts: a send returns
/// once its message is queued, and waits while the queue is full.
const QUEUED_MESSAGES: usize = 4;

/// gRFC A6 on a `grpc` channel: an interceptor that drives every call by its method's policy
/// in a [`Policies`] table (built in code, or from service config). See the
/// [module docs](self) for what it does and what `grpc` 0.9 does not let it do.
///
/// Calls are made within a tokio runtime, as `grpc`'s channel itself requires: a driven
/// call runs in one task of its own, which also sends its attempts the messages.
///
/// ```
/// use tower_retry_hedge::classify::{Code, GrpcCodes};
/// use tower_retry_hedge::grpc_channel::RetryInterceptor;
/// use tower_retry_hedge::{Policies, RetryPolicy};
///
/// let policies = Policies::builder()
///     .service(
///         "echo.Echo",
///         RetryPolicy::builder()
///             .max_attempts(4)
///             .retryable(GrpcCodes::from([Code::Unavailable]))
///             .build()?,
///     )
///     .build();
/// let interceptor = RetryInterceptor::new(policies);
/// assert!(interceptor.policies().lookup(&http::Method::POST, "/echo.Echo/Say").is_some());
/// # Ok::<(), tower_retry_hedge::error::BuildError>(())
/// ```
pub struct RetryInterceptor {
    /// This interceptor's own handles, which each call's task holds: taking them writes a
    /// reference count of this clone's, not the table's that every clone (and core) shares,
    /// as the layers' calls take their service clone's handles.
    handles: Arc<Handles>,
}

/// The table, and a handle on its shared throttle alone on its cache lines.
struct Handles {
    policies: Policies,
    throttle: Option<ThrottleHandle>,
}

impl RetryInterceptor {
    /// An interceptor that drives calls as `policies` says.
    pub fn new(policies: Policies) -> RetryInterceptor {
        let throttle = policies
            .shared_throttle()
            .map(|shared| Arc::new(Padded(Arc::clone(shared))) as ThrottleHandle);
        RetryInterceptor {
            handles: Arc::new(Handles { policies, throttle }),
        }
    }

    /// The table the interceptor drives calls by: its statistics and throttle state are
    /// those of the calls made through it.
    pub fn policies(&self) -> &Policies {
        &self.handles.policies
    }
}

/// A clone has handles of its own (see [`RetryInterceptor::new`]) on the same table.
impl Clone for RetryInterceptor {
    fn clone(&self) -> RetryInterceptor {
        RetryInterceptor::new(self.handles.policies.clone())
    }
}

impl fmt::Debug for RetryInterceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryInterceptor")
            .field("policies", &self.handles.policies)
            .finish()
    }
}

impl<'a, I> Intercept<&'a I> for RetryInterceptor
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    type SendStream = RetrySend<I::SendStream>;
    type RecvStream = RetryRecv<I::RecvStream>;

    async fn intercept(
        &self,
        headers: RequestHeaders,
        options: CallOptions,
        next: &'a I,
    ) -> (Self::SendStream, Self::RecvStream) {
        let Some(start) = self.enter(&headers, &options) else {
            let (send, recv) = next.invoke(headers, options).await;
            return (
                RetrySend(SendState::Direct(send)),
                RetryRecv(RecvState::Direct(recv)),
            );
        };
        let (sender, receiver) = mpsc::channel(QUEUED_MESSAGES);
        let limits = self.handles.policies.buffer_limits();
        let body = match ReplayBody::try_new_unpin(Messages::new(receiver), limits) {
            Ok(body) => body.records_messages(),
            // Only a body whose size hint is over the limits is refused, and a message
            // stream's hint is 0; were it refused, the call would still go, once.
            Err(_) => {
                let (send, recv) = next.invoke(headers, options).await;
                return (
                    RetrySend(SendState::Direct(send)),
                    RetryRecv(RecvState::Direct(recv)),
                );
            }
        };
        let (decided, decision) = oneshot::channel();
        let call = driver::call(
            next.clone(),
            headers,
            options,
            body,
            start,
            Arc::clone(&self.handles),
        );
        let task = tokio::spawn(driver::run(call, decided));
        (
            RetrySend(SendState::Recorded(Some(sender))),
            RetryRecv(RecvState::Waiting {
                decision,
                task: Some(AbortOnDrop(task)),
            }),
        )
    }
}

impl RetryInterceptor {
    /// The engine's entry of a call: `None` when nothing of A6 applies and the call goes
    /// straight to the channel.
    fn enter(&self, headers: &RequestHeaders, options: &CallOptions) -> Option<Start> {
        let read = || tokio::time::Instant::now().into_std();
        let mut entrance = GrpcEntrance {
            options,
            throttle: &self.handles.throttle,
            none: HeaderMap::new(),
        };
        let policies = &self.handles.policies;
        engine::enter(
            policies,
            &Method::POST,
            headers.method_name(),
            &mut entrance,
            &read,
        )
    }
}

/// What the interceptor tells the engine of a call as it enters.
struct GrpcEntrance<'a> {
    options: &'a CallOptions,
    throttle: &'a Option<ThrottleHandle>,
    /// What the tower layers read from a request's headers (`grpc-timeout`,
    /// `Idempotency-Key`) a `grpc` call carries in its options, or does not have.
    none: HeaderMap,
}

impl Entrance for GrpcEntrance<'_> {
    fn drive_without_policy(&self, _: bool) -> bool {
        // `grpc` 0.9 does not tell an attempt that never left, so transparent retries have
        // nothing to act on; and it enforces no deadline. So a call without a policy or a
        // throttle goes straight to the channel, unless it has a deadline for the engine to
        // keep.
        self.options.deadline().is_some()
    }

    fn facts(&self) -> CallFacts<'_> {
        CallFacts {
            method: &Method::POST,
            grpc: true,
            headers: &self.none,
            deadline: self.options.deadline(),
        }
    }

    fn throttle(&mut self) -> Option<ThrottleHandle> {
        self.throttle.clone()
    }
}

/// The send stream of a call through [`RetryInterceptor`]: each message is encoded once and
/// kept for the attempts (or, for a call nothing of A6 applies to, sent straight on).
///
/// Dropping it, or a send with `final_msg`, ends the request stream of every attempt.
pub struct RetrySend<S>(SendState<S>);

enum SendState<S> {
    /// A call the interceptor does not drive.
    Direct(S),
    /// A driven call: messages go to its attempts; `None` once the stream has ended.
    Recorded(Option<mpsc::Sender<bytes::Bytes>>),
}

impl<S: SendStream + Send> SendStream for RetrySend<S> {
    async fn send(&mut self, msg: &dyn SendMessage, options: SendOptions) -> Result<(), ()> {
        let sender = match &mut self.0 {
            SendState::Direct(send) => return send.send(msg, options).await,
            SendState::Recorded(sender) => sender,
        };
        let Some(queue) = sender.as_ref() else {
            return Err(());
        };
        // An encoding error fails this send alone, as on the channel itself.
        let Ok(mut encoded) = msg.encode() else {
            return Err(());
        };
        if u32::try_from(encoded.remaining()).is_err() {
            // Over 4 GiB: gRPC's own framing cannot carry it.
            return Err(());
        }
        let message = encoded.copy_to_bytes(encoded.remaining());
        let Ok(()) = queue.send(message).await else {
            // The call is over: no attempt reads messages any more.
            *sender = None;
            return Err(());
        };
        if options.final_msg {
            *sender = None;
        }
        Ok(())
    }
}

impl<S> fmt::Debug for RetrySend<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open = match &self.0 {
            SendState::Direct(_) => None,
            SendState::Recorded(sender) => Some(sender.is_some()),
        };
        f.debug_struct("RetrySend")
            .field("driven", &open.is_some())
            .field("open", &open.unwrap_or(true))
            .finish()
    }
}

/// The receive stream of a call through [`RetryInterceptor`]: the first `recv` waits for the
/// attempt the call commits to (or for its end), then every item is that attempt's.
///
/// Dropping it cancels the call: its timers and every attempt in flight.
pub struct RetryRecv<R>(RecvState<R>);

enum RecvState<R> {
    /// A call the interceptor does not drive.
    Direct(R),
    /// A driven call, before its first `recv` has the answer.
    Waiting {
        /// Where the call's task says how the call went.
        decision: oneshot::Receiver<Answer<R>>,
        /// The call's task, aborted with this stream (taken by `Answered`).
        task: Option<AbortOnDrop>,
    },
    /// The attempt the call committed to.
    Answered {
        /// Its first item, not yet read.
        first: Option<ResponseStreamItem>,
        /// The rest of its items; `None` for an answer the interceptor made (the call's
        /// deadline), which has no more.
        recv: Option<R>,
        /// The call's task, which goes on sending the application's messages to that
        /// attempt: aborted with this stream.
        task: Option<AbortOnDrop>,
        /// The call's deadline, which ends the stream if it passes first.
        deadline: Option<std::time::Instant>,
    },
}

impl<R: RecvStream + Send> RecvStream for RetryRecv<R> {
    async fn recv(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        loop {
            let (decision, task) = match &mut self.0 {
                RecvState::Direct(recv) => return recv.recv(msg).await,
                RecvState::Answered {
                    first,
                    recv,
                    task,
                    deadline,
                } => {
                    if let Some(item) = first.take() {
                        return item;
                    }
                    let Some(stream) = recv else {
                        return ResponseStreamItem::StreamClosed;
                    };
                    let Some(at) = *deadline else {
                        return stream.recv(msg).await;
                    };
                    let at = tokio::time::Instant::from_std(at);
                    if let Ok(item) = tokio::time::timeout_at(at, stream.recv(msg)).await {
                        return item;
                    }
                    // The deadline passed while the committed attempt streamed: it is
                    // cancelled, as a gRPC client cancels a call past its deadline.
                    *recv = None;
                    *task = None;
                    return ResponseStreamItem::Trailers(driver::status(
                        ::grpc::StatusCodeError::DeadlineExceeded,
                        "deadline exceeded",
                    ));
                }
                RecvState::Waiting { decision, task } => (decision.await, task.take()),
            };
            let answer = decision.unwrap_or_else(|_| {
                // The call's task ended without a word: only a panic does that.
                Answer::ended(driver::status(
                    ::grpc::StatusCodeError::Internal,
                    "the call's task ended without an answer",
                ))
            });
            self.0 = RecvState::Answered {
                first: Some(answer.first),
                recv: answer.recv,
                task,
                deadline: answer.deadline,
            };
        }
    }
}

impl<R> fmt::Debug for RetryRecv<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.0 {
            RecvState::Direct(_) => "direct",
            RecvState::Waiting { .. } => "waiting",
            RecvState::Answered { .. } => "answered",
        };
        f.debug_struct("RetryRecv").field("state", &state).finish()
    }
}
