//! The loop around the [engine](crate::engine) that runs one call, whichever driver gives it
//! its IO: the tower layer ([`crate::retry`]) or the `grpc` interceptor.
//!
//! The loop owns what every driver would otherwise write out: the attempts in flight (the
//! first in place, the later ones boxed), the failure kept as the call's last, the one timer,
//! the order of events (the timer, then the body's commit, then the answers), the handling
//! of each [`Action`], the call's span and its [`CallTrace`], the books, and the commit of
//! the body. A driver gives it only its IO ([`Io`], [`Attempts`]): whether its service is
//! ready, starting an attempt with its headers, reading an attempt's answer as an
//! [`AttemptResult`], stopping an attempt. What a driver cannot do (the `grpc` interceptor
//! cannot reset an attempt, nor tell an attempt that never left) is a property of the IO it
//! gives, not a branch here.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::classify::AttemptResult;
use crate::engine::{
    Action, Admission, AttemptHeaders, AttemptId, AttemptMarks, Books, CommitBody, End, Engine,
    Inputs, Readiness, Verdict,
};
use crate::telemetry::CallTrace;

/// The reader id no attempt holds: a commit to it cuts off every attempt in flight.
const NO_READER: u64 = u64::MAX;

/// What the loop holds of a driver's IO, and what it needs of it when the call is dropped.
pub(crate) trait Io {
    /// An attempt in flight, as the driver started it.
    type Attempt;
    /// How an attempt answered.
    type Answer;
    /// What the IO keeps for the attempts after the first (the tower layer's own clone of
    /// its service): made, with the rest of what those attempts need, only when the call
    /// sends a second attempt.
    type Later: Default;

    /// Where the call's books go (see [`Books`]).
    fn books(&self) -> Books<'_>;

    /// The caller dropped the call with `in_flight` attempts still running: they are
    /// dropped with it.
    fn abandon(&mut self, in_flight: usize);
}

/// How a driver starts, reads and stops attempts, and makes the call's result.
pub(crate) trait Attempts: Io + CommitBody {
    /// A copy of the request body for a new attempt.
    type Copy;
    /// What the call gives its caller.
    type Output;

