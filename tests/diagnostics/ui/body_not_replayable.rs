// A retry layer over a service whose request body cannot be replayed: the error names the
// `Replay` trait, the bodies that implement it, and how to box one.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use tower_retry_hedge::{Policies, Retry};
use tower_service::Service;

/// A streaming upload, as a caller's own body type.
struct Upload;

impl http_body::Body for Upload {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(None)
    }
}

#[derive(Clone)]
struct Upstream;

impl Service<Request<Upload>> for Upstream {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Upload>) -> Self::Future {
        ready(Ok(Response::new(String::new())))
    }
}

fn takes_uploads<S: Service<Request<Upload>>>(_: S) {}

fn main() {
    takes_uploads(Retry::new(Upstream, Policies::builder().build()));
}
