//! What the layers tell about their calls: tracing spans and events, gRFC A96 metrics over
//! OpenTelemetry, and state that can be read at any time.
//!
//! - **Tracing**: a span per call (through the layers and the `grpc` interceptor alike), a
//!   span per attempt under it (gRFC A45's attempt span, with `previous-rpc-attempts` and
//!   `transparent-retry`), and one event per decision the call makes. All at `DEBUG`: a
//!   subscriber that does not enable `DEBUG` for this crate pays one relaxed atomic load per
//!   span or event, nothing more. Every span, event and field is listed in the table below;
//!   the `tracing` test binary holds the table to what the crate emits.
//! - **Metrics** (feature `opentelemetry`): gRFC A96's per-call histograms, recorded once when
//!   a call ends, on a [`Meter`](opentelemetry::metrics::Meter) you pass to
//!   [`PoliciesBuilder::metrics`](crate::policy::PoliciesBuilder::metrics). See [`RetryMetrics`].
//! - **State**: [`Policies::stats`](crate::Policies::stats) (A6's per-method statistics,
//!   kept under the gRPC method or the route's name),
//!   [`Policies::throttle_state`](crate::Policies::throttle_state) (the throttle's tokens and
//!   threshold, whether it was built in code or from service-config JSON) and
//!   [`Policies::buffer_limits`](crate::Policies::buffer_limits)`().in_use()` (the replay
//!   buffer budget taken now).
//!
//! # Spans and events
//!
//! Span names and event messages are fixed strings, so a filter or a log query can match
//! them. `attempt` is the attempt's place in the order of sends (1 for the first, transparent
//! retries included); `previous-rpc-attempts` is A6's count of the counted attempts before it,
//! which leaves transparent retries out, as the `grpc-previous-rpc-attempts` header does.
//! Events of a call are emitted inside its span.
//!
//! | kind | name | level | fields | what and when |
//! |---|---|---|---|---|
//! | span | `retry` | DEBUG | `path`, `http.request.resend_count` | a call with a retry policy, or with none (it gets A6's transparent retries), whichever driver runs it (a layer, or the `grpc` interceptor); `http.request.resend_count` (the OpenTelemetry HTTP attribute) is recorded at each attempt after the first |
//! | span | `hedge` | DEBUG | `path`, `http.request.resend_count` | a call with a hedging policy, the same fields |
//! | span | `attempt` | DEBUG | `attempt`, `previous-rpc-attempts`, `transparent-retry`, `hedge`, `outcome` | one attempt, a child of its call's span (made only when that span is enabled), entered while the attempt is polled, closed when it ends; `outcome` is recorded then: `success`, `retryable`, `fatal`, `not sent`, `refused` (how the policy's classifier saw the answer), `timed out` (its per-attempt timeout), or `cancelled` (dropped unanswered: another attempt won, the deadline passed, or the caller dropped the call) |
//! | event | `retrying` | DEBUG | `attempt`, `delay`, `reason` | a retry is scheduled: `attempt` will be sent after `delay`; `reason` is `backoff`, `pushback` (the server's delay, exactly) or `per-attempt timeout` (hedging on it: at once) |
//! | event | `transparent retry` | DEBUG | `attempt`, `delay`, `reason` | `attempt` is resent transparently after `delay`; `reason` is `not sent` (it never left the client) or `refused` (it never reached the server's application) |
//! | event | `hedge sent` | DEBUG | `attempt` | a hedge (a counted attempt while others may be in flight) was sent |
//! | event | `next hedge` | DEBUG | `delay` | a hedge failed with a non-fatal code: the next one goes after `delay` (zero, or the server's pushback) |
//! | event | `not retrying` | DEBUG | `attempt`, `reason` | no more attempts after a failure; `reason` is `pushback: stop`, `max attempts`, `not replayable` (the body was committed or could only be sent once), `not idempotent`, `vetoed by on_retry`, `deadline` (the next attempt could not start before it) or `transparent retries exhausted` |
//! | event | `pushback over the cap` | DEBUG | `delay` | the server asked for a `delay` longer than [`max_pushback`](crate::policy::PoliciesBuilder::max_pushback): taken as "do not retry" |
//! | event | `throttled` | DEBUG | `attempt` | the throttle refused `attempt`, a retry or a hedge: no more attempts |
//! | event | `hedge over budget` | DEBUG | `attempt` | the hedging policy's [`HedgeBudget`](crate::throttle::HedgeBudget) is spent: backup `attempt` is not sent, nor any later backup of the call (a non-fatal failure still sends its next hedge at once) |
//! | event | `committed` | DEBUG | `attempt`, `reason` | the call is committed to `attempt` (empty: to none still in flight) and no new attempt starts; `reason` is `success` or `fatal` (its answer is returned), `refused` (a second refusal the policy also saw as one), or `body` (the request body outgrew the replay buffer, failed, or could not be replayed; also when an answer came in after the body had committed to another attempt, whose answer then wins) |
//! | event | `per-attempt timeout` | DEBUG | `attempt` | `attempt` outlived its per-attempt timeout |
//! | event | `attempt let finish` | DEBUG | `attempt` | `attempt`, no longer needed (a hedge that lost, an attempt cut off or past the deadline), is let finish on a task of its own, its answer dropped, instead of having its HTTP/2 stream reset: the table's rate of resets is reached (see [`resets_per_second`](crate::policy::PoliciesBuilder::resets_per_second)); its span's outcome is `cancelled` (`timed out` for one its per-attempt timeout stopped) |
//! | event | `HTTP/2 reset guard closed the connection` | WARN | `guard`, `setting`, `advice` | an attempt failed because a rapid-reset guard of `h2` closed its connection, failing every call on it: `guard` is `too_many_internal_resets` (the client's own) or `too_many_resets` (the server's), `setting` the `h2` setting that holds its limit, `advice` what to change; at most once every 10 s per table, and every such attempt is counted ([`MethodSnapshot::reset_guard_failures`](crate::stats::MethodSnapshot::reset_guard_failures)) |
//! | event | `deadline exceeded` | DEBUG | `attempts` | the call's deadline passed after `attempts` sends: it fails |
//! | event | `request body outgrew the retry buffer; committed` | DEBUG | `reader`, `bytes_read`, `overflow` | the replay body (not necessarily in the call's span: any task may poll it) |
//! | event | `request body source failed` | DEBUG | `reader`, `error` | the replay body's source failed: the call is committed to the reader that saw it |
//! | event | `request body committed` | DEBUG | `reader` | the replay body was committed to `reader` |
//! | event | `request body has no such reader; not committed` | DEBUG | `reader` | [`ReplayBody::commit_to`](crate::body::ReplayBody::commit_to) was given an id it never gave out |
//! | event | `request body too large to record for replay` | DEBUG | `size_hint.lower`, `per_call`, `available` | the body's size hint is over the buffer limits: it is sent once, as it is |
//! | event | `balance: dropping an endpoint that failed` | DEBUG | `error` | (feature `balance`) a backend's service failed and left the balancer |
//! | event | `balance: backend ejected` | WARN | `backend`, `id`, `reason`, `failure_rate`, `ejection_time`, `times` | (feature `balance`) outlier detection took `backend` out of rotation for `ejection_time` (its `times`-th ejection); `reason` is `consecutive_failures`, `failure_percentage` or `success_rate` |
//! | event | `balance: backend back in rotation` | INFO | `backend`, `id`, `ejected_for`, `times` | (feature `balance`) an ejected backend's time is up: it is drawn again, at a reduced share until it answers well |
//! | event | `balance: outlier not ejected: the most backends that may be are` | DEBUG | `backend`, `id`, `reason`, `ejected`, `backends` | (feature `balance`) `backend` is an outlier (`reason` as for `backend ejected`: `consecutive_failures`, `failure_percentage`, `success_rate`), but `ejected` of `backends` are out already |
//! | event | `service config: unknown fields ignored` | WARN | `count`, `keys` | (outside any call) a service config was parsed with keys gRPC does not define: `keys` names the first ten with their paths and near misses; [`ServiceConfig::ignored`](crate::ServiceConfig::ignored) lists them |
//!
//! To see them, enable `DEBUG` for the crate, for example with tracing-subscriber's
//! `EnvFilter` and `RUST_LOG=tower_retry_hedge=debug`. An OpenTelemetry tracing bridge
//! (such as `tracing-opentelemetry`) turns the spans into OpenTelemetry spans as they are.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_retry_hedge::BoxError> {
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_retry_hedge::classify::HttpStatuses;
//! use tower_retry_hedge::policy::Route;
//! use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy};
//!
//! // Print the crate's events: `DEBUG retrying attempt=2 delay=… reason="backoff"` and so on.
//! let subscriber = tracing_subscriber::fmt()
//!     .with_env_filter("tower_retry_hedge=debug")
//!     .finish();
//! let _guard = tracing::subscriber::set_default(subscriber);
//!
//! let policy = RetryPolicy::builder().retryable(HttpStatuses::default()).build()?;
//! let policies = Policies::builder().route(Route::prefix("/"), policy).build();
//! let calls = std::sync::atomic::AtomicU32::new(0);
//! let server = service_fn(|_: http::Request<Full<Bytes>>| {
//!     let status = if calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 { 503 } else { 200 };
//!     async move { http::Response::builder().status(status).body(http_body_util::Empty::<Bytes>::new()) }
//! });
//! let request = http::Request::get("http://example.test/items").body(Full::new(Bytes::new()))?;
//! let response = RetryLayer::new(policies).layer(server).oneshot(request).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! # Metrics
//!
//! With the `opentelemetry` feature, a table built with a meter records, when each call ends
//! (or is dropped), the histograms of gRFC A96:
//!
//! | instrument | unit | value per call | bucket boundaries |
//! |---|---|---|---|
//! | `grpc.client.call.retries` | `{retry}` | counted attempts after the first that were not hedges | 1, 2, 3, 4, 5 |
//! | `grpc.client.call.transparent_retries` | `{transparent_retry}` | transparent retries | 1, 2, 3, 4, 5, 10 |
//! | `grpc.client.call.hedges` | `{hedge}` | hedges (counted attempts sent while others might be in flight) | 1, 2, 3, 4, 5 |
//! | `grpc.client.call.retry_delay` | `s` | time with no attempt in flight before a later attempt was sent | gRFC A66's latency buckets, 0 to 100 s |
//!
//! Each value carries gRFC A66's attributes, and A108's when asked for:
//!
//! - `grpc.method`: `package.Service/Method` (no leading `/`) for a gRPC call (content type
//!   `application/grpc`) whose path names a method; the route's [name](crate::policy::Route::name)
//!   for a request that took an HTTP route; `other` for anything else, so that raw HTTP paths
//!   never become labels (A66 records unregistered methods as `other` for the same reason);
//! - `grpc.target`: the target given to [`RetryMetrics::target`], else the request's authority
//!   (its URI's, else its `Host` header), else `other`. tonic's generated clients send
//!   path-only URIs unless built `with_origin`, so a tonic client should name its target;
//! - `grpc.client.call.custom` (gRFC A108), only with [`RetryMetrics::custom_label`]`(true)`:
//!   the value of the request's [`CustomLabel`] extension, or the empty string for a request
//!   without one. It goes on the crate's `tower_retry_hedge.hedges_over_budget` counter too,
//!   as A108 encourages for other per-call instruments.
//!
//! Why a call of one attempt records nothing, the bucket boundaries, and examples of a meter and
//! of the state: [the guide's section on telemetry](crate::guide#telemetry).