    /// Whether an attempt can be sent now: `Err` with the answer the call ends with when the
    /// service failed (the engine decides whether it does).
    fn poll_ready(
        &mut self,
        later: &mut Self::Later,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Answer>>;

    /// A copy of the body for a new attempt, and the id of its reader; `None` when no new
    /// attempt may start (the body committed itself, or could be sent only once).
    fn copy_body(&mut self) -> Option<(Self::Copy, u64)>;

    /// Starts attempt `id` (a hedge when `hedge`) with `body` and the headers the engine
    /// gave it.
    fn start(
        &mut self,
        later: &mut Self::Later,
        body: Self::Copy,
        id: AttemptId,
        hedge: bool,
        headers: AttemptHeaders,
    ) -> Self::Attempt;

    /// Polls an attempt for its answer.
    fn poll_attempt(attempt: Pin<&mut Self::Attempt>, cx: &mut Context<'_>) -> Poll<Self::Answer>;

    /// An answer as the engine reads it. Called once per answer, so the IO may count what it
    /// sees there (the tower layer counts an attempt a reset guard of `h2` failed).
    fn read<'a>(&'a self, answer: &'a Self::Answer) -> AttemptResult<'a>;

    /// Stops attempt `id`, which the call no longer needs; `attempt` is its future, when it
    /// can be moved (the first attempt in place cannot, and is dropped).
    fn stop(&mut self, id: AttemptId, attempt: Option<Pin<Box<Self::Attempt>>>);

    /// Drops an answer the call does not return.
    fn discard(&mut self, answer: Self::Answer);

    /// The reader the body committed itself to, once it has; else registers the call to be
    /// woken when it does.
    fn poll_committed(&self, cx: &mut Context<'_>) -> Poll<u64>;

    /// The reader the body committed itself to, if it has.
    fn committed_reader(&self) -> Option<u64>;

    /// The answer of a call that ends without one from an attempt.
    fn ended(&self, why: Ended) -> Self::Answer;

    /// The call's result: `answer`, marked with the call's attempts.
    fn finish(&mut self, answer: Self::Answer, marks: AttemptMarks) -> Self::Output;
}

/// Why a call has no attempt's answer to give (see [`Attempts::ended`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// An attempt outlived its per-attempt timeout: kept as the call's last failure.
    AttemptTimedOut,
    /// The call's deadline passed after this many sends.
    DeadlineExceeded(u32),
    /// The engine ended the call with no failure kept, which it should never do: a bug.
    NoAnswer,
}

pin_project! {
    /// One call the engine runs, over a driver's IO `D`.
    #[project = DriveProj]
    pub(crate) struct Drive<D: Io> {
        // The first attempt: in place where the call never stops it while it runs, so that a
        // call answered by it allocates nothing more than the box of the rest.
        #[pin]
        first: First<D::Attempt>,
        // Boxed: a few hundred bytes, which a future would otherwise carry (and copy) through
        // every layer above it.
        state: Box<State<D>>,
    }

    impl<D: Io> PinnedDrop for Drive<D> {
        // The call's books are closed once, when it ends: returned or dropped.
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let later = this.state.later.as_ref().map_or(0, |later| later.attempts.len());
            let in_flight = usize::from(this.first.is_some()) + later;
            if in_flight > 0 {
                this.state.io.abandon(in_flight);
            }
            this.state.close();
        }
    }
}

/// What a call keeps besides its first attempt.
pub(crate) struct State<D: Io> {
    // The attempts after the first, and the kept failure, once the call needs them.
    later: Option<Box<Later<D>>>,
    // The one timer, at the earliest time the engine asks for. Made when the call first waits.
    timer: Option<Pin<Box<Sleep>>>,
    engine: Engine,
    // The call's span and its attempts', if the call's span is enabled.
    trace: CallTrace,
    io: D,
}

/// What a call keeps once its first attempt is not enough: boxed, so that a call answered
/// by its first attempt carries one word for it.
struct Later<D: Io> {
    // The attempts after the first, in the order they were sent: boxed, so that the list can
    // grow and shrink under them, and so that each can be let finish on a task of its own.
    attempts: Vec<(AttemptId, Pin<Box<D::Attempt>>)>,
    // The last failure kept, returned if nothing better comes.
    last: Option<D::Answer>,
    io: D::Later,
}

impl<D: Io> State<D> {
    /// Closes the call's books (see [`Engine::close`]).
    fn close(&mut self) {
        let io = &self.io;
        self.engine.close(|| io.books())
    }

    /// What the call keeps beyond its first attempt, made when it first needs it.
    fn later(&mut self) -> &mut Later<D> {
        Later::of(&mut self.later)
    }
}

impl<D: Attempts> State<D> {
    /// Keeps `answer` as the call's last failure, or drops it, as the engine's `verdict`
    /// (not [`Verdict::Return`]) says.
    fn settle(&mut self, verdict: Verdict, answer: D::Answer) {
        let dropped = match verdict {
            Verdict::Keep => self.later().last.replace(answer),
            Verdict::Return(_) | Verdict::Drop => Some(answer),
        };
        if let Some(dropped) = dropped {
            self.io.discard(dropped);
        }
    }
}

impl<D: Io> Later<D> {
    /// What the call keeps in `slot` beyond its first attempt, made when it first needs it.
    fn of(slot: &mut Option<Box<Later<D>>>) -> &mut Later<D> {
        slot.get_or_insert_with(|| {
            Box::new(Later {
                attempts: Vec::new(),
                last: None,
                io: D::Later::default(),
            })
        })
    }
}

impl<D: Io> Drive<D> {
    /// What a call keeps besides its first attempt, made before that attempt is sent (it
    /// takes the request's parts): its engine, its `span`, and the driver's IO. The engine
    /// and the IO are made by `engine` and `io` in the box's frame, so that neither is copied
    /// into it on the way.
    // Inlined, the closures write the engine and the IO where the box is filled from: 4 764
    // instructions per call of a retry policy on the echo (`benches/support/instructions.sh`)
    // with, 4 819 without.
    #[inline(always)]
    pub(crate) fn state(
        engine: impl FnOnce() -> Engine,
        span: tracing::Span,
        io: impl FnOnce() -> D,
    ) -> Box<State<D>> {
        Box::new(State {
            later: None,
            timer: None,
            engine: engine(),
            trace: CallTrace::of_call(span),
            io: io(),
        })
    }

