//! The task of one call through [`RetryInterceptor`](super::RetryInterceptor): the
//! interceptor's IO for the [drive loop](crate::drive), which starts the attempts the engine
//! asks for on the channel, tells the engine how each answered (its response headers, or its
//! status), and hands the application the attempt the call commits to.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::grpc::client::{
    CallOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions, SendStream,
};
use ::grpc::core::{RecvMessage, RequestHeaders, SendMessage, Trailers};
use ::grpc::metadata::MetadataValue;
use ::grpc::{StatusCodeError, StatusError};
use bytes::{Buf, Bytes};
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::Handles;
use super::message::Messages;
use crate::body::ReplayBody;
use crate::classify::{AttemptResult, Code};
use crate::drive::{Attempts, Drive, Ended, Io};
use crate::engine::{
    AttemptHeaders, AttemptId, AttemptMarks, BodyKind, Books, CommitBody, Engine, Mode, Start,
};
use crate::grpc_timeout::GRPC_TIMEOUT;
use crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS;
use crate::pushback::{GRPC_RETRY_PUSHBACK_MS, Pushback};
use crate::telemetry::CallTrace;

/// How a call went, for its receive stream: the first item of the attempt the call is
/// committed to, the rest of that attempt's stream, and its sender of the application's
/// messages (which the call's task goes on polling); or only trailers, for a call that ended
/// with no attempt to read from (its deadline passed, or its last attempt timed out).
pub(super) struct Answer<R> {
    pub(super) first: ResponseStreamItem,
    pub(super) recv: Option<R>,
    /// Dropped with the answer: a sender never outlives the attempt it sends to.
    sender: Option<Sender>,
    /// The call's deadline, which still holds while the application reads the stream.
    pub(super) deadline: Option<std::time::Instant>,
}

/// An attempt's sender of the application's messages, polled by the call's task.
type Sender = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<R> Answer<R> {
    /// An answer made by the interceptor, with nothing more to read.
    pub(super) fn ended(trailers: Trailers) -> Answer<R> {
        Answer {
            first: ResponseStreamItem::Trailers(trailers),
            recv: None,
            sender: None,
            deadline: None,
        }
    }
}

/// A task that is aborted when this handle is dropped: a call's work never outlives it.
#[derive(Debug)]
pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A status in trailers, made by the interceptor itself.
pub(super) fn status(code: StatusCodeError, message: &str) -> Trailers {
    Trailers::new(Err(StatusError::new(code, message)))
}

/// A message as the channel takes it: bytes already encoded.
struct Encoded(Bytes);

impl SendMessage for Encoded {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(self.0.clone()))
    }
}

/// Where the first item of an attempt goes: it is headers or trailers, which carry no
/// message; a message before them would break gRPC's order, and is dropped.
struct NoMessage;

impl RecvMessage for NoMessage {
    fn decode(&mut self, _: &mut dyn Buf) -> Result<(), String> {
        Err("a message before the response headers".to_owned())
    }
}

/// An attempt in flight: its future ends with its first item. Dropping it cancels the RPC
/// (its receive stream) and its sender.
type Attempt<R> = Pin<Box<dyn Future<Output = Answer<R>> + Send>>;

/// The interceptor's IO for the [drive loop](crate::drive): each attempt is an RPC started on
/// the channel, with its own reader of the messages; its answer is its first item (response
/// headers, or a status in trailers). `grpc` 0.9 cannot reset an attempt or tell one that
/// never left: an attempt no longer needed is dropped, which ends its request stream.
pub(super) struct GrpcIo<I: Invoke> {
    invoker: I,
    headers: RequestHeaders,
    options: CallOptions,
    body: ReplayBody<Messages>,
    /// The interceptor's handles: the table, for statistics, metrics and route names.
    handles: Arc<Handles>,
    route: Option<usize>,
    deadline: Option<std::time::Instant>,
    /// The headers an answer with response headers is read with: the classifier reads a
    /// response by its HTTP status and headers, and a gRPC response has begun.
    no_headers: HeaderMap,
}

/// The call the interceptor drives: its first attempt goes when the call's task first polls
/// it (futures are lazy).
pub(super) fn call<I>(
    invoker: I,
    headers: RequestHeaders,
    options: CallOptions,
    body: ReplayBody<Messages>,
    start: Start,
    handles: Arc<Handles>,
) -> Drive<GrpcIo<I>>
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    // Named for what the call does, with the fields the layers' call spans have.
    let hedged = matches!(start.rules.mode, Mode::Hedge(..));
    let span = CallTrace::call_span(hedged, headers.method_name());
    let first_headers = AttemptHeaders {
        previous: None,
        timeout: start.first_timeout(|| tokio::time::Instant::now().into_std()),
    };
    let first_reader = body.clone();
    let engine = Engine::new(
        start.rules,
        start.deadline,
        BodyKind::Recorded,
        first_reader.reader_id(),
        start.first_sent_at,
    );
    let mut io = GrpcIo {
        invoker,
        headers,
        options,
        body,
        handles,
        route: start.route,
        deadline: start.deadline,
        no_headers: HeaderMap::new(),
    };
    let first = io.start(
        &mut (),
        first_reader,
        AttemptId::FIRST,
        false,
        first_headers,
    );
    // Boxed already: the first attempt is stopped by dropping it, as every other.
    Drive::new(first, false, Drive::state(|| engine, span, || io))
}

