//! The response future of both layers: the call's driver, or the inner future for a call
//! that the other layer owns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::BoxError;
use crate::body::Replay;
use crate::call::CallFuture;

pin_project! {
    /// The response future of [`Retry`](super::Retry) and [`Hedge`](crate::Hedge).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        #[pin]
        inner: CallFuture<S, B>,
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    pub(crate) fn new(inner: CallFuture<S, B>) -> Self {
        ResponseFuture { inner }
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
