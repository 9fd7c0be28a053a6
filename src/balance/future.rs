//! The balancer's response future: the endpoint's, with what it tells outlier detection.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::ResponseBody;
use super::outlier::health::{HeadScore, Health};
use crate::error::BoxError;

/// The balancer was called while no endpoint was ready: `call` without a `poll_ready` that
/// returned ready first, which the `Service` contract rules out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoReadyEndpoint(());

impl fmt::Display for NoReadyEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("balancer called with no ready endpoint")
    }
}

impl std::error::Error for NoReadyEndpoint {}

pin_project_lite::pin_project! {
    /// The response future of [`Balance`]: the endpoint's, with its error boxed and its body
    /// in a [`ResponseBody`]; it tells the outlier detection how the attempt went.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The endpoint's response future, and the record of its backend.
        Called { #[pin] future: F, health: Option<Arc<Health>> },
        // `call` came with no endpoint ready: the error, until polled.
        NotReady { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
    /// The future of an attempt sent to an endpoint whose outcomes `health` records.
    pub(super) fn called(future: F, health: Option<Arc<Health>>) -> Self {
        ResponseFuture {
            state: State::Called { future, health },
        }
    }

    /// The future of a call made while no endpoint was ready.
    pub(super) fn not_ready() -> Self {
        ResponseFuture {
            state: State::NotReady {
                error: Some(Box::new(NoReadyEndpoint(()))),
            },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<ResponseBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future, health } => {
                let result = std::task::ready!(future.poll(cx));
                let Some(health) = health.take() else {
                    return Poll::Ready(
                        result
                            .map(|response| response.map(ResponseBody::plain))
                            .map_err(Into::into),
                    );
                };
                Poll::Ready(match result {
                    Ok(response) => {
                        let head = health
                            .failures()
                            .head(response.status(), response.headers());
                        match head {
                            HeadScore::Settled(verdict) => {
                                health.record(verdict);
                                Ok(response.map(ResponseBody::plain))
                            }
                            HeadScore::Trailers => {
                                Ok(response.map(|body| ResponseBody::watched(body, health)))
                            }
                        }
                    }
                    Err(error) => {
                        let error = error.into();
                        // A connection an HTTP/2 reset guard closed says nothing of the
                        // backend: the client's own resets (or its hedges' at the server)
                        // tripped it.
                        if crate::resets::Guard::of(&*error).is_none() {
                            health.record(health.failures().error(&*error));
                        }
                        Err(error)
                    }
                })
            }
            StateProj::NotReady { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| Box::new(NoReadyEndpoint(()))))),
        }
    }
}