/// Runs the call to its decision, which goes to `decided`; ends early when the application
/// drops its receive stream. The answer's sender goes on here, so that one task does the
/// call's work until the application drops its receive stream.
pub(super) async fn run<I>(
    call: Drive<GrpcIo<I>>,
    mut decided: oneshot::Sender<Answer<I::RecvStream>>,
) where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    // The answer's sender runs in the call's span too, as the loop does.
    let span = call.span();
    async move {
        let Some(mut decision) = decide(call, &mut decided).await else {
            return;
        };
        let sender = decision.sender.take();
        if decided.send(decision).is_ok()
            && let Some(sender) = sender
        {
            sender.await;
        }
    }
    .instrument(span)
    .await
}

/// The call's decision; `None` if the application dropped its receive stream first. The
/// call (its timer, every attempt but the one decided on) is dropped as it returns.
async fn decide<I>(
    call: Drive<GrpcIo<I>>,
    decided: &mut oneshot::Sender<Answer<I::RecvStream>>,
) -> Option<Answer<I::RecvStream>>
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    let mut call = std::pin::pin!(call);
    poll_fn(|cx| {
        if decided.poll_closed(cx).is_ready() {
            return Poll::Ready(None);
        }
        call.as_mut().poll(cx).map(Some)
    })
    .await
}

impl<I: Invoke> Io for GrpcIo<I> {
    type Attempt = Attempt<I::RecvStream>;
    type Answer = Answer<I::RecvStream>;
    /// Nothing: every attempt is started on the channel itself.
    type Later = ();

    fn books(&self) -> Books<'_> {
        Books {
            policies: &self.handles.policies,
            route: self.route,
            path: self.headers.method_name(),
            #[cfg(feature = "opentelemetry")]
            authority: None,
            #[cfg(feature = "opentelemetry")]
            extensions: None,
        }
    }

    /// Nothing to count: `grpc` 0.9 resets no stream.
    fn abandon(&mut self, _: usize) {}
}

/// The body's side of a commit, on the template every attempt's reader is cloned from.
impl<I: Invoke> CommitBody for GrpcIo<I> {
    fn commit(&self, reader: u64) -> u64 {
        if self.body.commit_to(reader) {
            reader
        } else {
            self.body.committed_reader().unwrap_or(reader)
        }
    }
}

