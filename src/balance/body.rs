//! [`ResponseBody`]: a response body that tells the balancer how its gRPC call ended.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};

use super::outlier::health::{Health, Score};

pin_project_lite::pin_project! {
    /// The body of a response that came through [`Balance`](super::Balance): the endpoint's
    /// body, as it is.
    ///
    /// When a gRPC response has begun (status 200, no `grpc-status` in its headers), its status
    /// comes in the trailers: this body reads them as they pass and tells the balancer's
    /// outlier detection whether the call failed, as the crate's gRPC classifier reads them.
    /// An error of the body is `UNAVAILABLE`, as that classifier reads an error; a body
    /// dropped before its end counts for nothing (the caller gave up, not the backend).
    /// Every other response was judged on its head, and its body is passed through untouched.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body::Body as _;
    /// use http_body_util::Full;
    /// use tower_retry_hedge::balance::ResponseBody;
    ///
    /// // What a caller of the balancer gets: the endpoint's body, read through.
    /// fn inspect(response: http::Response<ResponseBody<Full<Bytes>>>) -> Full<Bytes> {
    ///     let body = response.into_body();
    ///     let _bytes_left = body.size_hint().lower();
    ///     let _inner: &Full<Bytes> = body.get_ref();
    ///     body.into_inner() // and the balancer no longer reads it
    /// }
    /// # let _ = inspect;
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        inner: B,
        watch: Option<Arc<Health>>,
    }
}

impl<B> ResponseBody<B> {
    /// A body that reports nothing.
    pub(crate) fn plain(inner: B) -> Self {
        ResponseBody { inner, watch: None }
    }

    /// A body that reports its trailers (or its error) to `health`.
    pub(crate) fn watched(inner: B, health: Arc<Health>) -> Self {
        ResponseBody {
            inner,
            watch: Some(health),
        }
    }

    /// Whether the body still has an outcome to report.
    #[cfg_attr(not(feature = "tonic-transport"), allow(dead_code))]
    pub(crate) fn is_watched(&self) -> bool {
        self.watch.is_some()
    }

    /// The endpoint's body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The endpoint's body; the balancer no longer learns how the call ends.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> ResponseBody<B> {
    /// Reports a body that has already ended without trailers: nothing says it failed.
    #[cfg_attr(not(feature = "tonic-transport"), allow(dead_code))]
    pub(crate) fn settle_if_ended(&mut self) {
        if self.inner.is_end_stream()
            && let Some(health) = self.watch.take()
        {
            health.record(Score::Success);
        }
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(health) = this.watch {
            let verdict = match &frame {
                Some(Ok(frame)) => frame
                    .trailers_ref()
                    .map(|trailers| health.failures().trailers(trailers)),
                Some(Err(_)) => Some(health.failures().broken_body()),
                None => Some(Score::Success),
            };
            if let Some(verdict) = verdict
                && let Some(health) = this.watch.take()
            {
                health.record(verdict);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.inner)
            .field("watched", &self.watch.is_some())
            .finish()
    }
}
