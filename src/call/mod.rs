//! One call through a layer: what it keeps to make its attempts, and the future that drives
//! the [engine](crate::engine) for both layers.

mod driver;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request};
use tokio::time::Instant;

pub(crate) use self::driver::CallFuture;
use crate::body::{BufferLimits, Copies, Replay};
use crate::engine::{Engine, Mode, Rules, Send};
use crate::grpc_timeout;
use crate::metadata::{AttemptInfo, Deadline, GRPC_PREVIOUS_RPC_ATTEMPTS_NAME, TriedBackends};
use crate::policy::Policies;
use crate::policy::ThrottleHandle;
use tower_service::Service;

/// Whether a request is a gRPC call: its content type is `application/grpc` or
/// `application/grpc+<codec>`.
pub(crate) fn is_grpc<B>(request: &Request<B>) -> bool {
    is_grpc_content_type(request.headers().get(CONTENT_TYPE))
}

fn is_grpc_content_type(value: Option<&HeaderValue>) -> bool {
    value.is_some_and(|v| {
        let v = v.as_bytes();
        v.starts_with(b"application/grpc") && matches!(v.get(16), None | Some(b'+') | Some(b';'))
    })
}

/// The call's deadline: the earliest of the request's `grpc-timeout` (for a `grpc` call),
/// the method's `timeout` and a [`Deadline`] extension; `None` when none is set. Also tells
/// whether the request's own `grpc-timeout` is that deadline. The clock is read only when a
/// timeout is set.
pub(crate) fn deadline_of<B>(
    request: &Request<B>,
    grpc: bool,
    timeout: Option<Duration>,
) -> (Option<Instant>, bool) {
    let header = if grpc {
        grpc_timeout::from_headers(request.headers())
    } else {
        None
    };
    let (timeout, from_header) = match (header, timeout) {
        (Some(a), Some(b)) => (Some(a.min(b)), a <= b),
        (Some(a), None) => (Some(a), true),
        (None, b) => (b, false),
    };
    // A timeout too large to add to now is no deadline at all.
    let from_timeout = timeout.and_then(|t| Instant::now().checked_add(t));
    let extension = request.extensions().get::<Deadline>().map(|d| d.at());
    match (from_timeout, extension) {
        (Some(a), Some(b)) if b < a => (Some(b), false),
        (Some(a), _) => (Some(a), from_header),
        (None, b) => (b, false),
    }
}

/// What a layer found for a call in its table.
pub(crate) struct Plan {
    pub(crate) mode: Mode,
    /// The method's `timeout`.
    pub(crate) timeout: Option<Duration>,
    /// The route whose name the statistics are kept under (else the request path).
    pub(crate) route: Option<Arc<str>>,
    pub(crate) throttle: Option<ThrottleHandle>,
}

/// Starts a call that the engine runs as `plan` says: sends its first attempt on `inner`
/// (the service that was polled ready) and gives the future that drives the rest.
pub(crate) fn start<S, B>(
    inner: &mut S,
    shared: Arc<Shared<S>>,
    request: Request<B>,
    plan: Plan,
    span: tracing::Span,
) -> CallFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    let Plan {
        mode,
        timeout,
        route,
        throttle,
    } = plan;
    let policies = &shared.policies;
    let grpc = is_grpc(&request);
    let (deadline, from_header) = deadline_of(&request, grpc, timeout);
    let mut request = request;
    if grpc
        && !from_header
        && let Some(deadline) = deadline
    {
        // The first attempt tells the server the call's deadline too. A request whose own
        // `grpc-timeout` is the deadline keeps it: re-encoding it would only allocate.
        let remaining = deadline.saturating_duration_since(Instant::now());
        request.headers_mut().insert(
            grpc_timeout::GRPC_TIMEOUT_NAME,
            grpc_timeout::encode(remaining),
        );
    }
    let track_backends = policies.track_backends()
        || matches!(&mode, Mode::Hedge(policy, _) if policy.track_backends);
    let (max_attempts, may_repeat) = match &mode {
        Mode::Retry(policy) => (
            policy.max_attempts,
            policy.retry_non_idempotent
                || (policy.retry_with_idempotency_key
                    && request.headers().contains_key("idempotency-key")),
        ),
        Mode::Hedge(policy, _) => (policy.max_attempts, policy.non_idempotent),
        Mode::Single => (1, false),
    };
    let may_repeat = may_repeat || grpc || request.method().is_idempotent();
    let rules = Rules {
        mode,
        max_attempts: max_attempts.min(policies.max_attempts_cap()),
        may_repeat,
        grpc,
        max_pushback: policies.max_pushback(),
        throttle,
    };
    let (call, first, reader) =
        Call::start(request, policies.buffer_limits(), grpc, track_backends);
    let future = inner.call(first);
    let engine = Engine::new(rules, deadline.map(Instant::into_std));
    let stats = driver::StatsHandle::new(route);
    CallFuture::driven(driver::Driver::new(
        future, reader, shared, call, engine, stats, span,
    ))
}