#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub use crate::metrics::{CustomLabel, RetryMetrics};

use tracing::Span;

use crate::classify::Outcome;
use crate::engine::{AttemptId, Dispatch};

/// A call's traces, fed by its driver with what the engine says, the same in every driver:
/// the call's span, a span per attempt (opened when the engine sends it, closed with the
/// outcome of its answer, its timeout or its cancellation), and an event per hedge.
///
/// The spans are kept only while the call's span is enabled: a call traced at no level
/// holds `None` and pays one word and a few branches. Held inline in each attempt's state
/// instead, they cost a call answered at once about 330 instructions (valgrind,
/// `RetryLayer` over an echo, 20 000 calls: 3 561 per call before the spans, 3 895 inline,
/// 3 637 this way, the metrics hooks included).
///
/// Attempts are named by their send number (1 for the first, then every send). The spans
/// left open when the call ends are cancelled.
pub(crate) struct CallTrace(Option<Box<Spans>>);

struct Spans {
    call: Span,
    open: Vec<(u32, Span)>,
}

impl CallTrace {
    /// The span of a call to `path`, named for what the call does (`hedge` for a hedging
    /// policy, else `retry`), with the fields the module's table lists for every driver.
    pub(crate) fn call_span(hedged: bool, path: &str) -> Span {
        match hedged {
            true => tracing::debug_span!(
                "hedge",
                path = %path,
                http.request.resend_count = tracing::field::Empty,
            ),
            false => tracing::debug_span!(
                "retry",
                path = %path,
                http.request.resend_count = tracing::field::Empty,
            ),
        }
    }

