//! The tower layer's IO for the [drive loop](crate::drive) (`RetryLayer` and `HedgeLayer`
//! are one type): its attempts are calls of the service below, the first on the layer's
//! ready service and the later ones on the call's own clone of the spare; its answers are
//! responses and errors; an attempt no longer needed has its stream reset, or is let finish
//! as the table's limit of stream resets says.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::marks::{finish, no_result};
use super::{Call, LayerShared};
use crate::body::Replay;
use crate::classify::AttemptResult;
use crate::drive::{Attempts, Ended, Io};
use crate::engine::{AttemptHeaders, AttemptId, AttemptMarks, Books, CommitBody};
use crate::error::BoxError;
use crate::error::{attempt_timed_out, deadline_exceeded};
use crate::resets::Stop;

/// The service below the layer as the driver needs it: the bounds of the layer's `Service`
/// impl (but `Clone`, which only sending an attempt needs), written once. Its
/// answers are `Response<RB>`, its errors convert into `BoxError`, and its futures may be let
/// finish on a task of their own.
pub(crate) trait Below<B, RB>:
    Service<Request<B>, Response = Response<RB>, Error: Into<BoxError>, Future: Send + 'static>
{
}

impl<S, B, RB> Below<B, RB> for S where
    S: Service<Request<B>, Response = Response<RB>, Error: Into<BoxError>, Future: Send + 'static>
{
}

/// The IO of one call through the layer.
pub(crate) struct LayerIo<S, B: Replay> {
    pub(super) shared: Arc<LayerShared<S>>,
    pub(super) call: Call<B>,
    pub(super) grpc: bool,
    pub(super) deadline: Option<tokio::time::Instant>,
    /// The route the call took (its place in the policy table), whose name its statistics
    /// are kept under (else its path). Four bytes: a call in flight keeps eight fewer.
    pub(super) route: Option<u32>,
}

impl<S, B> Io for LayerIo<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    type Attempt = S::Future;
    type Answer = Result<S::Response, BoxError>;
    /// A clone of the spare service, for the attempts after the first: polled ready only
    /// when an attempt is due, so a pending attempt holds no capacity.
    type Later = Option<S>;

    fn books(&self) -> Books<'_> {
        Books {
            policies: &self.shared.policies,
            route: self.route.map(|route| route as usize),
            path: self.call.path(),
            #[cfg(feature = "opentelemetry")]
            authority: self.call.authority(),
            #[cfg(feature = "opentelemetry")]
            extensions: Some(self.call.extensions()),
        }
    }

    /// Dropping an attempt resets its stream, which the table's limit of stream resets
    /// counts.
    fn abandon(&mut self, in_flight: usize) {
        self.shared.policies.stream_resets().count_resets(in_flight);
    }
}

impl<S, B: Replay> CommitBody for LayerIo<S, B> {
    fn commit(&self, reader: u64) -> u64 {
        self.call.commit(reader)
    }
}

// `Response = Response<RB>` spelled out: an impl's type parameter is constrained only so.
impl<S, B, RB> Attempts for LayerIo<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Below<B, RB> + Clone,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    type Copy = B;
    type Output = Result<Response<RB>, BoxError>;

    /// Polls the call's own service (a clone of the layer's spare) ready. A service that
    /// failed is not polled again.
    fn poll_ready(
        &mut self,
        service: &mut Option<S>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Answer>> {
        let ready = service
            .get_or_insert_with(|| self.shared.service())
            .poll_ready(cx);
        if matches!(ready, Poll::Ready(Err(_))) {
            *service = None;
        }
        ready.map_err(|error| Err(error.into()))
    }

    fn copy_body(&mut self) -> Option<(B, u64)> {
        self.call.copy_body()
    }

    fn start(
        &mut self,
        service: &mut Option<S>,
        body: B,
        id: AttemptId,
        hedge: bool,
        headers: AttemptHeaders,
    ) -> S::Future {
        let request = self.call.request(body, id, hedge, headers);
        let service = service.as_mut().expect("polled ready before a send");
        super::sending(|| service.call(request))
    }

    fn poll_attempt(attempt: Pin<&mut S::Future>, cx: &mut Context<'_>) -> Poll<Self::Answer> {
        attempt.poll(cx).map_err(Into::into)
    }

    /// Also counts an attempt that failed because a rapid-reset guard of `h2` closed its
    /// connection.
    fn read<'a>(&'a self, answer: &'a Self::Answer) -> AttemptResult<'a> {
        match answer {
            Ok(response) => AttemptResult::Response {
                status: response.status(),
                headers: response.headers(),
            },
            Err(error) => {
                let resets = self.shared.policies.stream_resets();
                if resets.guard_of(&**error).is_some() {
                    self.books().method_stats().record_reset_guard_failure();
                }
                AttemptResult::Error(&**error)
            }
        }
    }

    /// Resets the attempt's stream by dropping it, or lets it finish on a task of its own, as
    /// the table's limit of stream resets says (see `crate::resets`).
    fn stop(&mut self, id: AttemptId, attempt: Option<Pin<Box<S::Future>>>) {
        let resets = self.shared.policies.stream_resets();
        let can_finish = attempt.is_some() && self.call.every_attempt_may_finish();
        let stop = resets.stop(can_finish);
        if stop == Stop::Reset {
            return;
        }
        let stats = self.books().method_stats();
        stop.record(&stats);
        if let (Stop::Finish, Some(attempt)) = (stop, attempt) {
            tracing::debug!(attempt = id.send, "attempt let finish");
            crate::resets::let_finish(resets, attempt, self.deadline, stats);
        }
    }

    /// A response whose body has not ended resets its stream as it is dropped, which the
    /// table's limit of stream resets counts.
    fn discard(&mut self, answer: Self::Answer) {
        if let Ok(response) = &answer
            && !response.body().is_end_stream()
        {
            self.shared.policies.stream_resets().count_resets(1);
        }
    }

    fn poll_committed(&self, cx: &mut Context<'_>) -> Poll<u64> {
        self.call.poll_committed(cx)
    }

    fn committed_reader(&self) -> Option<u64> {
        self.call.committed_reader()
    }

    fn ended(&self, why: Ended) -> Self::Answer {
        Err(match why {
            Ended::AttemptTimedOut => attempt_timed_out(self.grpc),
            Ended::DeadlineExceeded(_) => deadline_exceeded(self.grpc),
            Ended::NoAnswer => no_result(),
        })
    }

    fn finish(&mut self, answer: Self::Answer, marks: AttemptMarks) -> Self::Output {
        finish(answer, marks, self.grpc)
    }
}