/// What the calls of one layer share: a spare clone of the inner service and the policy
/// table.
///
/// The spare is made at the layer's first call. A call that needs a service of its own (to
/// retry, or to send a hedge) clones the spare then; a call answered by its first attempt
/// clones nothing. A clone per call would cost real services something: a tonic `Channel`
/// clone allocates again for its first `poll_ready`.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    spare: Mutex<S>,
    pub(crate) policies: Policies,
}

impl<S: Clone> Shared<S> {
    /// The layer's shared state, made from its service and table at its first call.
    pub(crate) fn get_or_make(
        slot: &mut Option<Arc<Shared<S>>>,
        inner: &S,
        policies: &Policies,
    ) -> Arc<Shared<S>> {
        let shared = slot.get_or_insert_with(|| {
            Arc::new(Shared {
                spare: Mutex::new(inner.clone()),
                policies: policies.clone(),
            })
        });
        Arc::clone(shared)
    }

    /// A clone of the spare service, for a call's later attempts.
    pub(crate) fn service(&self) -> S {
        // A panic while the lock was held cannot leave a service half cloned.
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        S::clone(&spare)
    }
}

enum Body<B: Replay> {
    /// Copies for every attempt.
    Copies(B::Copies),
    /// The body could not be replayed and went with the first attempt.
    Spent,
}

/// The parts of the request and its body copies: what every attempt after the first is made
/// from.
pub(crate) struct Call<B: Replay> {
    head: Head,
    body: Body<B>,
    /// A gRPC call: its attempts carry A6's headers.
    grpc: bool,
}

impl<B: Replay> Call<B> {
    /// Takes a request apart: keeps a copy of its parts and prepares its body for every
    /// attempt. Gives the first attempt's request (the request's own parts) and its body's
    /// reader. A body that cannot be replayed is sent once, as it is.
    pub(crate) fn start(
        request: Request<B>,
        limits: &BufferLimits,
        grpc: bool,
        track_backends: bool,
    ) -> (Self, Request<B>, u64) {
        let (mut parts, body) = request.into_parts();
        let (body, first, reader) = match body.prepare(limits) {
            Ok(copies) => {
                let (first, reader) = copies.first();
                (Body::Copies(copies), first, reader)
            }
            Err(original) => (Body::Spent, original, 0),
        };
        // A record the request brings is kept; the copies of the parts share it.
        if track_backends && parts.extensions.get::<TriedBackends>().is_none() {
            parts.extensions.insert(TriedBackends::default());
        }
        let call = Call {
            head: Head::of(&parts),
            body,
            grpc,
        };
        (call, Request::from_parts(parts, first), reader)
    }

    /// The request path, for statistics and tracing.
    pub(crate) fn path(&self) -> &str {
        self.head.uri.path()
    }

