//! Requests with a streaming body, as tonic and hyper give, and an echo that reads them: the
//! layers make such a body replayable by recording it (`ReplayBody`), not by cloning.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use tower::Service;
use tower_retry_hedge::BoxError;

use super::{Res, Shape};

/// A request whose body streams.
pub type StreamRequest = Request<UnsyncBoxBody<Bytes, BoxError>>;

/// The `grpc_4_headers` request of the other benchmarks, with its body boxed as a stream.
pub fn stream_request() -> StreamRequest {
    let (parts, body) = super::request(Shape::Grpc4).into_parts();
    let body = body
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    Request::from_parts(parts, body)
}

/// Reads the request body to its end, as a transport would send it, and answers with an
/// empty body.
#[derive(Debug, Clone, Copy)]
pub struct DrainEcho;

impl Service<StreamRequest> for DrainEcho {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: StreamRequest) -> Self::Future {
        let mut body = request.into_body();
        let mut cx = Context::from_waker(Waker::noop());
        let mut sent = 0;
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
            sent += frame.data_ref().map_or(0, |data| data.len());
        }
        black_box(sent);
        ready(Ok(Response::new(Full::new(Bytes::new()))))
    }
}
