//! The future of a call through either layer: the inner service's own future for a call
//! the layer passes through, or the driver of a call the engine runs.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::driver::Driver;
use crate::BoxError;
use crate::body::Replay;

pin_project! {
    /// The future of a call through either layer.
    #[project = CallFutureProj]
    pub(crate) enum CallFuture<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // A call this layer does not drive: the inner future as it is.
        Passthrough {
            #[pin]
            future: S::Future,
        },
        // A call the engine runs.
        Driven {
            #[pin]
            driver: Driver<S, B>,
        },
    }
}

impl<S, B> CallFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    pub(crate) fn passthrough(future: S::Future) -> Self {
        CallFuture::Passthrough { future }
    }

    pub(crate) fn driven(driver: Driver<S, B>) -> Self {
        CallFuture::Driven { driver }
    }
}

impl<S, B, RB> Future for CallFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CallFutureProj::Passthrough { future } => future.poll(cx).map_err(Into::into),
            CallFutureProj::Driven { driver } => driver.poll(cx),
        }
    }
}