    /// The traces of a call whose first attempt is in flight, under the call's span.
    pub(crate) fn of_call(call: Span) -> CallTrace {
        if call.is_disabled() {
            return CallTrace(None);
        }
        let mut trace = CallTrace(Some(Box::new(Spans {
            call,
            open: Vec::new(),
        })));
        trace.sent(AttemptId::FIRST, None);
        trace
    }

    /// The call's span, when it is enabled.
    pub(crate) fn call(&self) -> Option<&Span> {
        self.0.as_ref().map(|spans| &spans.call)
    }

    /// The engine sent attempt `id` for `send` (`None` for the first attempt): opens its
    /// span, records the call's resends so far (OpenTelemetry's `http.request.resend_count`),
    /// and tells of a hedge.
    pub(crate) fn sent(&mut self, id: AttemptId, send: Option<Dispatch>) {
        let (transparent, hedge) = send.map_or((false, false), |s| (s.transparent, s.hedge));
        if hedge && !transparent {
            tracing::debug!(attempt = id.send, "hedge sent");
        }
        let Some(spans) = &mut self.0 else {
            return;
        };
        if id.send > 1 {
            spans.call.record("http.request.resend_count", id.send - 1);
        }
        let span = tracing::debug_span!(
            parent: &spans.call,
            "attempt",
            attempt = id.send,
            "previous-rpc-attempts" = id.number - 1,
            "transparent-retry" = transparent,
            hedge = hedge,
            outcome = tracing::field::Empty,
        );
        spans.open.push((id.send, span));
    }

