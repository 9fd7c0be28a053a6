//! The attempts a call holds: the first (in place, or boxed when the call may stop it while
//! it runs) and the later ones, each boxed so that it can be let finish on a task of its own.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::engine::AttemptId;

/// An attempt after the first: boxed, so that the list can grow and shrink under it, and
/// so that it can be let finish on a task of its own once the call no longer needs it.
pub(super) struct Attempt<F> {
    pub(super) id: AttemptId,
    pub(super) future: Pin<Box<F>>,
}

pin_project! {
    /// The first attempt's future.
    #[project = FirstProj]
    pub(super) enum First<F> {
        // In place, for a call that never stops its first attempt while it runs (a retry
        // policy without a deadline or a per-attempt timeout): it allocates nothing for it.
        Inline { #[pin] future: F },
        // Boxed, for a call that may stop it (a hedge that loses, a deadline): so that it can
        // be let finish on a task of its own (see `crate::resets`).
        Boxed { future: Option<Pin<Box<F>>> },
        Gone,
    }
}

impl<F: Future> First<F> {
    pub(super) fn new(future: F, boxed: bool) -> First<F> {
        match boxed {
            true => First::Boxed {
                future: Some(Box::pin(future)),
            },
            false => First::Inline { future },
        }
    }

    pub(super) fn is_some(&self) -> bool {
        !matches!(self, First::Gone)
    }

    pub(super) fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Option<Poll<F::Output>> {
        match self.project() {
            FirstProj::Inline { future } => Some(future.poll(cx)),
            FirstProj::Boxed { future } => future.as_mut().map(|f| f.as_mut().poll(cx)),
            FirstProj::Gone => None,
        }
    }

    /// Takes the future out, if it is boxed; one in place is dropped.
    pub(super) fn take(mut self: Pin<&mut Self>) -> Option<Pin<Box<F>>> {
        let boxed = match self.as_mut().project() {
            FirstProj::Boxed { future } => future.take(),
            _ => None,
        };
        self.set(First::Gone);
        boxed
    }
}