    /// A call whose first attempt, `first`, was just sent: in place, unless `boxed` (the
    /// call may stop it while it runs and let it finish on a task of its own).
    pub(crate) fn new(first: D::Attempt, boxed: bool, state: Box<State<D>>) -> Self {
        Drive {
            first: First::new(first, boxed),
            state,
        }
    }
}

impl<D: Io> Drive<D> {
    /// The call's span (a disabled one when tracing does not enable it), for work of the call
    /// done outside the loop.
    #[cfg(feature = "grpc")]
    pub(crate) fn span(&self) -> tracing::Span {
        self.state
            .trace
            .call()
            .cloned()
            .unwrap_or_else(tracing::Span::none)
    }
}

impl<D: Attempts> Future for Drive<D> {
    type Output = D::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<D::Output> {
        let mut this = self.project();
        let span = this.state.trace.call().cloned();
        let _enter = span.as_ref().map(tracing::Span::enter);
        let read = || tokio::time::Instant::now().into_std();
        let mut rng = LazyRng::default();
        let mut inputs = Inputs::new(&read, &mut rng);
        loop {
            // Events in a fixed order: the timer (the deadline wins over an answer ready in
            // the same poll), the body's commit (seen before any answer), then the answers.
            if poll_timer(&mut this.state.timer, cx) {
                inputs.timer_fired();
            }
            if let Poll::Ready(reader) = this.state.io.poll_committed(cx) {
                this.state.engine.on_commit(reader);
            }
            let answered = poll_attempts(&mut this, &mut inputs, cx);
            if answered.is_ready() {
                // The books close as the result is given, before the caller sees it.
                this.state.close();
                return answered;
            }
            match act(&mut this, &mut inputs, cx) {
                Some(Progress::Done(output)) => {
                    this.state.close();
                    return Poll::Ready(output);
                }
                Some(Progress::Again) => continue,
                None => return Poll::Pending,
            }
        }
    }
}

enum Progress<T> {
    /// Something changed (an attempt was sent or the timer fired): look again.
    Again,
    Done(T),
}

/// Polls every attempt in flight, and feeds each answer to the engine; gives the call's
/// result if an answer ends it. An answer stays here until it is returned, kept or dropped,
/// rather than being copied into the functions that decide on it.
fn poll_attempts<D: Attempts>(
    this: &mut DriveProj<'_, D>,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Poll<D::Output> {
    if this.first.is_some() {
        let entered = this.state.trace.enter(AttemptId::FIRST);
        let polled = this.first.as_mut().poll(cx, D::poll_attempt);
        drop(entered);
        if let Some(Poll::Ready(answer)) = polled {
            this.first.set(First::Gone);
            match on_answer(this, AttemptId::FIRST, &answer, inputs) {
                Verdict::Return(marks) => return Poll::Ready(this.state.io.finish(answer, marks)),
                verdict => this.state.settle(verdict, answer),
            }
        }
    }
    let mut i = 0;
    while let Some((id, attempt)) = this
        .state
        .later
        .as_mut()
        .and_then(|later| later.attempts.get_mut(i))
    {
        let id = *id;
        let entered = this.state.trace.enter(id);
        let polled = D::poll_attempt(attempt.as_mut(), cx);
        drop(entered);
        let Poll::Ready(answer) = polled else {
            i += 1;
            continue;
        };
        this.state.later().attempts.remove(i);
        match on_answer(this, id, &answer, inputs) {
            Verdict::Return(marks) => return Poll::Ready(this.state.io.finish(answer, marks)),
            verdict => this.state.settle(verdict, answer),
        }
    }
    Poll::Pending
}

/// Carries out the engine's actions until it waits (`None`) or ends the call.
fn act<D: Attempts>(
    this: &mut DriveProj<'_, D>,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Option<Progress<D::Output>> {
    loop {
        match this.state.engine.poll(inputs) {
            Action::Send(send) => {
                let state = &mut **this.state;
                if let Some(reader) = state.io.committed_reader() {
                    // The body committed itself (as an attempt read it) since the call last
                    // looked: no new attempt may start, and the engine is told before it
                    // grants the send anything (a token, a hedge of its budget).
                    state.engine.on_commit(reader);
                    return Some(Progress::Again);
                }
                let later = Later::of(&mut state.later);
                let (readiness, failure) = match state.io.poll_ready(&mut later.io, cx) {
                    Poll::Ready(Ok(())) => (Readiness::Ready, None),
                    Poll::Pending => (Readiness::Pending, None),
                    Poll::Ready(Err(answer)) => (Readiness::Failed, Some(answer)),
                };
                match state.engine.admit(send, readiness, inputs) {
                    Admission::Send => {}
                    Admission::Refused | Admission::OverBudget => return Some(Progress::Again),
                    // The engine's later times still run while the service is not ready.
                    Admission::Wait(at) if arm(&mut state.timer, at, cx) => {
                        inputs.timer_fired();
                        return Some(Progress::Again);
                    }
                    Admission::Wait(_) => return None,
                    Admission::Failed(marks) => {
                        let answer = failure.expect("the service failed");
                        return Some(Progress::Done(state.io.finish(answer, marks)));
                    }
                }
                let Some((body, reader)) = state.io.copy_body() else {
                    // The body committed itself as it was copied. One that gives no copy and
                    // names no reader breaks its contract ([`crate::body::Copies::copy`]):
                    // committed to none, the call ends rather than ask for a copy forever.
                    let reader = state.io.committed_reader().unwrap_or(NO_READER);
                    state.engine.on_commit(reader);
                    return Some(Progress::Again);
                };
                let (id, headers) = state.engine.on_sent(send, reader, inputs);
                let later = Later::of(&mut state.later);
                let attempt = state.io.start(&mut later.io, body, id, send.hedge, headers);
                later.attempts.push((id, Box::pin(attempt)));
                state.trace.sent(id, Some(send));
                return Some(Progress::Again);
            }
            Action::Post(records) => this.state.io.books().post(&records),
            Action::Cancel(kept) => {
                stop_attempts(this, |id| Some(id) == kept);
                this.state.trace.cancelled(kept);
            }
            Action::TimedOut(id) => {
                stop_attempts(this, |a| a != id);
                let state = &mut **this.state;
                state.trace.timed_out(id);
                state.later().last = Some(state.io.ended(Ended::AttemptTimedOut));
            }
            Action::End(end, marks) => {
                stop_attempts(this, |_| false);
                let state = &mut **this.state;
                let last = state.later.take().and_then(|later| later.last);
                let answer = match end {
                    End::Last(_) => last.unwrap_or_else(|| state.io.ended(Ended::NoAnswer)),
                    // A failure kept is dropped, uncounted, as before the one loop.
                    End::DeadlineExceeded => state
                        .io
                        .ended(Ended::DeadlineExceeded(marks.attempts.sent())),
                };
                return Some(Progress::Done(state.io.finish(answer, marks)));
            }
            Action::Wait(at) => {
                if !arm(&mut this.state.timer, at, cx) {
                    return None;
                }
                inputs.timer_fired();
            }
        }
    }
}

/// Feeds one attempt's answer to the engine and gives its verdict. When the answer ends the
/// call, every other attempt is stopped first, and the failure kept dropped.
fn on_answer<D: Attempts>(
    this: &mut DriveProj<'_, D>,
    id: AttemptId,
    answer: &D::Answer,
    inputs: &mut Inputs<'_>,
) -> Verdict {
    let state = &mut **this.state;
    let view = state.io.read(answer);
    let (verdict, outcome) = state.engine.on_answer(id, view, &state.io, inputs);
    state.trace.answered(id, &outcome);
    // A call answered by its only attempt has nothing left to stop.
    if let Verdict::Return(_) = verdict
        && (this.first.is_some() || this.state.later.is_some())
    {
        stop_attempts(this, |_| false);
        let state = &mut **this.state;
        state.trace.cancelled(None);
        if let Some(earlier) = state.later.take().and_then(|later| later.last) {
            state.io.discard(earlier);
        }
    }
    verdict
}

/// Stops the attempts in flight that `keep` does not keep.
fn stop_attempts<D: Attempts>(this: &mut DriveProj<'_, D>, keep: impl Fn(AttemptId) -> bool) {
    let state = &mut **this.state;
    if this.first.is_some() && !keep(AttemptId::FIRST) {
        let first = this.first.as_mut().take();
        state.io.stop(AttemptId::FIRST, first);
    }
    if let Some(later) = &mut state.later {
        for (id, attempt) in later.attempts.extract_if(.., |(id, _)| !keep(*id)) {
            state.io.stop(id, Some(attempt));
        }
    }
}

/// Polls the call's timer; tells whether it has fired.
fn poll_timer(timer: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>) -> bool {
    timer
        .as_mut()
        .is_some_and(|timer| timer.as_mut().poll(cx).is_ready())
}

/// Sets the call's timer to fire at `at` and polls it; tells whether it has fired.
fn arm(
    timer: &mut Option<Pin<Box<Sleep>>>,
    at: Option<std::time::Instant>,
    cx: &mut Context<'_>,
) -> bool {
    let Some(at) = at else {
        return false;
    };
    let at = tokio::time::Instant::from_std(at);
    let timer = match timer {
        Some(timer) => {
            if timer.deadline() != at {
                timer.as_mut().reset(at);
            }
            timer
        }
        None => timer.insert(Box::pin(tokio::time::sleep_until(at))),
    };
    timer.as_mut().poll(cx).is_ready()
}

pin_project! {
    /// The first attempt.
    #[project = FirstProj]
    enum First<F> {
        // In place, for a call that never stops its first attempt while it runs (a retry
        // policy without a deadline or a per-attempt timeout): it allocates nothing for it.
        Inline { #[pin] attempt: F },
        // Boxed, for a call that may stop it (a hedge that loses, a deadline): so that it can
        // be let finish on a task of its own (see `crate::resets`).
        Boxed { attempt: Option<Pin<Box<F>>> },
        Gone,
    }
}

impl<F> First<F> {
    fn new(attempt: F, boxed: bool) -> First<F> {
        match boxed {
            true => First::Boxed {
                attempt: Some(Box::pin(attempt)),
            },
            false => First::Inline { attempt },
        }
    }

    fn is_some(&self) -> bool {
        !matches!(self, First::Gone)
    }

    /// Polls the attempt with `poll`, if it is still there.
    fn poll<T>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut F>, &mut Context<'_>) -> Poll<T>,
    ) -> Option<Poll<T>> {
        match self.project() {
            FirstProj::Inline { attempt } => Some(poll(attempt, cx)),
            FirstProj::Boxed { attempt } => attempt.as_mut().map(|a| poll(a.as_mut(), cx)),
            FirstProj::Gone => None,
        }
    }

    /// Takes the attempt out, if it is boxed; one in place is dropped.
    fn take(mut self: Pin<&mut Self>) -> Option<Pin<Box<F>>> {
        let boxed = match self.as_mut().project() {
            FirstProj::Boxed { attempt } => attempt.take(),
            _ => None,
        };
        self.set(First::Gone);
        boxed
    }
}

/// The thread's random generator, taken only when the engine draws a jitter.
#[derive(Default)]
struct LazyRng(Option<rand::rngs::ThreadRng>);

impl rand::RngCore for LazyRng {
    fn next_u32(&mut self) -> u32 {
        self.0.get_or_insert_with(rand::rng).next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.0.get_or_insert_with(rand::rng).next_u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.get_or_insert_with(rand::rng).fill_bytes(dest)
    }
}