    /// Enters the span of attempt `id`, while the attempt is polled.
    pub(crate) fn enter(&self, id: AttemptId) -> Option<tracing::span::Entered<'_>> {
        let spans = self.0.as_ref()?;
        let (_, span) = spans.open.iter().find(|(send, _)| *send == id.send)?;
        Some(span.enter())
    }

    /// Attempt `id` answered, as the policy's classifier saw it.
    pub(crate) fn answered(&mut self, id: AttemptId, outcome: &Outcome) {
        if let Some(spans) = &mut self.0 {
            let name = match outcome {
                Outcome::Success => "success",
                Outcome::Retryable(_) => "retryable",
                Outcome::Fatal(_) => "fatal",
                Outcome::NotSent => "not sent",
                Outcome::Refused => "refused",
            };
            spans.close(|send| send == id.send, name);
        }
    }

    /// The call committed to `kept` ([`Action::Cancel`](crate::engine::Action::Cancel)): every
    /// other attempt is dropped unanswered.
    pub(crate) fn cancelled(&mut self, kept: Option<AttemptId>) {
        if let Some(spans) = &mut self.0 {
            let cut_off = |send| kept.is_none_or(|kept: AttemptId| kept.send != send);
            spans.close(cut_off, "cancelled");
        }
    }

    /// Attempt `id` outlived its per-attempt timeout.
    pub(crate) fn timed_out(&mut self, id: AttemptId) {
        if let Some(spans) = &mut self.0 {
            spans.close(|send| send == id.send, "timed out");
        }
    }
}

impl Spans {
    /// Records `outcome` on the spans of the attempts `which` picks, and closes them.
    fn close(&mut self, which: impl Fn(u32) -> bool, outcome: &'static str) {
        self.open.retain(|(send, span)| {
            if which(*send) {
                span.record("outcome", outcome);
                return false;
            }
            true
        });
    }
}

/// The spans left open when the call ends are cancelled.
impl Drop for Spans {
    fn drop(&mut self) {
        self.close(|_| true, "cancelled");
    }
}
