//! The seams between a call's future and the transport under it: regressions for races
//! between what the transport's own tasks do with a request body (hyper's connection task,
//! h2's body pipe, tonic's channel) and what the call's future sees of its attempts.
//!
//! Every test runs over real connections on 127.0.0.1 (a tonic channel to the scripted gRPC
//! peer of `tests/common`, a hyper-util client to the scripted HTTP peer or to a small hyper
//! server of its own), with request bodies that stream: the transport's task pulls them, never
//! the test. Races are made likely by many calls in flight; assertions are on counts,
//! statuses, headers and bytes, never on durations. The hang guards only turn a call that
//! never ends into a failure.
//!
//! - `retry_body_error`: a body whose source fails commits the call to the attempt that
//!   pulled the failure, in the same stretch in which that attempt answers 503.
//! - `hedge_commit`: hedged streams that outgrow their per-call limit in a transport task
//!   while attempts fail or answer at the same time.
//! - `hedge_unreplayable`: a body too large to record under a hedging policy whose delay
//!   passes while the only attempt it can make is in flight.
//! - `hedge_ready`: hedges whose service fails to become ready while the first attempt is in
//!   flight.
//!
//! `attempt_peer` is a small gRPC peer of this target's own that answers a call's attempts by
//! their `grpc-previous-rpc-attempts`, not by the order they reach it. Tests that run many
//! calls print what the calls ended with; run with `--nocapture` to see it.

#[path = "../common/mod.rs"]
mod common;

mod attempt_peer;
mod hedge_commit;
mod hedge_ready;
mod hedge_unreplayable;
mod retry_body_error;

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

/// The message of the error a call ends with when the call lost the result it should return.
const NO_RESULT: &str = "no attempt result left to return";

/// Fails the test instead of hanging it if a peer or the layer misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("no progress within the hang guard")
}

/// Every message in an error's chain, outermost first, joined with `": "`.
fn chain_text(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        let _ = write!(text, ": {next}");
        source = next.source();
    }
    text
}

/// Whether an error of type `E` is somewhere in `error`'s chain (itself included).
fn chain_has<E: StdError + 'static>(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if error.is::<E>() {
            return true;
        }
        current = error.source();
    }
    false
}

/// A caller slow to come back to its call: after the first poll, each wake of the call is
/// answered only `pause` later (on a timer; no thread is blocked), as by a task on a busy
/// runtime. Meanwhile the transport's tasks go on pulling the body and reading answers, so
/// what they did piles up for the call's next poll.
struct Late<F: Future> {
    call: Pin<Box<F>>,
    pause: Duration,
    polled: bool,
    until: Option<Pin<Box<Sleep>>>,
}

fn late<F: Future>(call: F, pause: Duration) -> Late<F> {
    Late {
        call: Box::pin(call),
        pause,
        polled: false,
        until: None,
    }
}

impl<F: Future> Future for Late<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if self.polled {
            let pause = self.pause;
            let until = self
                .until
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
            if until.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.until = None;
        }
        self.polled = true;
        self.call.as_mut().poll(cx)
    }
}