impl<I> Attempts for GrpcIo<I>
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    type Copy = ReplayBody<Messages>;
    type Output = Answer<I::RecvStream>;

    /// The channel is always ready: it queues an RPC until it has a connection.
    fn poll_ready(&mut self, _: &mut (), _: &mut Context<'_>) -> Poll<Result<(), Self::Answer>> {
        Poll::Ready(Ok(()))
    }

    fn copy_body(&mut self) -> Option<(ReplayBody<Messages>, u64)> {
        if self.body.committed_reader().is_some() {
            return None;
        }
        let reader = self.body.clone();
        let id = reader.reader_id();
        Some((reader, id))
    }

    /// Starts attempt `id` on the channel, with its own reader of the messages and the
    /// headers the engine gave it.
    fn start(
        &mut self,
        _: &mut (),
        reader: ReplayBody<Messages>,
        _: AttemptId,
        _: bool,
        attempt_headers: AttemptHeaders,
    ) -> Self::Attempt {
        let mut headers = self.headers.clone();
        let mut options = self.options.clone();
        if let Some(deadline) = self.deadline {
            options.set_deadline(deadline);
        }
        for (name, value) in [
            (GRPC_PREVIOUS_RPC_ATTEMPTS, attempt_headers.previous),
            (GRPC_TIMEOUT, attempt_headers.timeout),
        ] {
            if let Some(value) = value.and_then(|v| MetadataValue::try_from(v.as_bytes()).ok()) {
                headers.metadata_mut().insert(name, value);
            }
        }
        let invoker = self.invoker.clone();
        Box::pin(async move {
            let (send, mut recv) = invoker.invoke(headers, options).await;
            // The sender goes with the attempt, polled beside its receive stream on the
            // call's task: dropping the attempt stops both.
            let mut sender: Option<Sender> = Some(Box::pin(send_messages(send, reader)));
            let first = {
                let mut no_message = NoMessage;
                let mut first = std::pin::pin!(recv.recv(&mut no_message));
                poll_fn(|cx| {
                    if sender
                        .as_mut()
                        .is_some_and(|sender| sender.as_mut().poll(cx).is_ready())
                    {
                        sender = None;
                    }
                    first.as_mut().poll(cx)
                })
                .await
            };
            Answer {
                first,
                recv: Some(recv),
                sender,
                deadline: None,
            }
        })
    }

    fn poll_attempt(attempt: Pin<&mut Self::Attempt>, cx: &mut Context<'_>) -> Poll<Self::Answer> {
        attempt.get_mut().as_mut().poll(cx)
    }

    fn read<'a>(&'a self, answered: &'a Self::Answer) -> AttemptResult<'a> {
        match &answered.first {
            // A response has begun: the call commits to it.
            ResponseStreamItem::Headers(_) => AttemptResult::Response {
                status: StatusCode::OK,
                headers: &self.no_headers,
            },
            ResponseStreamItem::Trailers(trailers) => status_of(trailers),
            // Out of gRPC's order, or a stream that closed with no status: the call broke, a
            // transport error as the layers' are (classified UNAVAILABLE for gRPC).
            ResponseStreamItem::Message | ResponseStreamItem::StreamClosed => {
                AttemptResult::Error(&StreamBroke)
            }
        }
    }

    /// Dropped: `grpc` 0.9 cannot reset the stream, and nothing can be let finish.
    fn stop(&mut self, _: AttemptId, _: Option<Pin<Box<Self::Attempt>>>) {}

    fn discard(&mut self, _: Self::Answer) {}

    fn poll_committed(&self, cx: &mut Context<'_>) -> Poll<u64> {
        self.body.poll_committed(cx)
    }

    fn committed_reader(&self) -> Option<u64> {
        self.body.committed_reader()
    }

    fn ended(&self, why: Ended) -> Self::Answer {
        Answer::ended(match why {
            // CANCELLED, as C-core ends a call whose last attempt timed out.
            Ended::AttemptTimedOut => {
                status(StatusCodeError::Cancelled, crate::error::ATTEMPT_TIMED_OUT)
            }
            Ended::DeadlineExceeded(attempts) => {
                let message = format!("deadline exceeded after {attempts} attempt(s)");
                status(StatusCodeError::DeadlineExceeded, &message)
            }
            Ended::NoAnswer => status(
                StatusCodeError::Unavailable,
                "the call ended with no answer kept",
            ),
        })
    }

    /// The answer the application reads, marked with the retry attempts made. An answer in
    /// trailers ends the call: its sender stops, and with it the last reader of the
    /// messages.
    fn finish(&mut self, mut answered: Self::Answer, marks: AttemptMarks) -> Self::Output {
        if matches!(answered.first, ResponseStreamItem::Trailers(_)) {
            answered.sender = None;
        } else {
            answered.deadline = self.deadline;
        }
        marked(answered, marks)
    }
}

/// `answered`, marked with `grpc-previous-rpc-attempts` when retry attempts were made, as
/// the layers mark theirs.
fn marked<R>(mut answered: Answer<R>, marks: AttemptMarks) -> Answer<R> {
    if marks.previous == 0 {
        return answered;
    }
    let value = MetadataValue::from(marks.previous);
    match &mut answered.first {
        ResponseStreamItem::Headers(headers) => {
            headers
                .metadata_mut()
                .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, value);
        }
        ResponseStreamItem::Trailers(trailers) => {
            trailers
                .metadata_mut()
                .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, value);
        }
        ResponseStreamItem::Message | ResponseStreamItem::StreamClosed => {}
    }
    answered
}

/// The status of a Trailers-Only answer, with the pushback that came with it. `grpc` 0.9
/// keeps binary metadata encoded out of reach, so `google.rpc.RetryInfo`
/// (`grpc-status-details-bin`) is not read here; `grpc-retry-pushback-ms` is.
fn status_of(trailers: &Trailers) -> AttemptResult<'static> {
    let code = match trailers.status() {
        Ok(()) => Code::Ok,
        Err(error) => Code::from_i32(error.code() as i32).unwrap_or(Code::Unknown),
    };
    let pushback = trailers
        .metadata()
        .get(GRPC_RETRY_PUSHBACK_MS)
        .map(|value| Pushback::parse(value.as_bytes()));
    AttemptResult::Status { code, pushback }
}

/// An attempt's response stream broke before it gave headers or a status.
#[derive(Debug)]
struct StreamBroke;

impl std::fmt::Display for StreamBroke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the response stream ended before its headers or status")
    }
}

impl std::error::Error for StreamBroke {}

/// Sends the application's messages to one attempt, from its reader of the record: what was
/// sent so far, then the rest as it comes. Ends the attempt's request stream (by dropping
/// it) when the application ends its own.
async fn send_messages<S: SendStream>(mut send: S, mut reader: ReplayBody<Messages>) {
    while let Some(frame) = reader.frame().await {
        let Ok(frame) = frame else {
            // The call committed to another attempt, which alone sends on. Ending this
            // request stream would tell the server it is whole: wait, holding it, until the
            // call drops this attempt (and aborts this task).
            return std::future::pending::<()>().await;
        };
        let Ok(message) = frame.into_data() else {
            continue;
        };
        if send
            .send(&Encoded(message), SendOptions::default())
            .await
            .is_err()
        {
            return;
        }
    }
}