    /// Whether the call is a gRPC call.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The request's authority: its URI's, else its `Host` header.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn authority(&self) -> Option<&str> {
        match self.head.uri.authority() {
            Some(authority) => Some(authority.as_str()),
            None => self
                .head
                .headers
                .get(http::header::HOST)
                .and_then(|host| host.to_str().ok()),
        }
    }

    /// After commit, the reader id of the attempt that goes on.
    pub(crate) fn committed_reader(&self) -> Option<u64> {
        match &self.body {
            Body::Copies(copies) => copies.committed_reader(),
            Body::Spent => None,
        }
    }

    /// The reader the body committed itself to, once it has; else registers the call to be
    /// woken when it does, from whatever task polls the body.
    pub(crate) fn poll_committed(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<u64> {
        match &self.body {
            Body::Copies(copies) => copies.poll_committed(cx),
            Body::Spent => std::task::Poll::Pending,
        }
    }

    /// Commits the body to the attempt whose response the call returns: nothing is recorded
    /// any more, and what was gives its bytes back to the budget at once, while that attempt
    /// may go on streaming.
    pub(crate) fn commit(&self, reader: u64) {
        if let Body::Copies(copies) = &self.body {
            copies.commit(reader);
        }
    }

    /// The request for `send`, the call's attempt number `sent + 1`, and the id of its
    /// body's reader; `None` when no new attempt may start (the body outgrew the buffer, or
    /// could only be sent once).
    pub(crate) fn request(
        &mut self,
        send: Send,
        sent: u32,
        deadline: Option<std::time::Instant>,
        now: std::time::Instant,
    ) -> Option<(Request<B>, u64)> {
        let (body, reader) = match &self.body {
            Body::Copies(copies) => copies.copy()?,
            Body::Spent => return None,
        };
        let mut request = self.head.request(body);
        let headers = request.headers_mut();
        if self.grpc {
            // A6: the attempts before this one, transparent retries excluded.
            if send.number > 1 {
                headers.insert(
                    GRPC_PREVIOUS_RPC_ATTEMPTS_NAME,
                    HeaderValue::from(send.number - 1),
                );
            }
            // Each attempt carries what is left of the call's time.
            if let Some(deadline) = deadline {
                let remaining = deadline.saturating_duration_since(now);
                headers.insert(
                    grpc_timeout::GRPC_TIMEOUT_NAME,
                    grpc_timeout::encode(remaining),
                );
            }
        }
        let extensions = request.extensions_mut();
        extensions.insert(AttemptInfo {
            number: sent + 1,
            hedge: send.hedge,
        });
        Some((request, reader))
    }
}

/// A copy of a request's parts (everything but its body), for the attempts after the first.
///
/// Not `http::request::Parts`, which can only be made with default fields: replacing them
/// would drop a default URI and header map on every call, for nothing.
struct Head {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    extensions: http::Extensions,
}

impl Head {
    fn of(parts: &http::request::Parts) -> Head {
        Head {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            extensions: parts.extensions.clone(),
        }
    }

    /// A request with a copy of these parts and `body`.
    fn request<B>(&self, body: B) -> Request<B> {
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.clone();
        *request.extensions_mut() = self.extensions.clone();
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(pairs: &[(&'static str, &'static str)]) -> Request<()> {
        let mut request = Request::new(());
        for (name, value) in pairs {
            request.headers_mut().append(
                http::header::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        request
    }

    fn deadline(request: &Request<()>, timeout: Option<Duration>) -> (Option<Instant>, bool) {
        deadline_of(request, is_grpc(request), timeout)
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_the_earliest_of_header_timeout_and_extension() {
        let grpc = [("content-type", "application/grpc"), ("grpc-timeout", "2S")];
        let now = Instant::now();
        let secs = Duration::from_secs;
        assert_eq!(deadline(&parts(&grpc), None), (Some(now + secs(2)), true));
        assert_eq!(
            deadline(&parts(&grpc), Some(secs(1))),
            (Some(now + secs(1)), false)
        );
        assert_eq!(
            deadline(&parts(&grpc), Some(secs(3))),
            (Some(now + secs(2)), true)
        );
        // Not gRPC: its `grpc-timeout` is not the call's.
        let http = [("content-type", "application/json"), ("grpc-timeout", "1S")];
        assert_eq!(deadline(&parts(&http), None), (None, false));
        assert_eq!(
            deadline(&parts(&http), Some(secs(5))),
            (Some(now + secs(5)), false)
        );
        let mut with_extension = parts(&grpc);
        with_extension
            .extensions_mut()
            .insert(Deadline::at_instant(now + Duration::from_millis(500)));
        assert_eq!(
            deadline(&with_extension, Some(secs(1))),
            (Some(now + Duration::from_millis(500)), false)
        );
        assert_eq!(deadline(&parts(&[]), None), (None, false));
    }
}
