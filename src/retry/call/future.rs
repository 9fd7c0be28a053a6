//! The response future of the layer: the inner service's own future for a call the layer
//! passes through, or the driver of a call the engine runs.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::driver::LayerIo;
use crate::body::Replay;
use crate::drive::Drive;
use crate::error::BoxError;

pin_project! {
    /// The response future of [`Retry`](crate::Retry) (and so of
    /// [`Hedge`](crate::Hedge), the same type).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // A call the layer does not drive (a layer above drives it, or nothing applies to
        // it): the inner future as it is.
        Passthrough {
            #[pin]
            future: S::Future,
        },
        // A call the engine runs.
        Driven {
            #[pin]
            driver: Drive<LayerIo<S, B>>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    pub(crate) fn passthrough(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Passthrough { future },
        }
    }

    pub(crate) fn driven(driver: Drive<LayerIo<S, B>>) -> Self {
        ResponseFuture {
            state: State::Driven { driver },
        }
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Passthrough { future } => future.poll(cx).map_err(Into::into),
            StateProj::Driven { driver } => driver.poll(cx),
        }
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
