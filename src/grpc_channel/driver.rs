//! The task of one call through [`RetryInterceptor`](super::RetryInterceptor): it starts the
//! attempts the engine asks for on the channel, tells the engine how each answered (its
//! response headers, or its status), and hands the application the attempt the call commits
//! to. IO only: every decision is the engine's, as in the tower layers' driver.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::grpc::client::{
    CallOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions, SendStream,
};
use ::grpc::core::{RecvMessage, RequestHeaders, SendMessage, Trailers};
use ::grpc::metadata::MetadataValue;
use ::grpc::{StatusCodeError, StatusError};
use bytes::{Buf, Bytes};
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tracing::Instrument;

use super::Handles;
use super::message::{Messages, Unframe};
use crate::body::ReplayBody;
use crate::classify::{AttemptResult, Code};
use crate::engine::{
    Action, Admission, AttemptHeaders, AttemptId, AttemptMarks, Books, CommitBody, Dispatch, End,
    Engine, Inputs, Mode, Readiness, Start, Verdict,
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
struct Attempt<R> {
    id: AttemptId,
    future: Pin<Box<dyn Future<Output = Answer<R>> + Send>>,
}

/// The body's side of a commit: the template every attempt's reader is cloned from.
struct Recorded(ReplayBody<Messages>);

impl CommitBody for Recorded {
    fn commit(&self, reader: u64) -> u64 {
        if self.0.commit_to(reader) {
            reader
        } else {
            self.0.committed_reader().unwrap_or(reader)
        }
    }
}

/// One call the interceptor drives.
pub(super) struct GrpcCall<I: Invoke> {
    invoker: I,
    headers: RequestHeaders,
    options: CallOptions,
    body: Recorded,
    engine: Engine,
    /// The interceptor's handles: the table, for statistics, metrics and route names.
    handles: Arc<Handles>,
    route: Option<usize>,
    deadline: Option<std::time::Instant>,
    attempts: Vec<Attempt<I::RecvStream>>,
    /// The failure kept as the call's last (see [`Verdict::Keep`]).
    last: Option<(AttemptId, Answer<I::RecvStream>)>,
    timer: Pin<Box<Sleep>>,
    /// When `timer` fires, once set.
    timer_at: Option<std::time::Instant>,
    /// The body's commit was told to the engine.
    commit_seen: bool,
    /// The call's span and its attempts', fed with what the engine says, as the layers'.
    trace: CallTrace,
}

impl<I> GrpcCall<I>
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    pub(super) fn new(
        invoker: I,
        headers: RequestHeaders,
        options: CallOptions,
        body: ReplayBody<Messages>,
        start: Start,
        handles: Arc<Handles>,
    ) -> GrpcCall<I> {
        let first_reader = body.clone();
        let route = start.route;
        let deadline = start.deadline;
        // Named for what the call does, with the fields the layers' call spans have.
        let hedged = matches!(start.rules.mode, Mode::Hedge(..));
        let span = CallTrace::call_span(hedged, headers.method_name());
        let first_headers = AttemptHeaders {
            previous: None,
            timeout: start.first_timeout(|| tokio::time::Instant::now().into_std()),
        };
        let engine = Engine::new(
            start.rules,
            start.deadline,
            crate::engine::BodyKind::Recorded,
            first_reader.reader_id(),
            start.first_sent_at,
        );
        let mut call = GrpcCall {
            invoker,
            headers,
            options,
            body: Recorded(body),
            engine,
            handles,
            route,
            deadline,
            attempts: Vec::new(),
            last: None,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            timer_at: None,
            commit_seen: false,
            trace: CallTrace::of_call(span),
        };
        // Futures are lazy: the first attempt goes when the call's task first polls it.
        call.start_attempt(AttemptId::FIRST, first_reader, first_headers);
        call
    }

    /// Runs the call to its decision, which goes to `decided`; ends early when the
    /// application drops its receive stream.
    pub(super) async fn run(mut self, mut decided: oneshot::Sender<Answer<I::RecvStream>>) {
        let span = self
            .trace
            .call()
            .cloned()
            .unwrap_or_else(tracing::Span::none);
        async move {
            let mut rng = SmallRng::from_rng(&mut rand::rng());
            let read = || tokio::time::Instant::now().into_std();
            let decision = loop {
                let wake_at = match self.advance(&read, &mut rng) {
                    Ok(decision) => break decision,
                    Err(wake_at) => wake_at,
                };
                if let Some(at) = wake_at
                    && self.timer_at != Some(at)
                {
                    self.timer_at = Some(at);
                    self.timer
                        .as_mut()
                        .reset(tokio::time::Instant::from_std(at));
                }
                let event =
                    poll_fn(|cx| self.poll_event(cx, wake_at.is_some(), &mut decided)).await;
                let mut inputs = Inputs::new(&read, &mut rng);
                match event {
                    Event::Abandoned => return,
                    // The engine's next poll sees the time, and a deadline passed.
                    Event::Timer => {}
                    Event::Committed(reader) => self.engine.on_commit(reader),
                    Event::Answered(index, answer) => {
                        // Its future is done: only its identity is left.
                        let Attempt { id, .. } = self.attempts.swap_remove(index);
                        if let Some(decision) = self.on_answer(id, answer, &mut inputs) {
                            break decision;
                        }
                    }
                }
            };
            // The answer goes to the application; its sender goes on here, so that one task
            // does the call's work until the application drops its receive stream.
            let mut decision = decision;
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

    /// Carries out what the engine asks until it waits: `Ok` with the call's decision when it
    /// ends, `Err` with when to wake it otherwise.
    fn advance(
        &mut self,
        read: &dyn Fn() -> std::time::Instant,
        rng: &mut SmallRng,
    ) -> Result<Answer<I::RecvStream>, Option<std::time::Instant>> {
        let mut inputs = Inputs::new(read, rng);
        loop {
            match self.engine.poll(&mut inputs) {
                Action::Send(send) => self.send(send, &mut inputs),
                Action::Post(records) => {
                    books(&self.handles, self.route, self.headers.method_name()).post(&records);
                }
                Action::Cancel(kept) => {
                    self.attempts.retain(|attempt| Some(attempt.id) == kept);
                    self.trace.cancelled(kept);
                }
                Action::TimedOut(id) => {
                    self.attempts.retain(|attempt| attempt.id != id);
                    self.trace.timed_out(id);
                    // CANCELLED, as C-core ends a call whose last attempt timed out.
                    let trailers =
                        status(StatusCodeError::Cancelled, crate::error::ATTEMPT_TIMED_OUT);
                    self.last = Some((id, Answer::ended(trailers)));
                }
                Action::End(End::Last(id), marks) => {
                    return Ok(match self.last.take() {
                        Some((kept, answered)) if kept == id => self.answer(answered, marks),
                        _ => Answer::ended(status(
                            StatusCodeError::Unavailable,
                            "the call ended with no answer kept",
                        )),
                    });
                }
                Action::End(End::DeadlineExceeded, marks) => {
                    self.close();
                    let attempts = marks.attempts.sent();
                    let message = format!("deadline exceeded after {attempts} attempt(s)");
                    let trailers = status(StatusCodeError::DeadlineExceeded, &message);
                    return Ok(marked(Answer::ended(trailers), marks));
                }
                Action::Wait(at) => return Err(at),
            }
        }
    }

    /// A send the engine asked for: the channel is always ready, so it goes at once if the
    /// engine admits it.
    fn send(&mut self, send: Dispatch, inputs: &mut Inputs<'_>) {
        if let Some(reader) = self.body.0.committed_reader() {
            // The body committed itself (as a sender read it) since the call last looked: no
            // new attempt may start, and the engine is told before it asks again.
            self.commit_seen = true;
            self.engine.on_commit(reader);
            return;
        }
        if self.engine.admit(send, Readiness::Ready, inputs) != Admission::Send {
            return;
        }
        let reader = self.body.0.clone();
        let (id, attempt_headers) = self.engine.on_sent(send, reader.reader_id(), inputs);
        self.trace.sent(id, Some(send));
        self.start_attempt(id, reader, attempt_headers);
    }

    /// Starts attempt `id` on the channel, with its own reader of the messages and the
    /// headers the engine gave it.
    fn start_attempt(
        &mut self,
        id: AttemptId,
        reader: ReplayBody<Messages>,
        attempt_headers: AttemptHeaders,
    ) {
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
        let future = async move {
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
        };
        self.attempts.push(Attempt {
            id,
            future: Box::pin(future),
        });
    }

    /// What wakes the call: an attempt's first item, the timer, the body's commit, or the
    /// application gone.
    fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
        timed: bool,
        decided: &mut oneshot::Sender<Answer<I::RecvStream>>,
    ) -> Poll<Event<I::RecvStream>> {
        if decided.poll_closed(cx).is_ready() {
            return Poll::Ready(Event::Abandoned);
        }
        // As the layers' driver: the timer first (a passed deadline ends the call before an
        // answer ready in the same poll is accepted), then the body's commit (which cuts off
        // the other attempts before their answers count), then the answers.
        if timed && self.timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Timer);
        }
        if !self.commit_seen
            && let Poll::Ready(reader) = self.body.0.poll_committed(cx)
        {
            self.commit_seen = true;
            return Poll::Ready(Event::Committed(reader));
        }
        for (index, attempt) in self.attempts.iter_mut().enumerate() {
            let _entered = self.trace.enter(attempt.id);
            if let Poll::Ready(answer) = attempt.future.as_mut().poll(cx) {
                return Poll::Ready(Event::Answered(index, answer));
            }
        }
        Poll::Pending
    }

    /// Tells the engine how attempt `id` answered; gives the call's decision if this answer
    /// ends it.
    fn on_answer(
        &mut self,
        id: AttemptId,
        answered: Answer<I::RecvStream>,
        inputs: &mut Inputs<'_>,
    ) -> Option<Answer<I::RecvStream>> {
        let headers = HeaderMap::new();
        let view = match &answered.first {
            // A response has begun: the call commits to it.
            ResponseStreamItem::Headers(_) => AttemptResult::Response {
                status: StatusCode::OK,
                headers: &headers,
            },
            ResponseStreamItem::Trailers(trailers) => status_of(trailers),
            // Out of gRPC's order, or a stream that closed with no status: the call broke, a
            // transport error as the layers' are (classified UNAVAILABLE for gRPC).
            ResponseStreamItem::Message | ResponseStreamItem::StreamClosed => {
                AttemptResult::Error(&StreamBroke)
            }
        };
        let (verdict, outcome) = self.engine.on_answer(id, view, &self.body, inputs);
        self.trace.answered(id, &outcome);
        match verdict {
            Verdict::Return(marks) => Some(self.answer(answered, marks)),
            Verdict::Keep => {
                self.last = Some((id, answered));
                None
            }
            Verdict::Drop => None,
        }
    }

    /// The decision that hands an attempt's answer to the application, marked with the
    /// retry attempts made (`marks`); the call's books close with it. An answer in trailers
    /// ends the call: its sender stops, and with it the last reader of the messages.
    fn answer(
        &mut self,
        mut answered: Answer<I::RecvStream>,
        marks: AttemptMarks,
    ) -> Answer<I::RecvStream> {
        // Every other attempt is dropped unanswered.
        self.attempts.clear();
        self.trace.cancelled(None);
        if matches!(answered.first, ResponseStreamItem::Trailers(_)) {
            answered.sender = None;
        } else {
            answered.deadline = self.deadline;
        }
        self.close();
        marked(answered, marks)
    }
}

impl<I: Invoke> GrpcCall<I> {
    /// Closes the call's books (see [`Engine::close`]).
    fn close(&mut self) {
        let (handles, headers) = (&self.handles, &self.headers);
        self.engine
            .close(|| books(handles, self.route, headers.method_name()))
    }
}

/// Where the books of a call on `path` go, as the layers' driver posts to them.
fn books<'a>(handles: &'a Handles, route: Option<usize>, path: &'a str) -> Books<'a> {
    Books {
        policies: &handles.policies,
        route,
        path,
        #[cfg(feature = "opentelemetry")]
        authority: None,
        #[cfg(feature = "opentelemetry")]
        extensions: None,
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

/// The call's books are closed when its state goes, however the call ended: with an answer,
/// abandoned, or its task aborted with the application's receive stream.
impl<I: Invoke> Drop for GrpcCall<I> {
    fn drop(&mut self) {
        self.close();
    }
}

/// What woke a call.
enum Event<R> {
    /// The attempt at this index in the list answered; its future is done.
    Answered(usize, Answer<R>),
    Timer,
    Committed(u64),
    Abandoned,
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
    let mut unframe = Unframe::default();
    let mut messages = Vec::new();
    while let Some(frame) = reader.frame().await {
        let Ok(frame) = frame else {
            // The call committed to another attempt, which alone sends on. Ending this
            // request stream would tell the server it is whole: wait, holding it, until the
            // call drops this attempt (and aborts this task).
            return std::future::pending::<()>().await;
        };
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        unframe.push(chunk, &mut messages);
        for message in messages.drain(..) {
            if send
                .send(&Encoded(message), SendOptions::default())
                .await
                .is_err()
            {
                return;
            }
        }
    }
}
