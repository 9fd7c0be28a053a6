//! What one call keeps to make its attempts: shared by the retry and hedge engines.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request};
use tokio::time::Instant;

use crate::body::{BufferLimits, Copies, Replay};
use crate::grpc_timeout;
use crate::metadata::{AttemptInfo, Attempts, GRPC_PREVIOUS_RPC_ATTEMPTS_NAME, TriedBackends};
use crate::policy::Policies;

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

/// The call's own timeout: the request's `grpc-timeout` when it is a gRPC call. Also tells
/// whether it is one.
///
/// A request with a few headers is read in one pass: comparing a few names costs less than
/// hashing two, `grpc-timeout` above all, which is not a standard header. More headers are
/// looked up. Either way, the first value of each header counts, as `HeaderMap::get` reads.
fn grpc_timeout_of(headers: &http::HeaderMap) -> (bool, Option<Duration>) {
    const FEW: usize = 8;
    if headers.len() > FEW {
        // A request that is not gRPC (an HTTP route) pays no second lookup.
        let grpc = is_grpc_content_type(headers.get(CONTENT_TYPE));
        return (
            grpc,
            grpc.then(|| grpc_timeout::from_headers(headers)).flatten(),
        );
    }
    let (mut content_type, mut timeout) = (None, None);
    for (name, value) in headers {
        if *name == CONTENT_TYPE {
            content_type.get_or_insert(value);
        } else if name.as_str() == grpc_timeout::GRPC_TIMEOUT {
            timeout.get_or_insert(value);
        }
    }
    let grpc = is_grpc_content_type(content_type);
    (grpc, timeout.filter(|_| grpc).and_then(grpc_timeout::parse))
}

/// What the calls of one layer share: a spare clone of the inner service and the policy
/// table, behind one reference count per call.
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
    pub(crate) fn get_or_make<'a>(
        slot: &'a mut Option<Arc<Shared<S>>>,
        inner: &S,
        policies: &Policies,
    ) -> &'a Arc<Shared<S>> {
        slot.get_or_insert_with(|| {
            Arc::new(Shared {
                spare: Mutex::new(inner.clone()),
                policies: policies.clone(),
            })
        })
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

/// The parts of the request, its body copies and its deadline.
pub(crate) struct Call<B: Replay> {
    head: Head,
    body: Body<B>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) grpc: bool,
    /// Attempts sent so far, of every kind.
    pub(crate) sent: u32,
    /// Whether the deadline came from the request's own `grpc-timeout`.
    header_timeout: bool,
    /// With backend tracking, the attempts share the list of backends used.
    tried: Option<TriedBackends>,
}

impl<B: Replay> Call<B> {
    /// Takes a request apart and builds its first attempt. The deadline is the request's
    /// `grpc-timeout` for gRPC calls, else the policy's timeout, else none.
    #[inline]
    pub(crate) fn start(
        request: Request<B>,
        limits: &BufferLimits,
        timeout: Option<Duration>,
        track_backends: bool,
    ) -> (Self, Request<B>, u64) {
        let (mut parts, body) = request.into_parts();
        let mut call = Call::new(&parts, timeout, track_backends);
        let (first, reader) = call.first_attempt(&mut parts, body, limits);
        (call, Request::from_parts(parts, first), reader)
    }

    /// A call for a request with these parts, whose body is not prepared yet (see
    /// [`first_attempt`](Self::first_attempt)). The deadline is the request's `grpc-timeout`
    /// for gRPC calls, else the policy's timeout, else none.
    ///
    /// Inline, with `first_attempt` apart: a caller that keeps the call in a box makes it
    /// there and prepares the body in place, rather than moving a few hundred bytes through
    /// each step.
    #[inline(always)]
    pub(crate) fn new(
        parts: &http::request::Parts,
        timeout: Option<Duration>,
        track_backends: bool,
    ) -> Self {
        let (grpc, header_timeout) = grpc_timeout_of(&parts.headers);
        let timeout = header_timeout.or(timeout);
        // A timeout too large to add to now is no deadline at all.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        Call {
            head: Head::of(parts),
            body: Body::Spent,
            deadline,
            grpc,
            header_timeout: header_timeout.is_some(),
            sent: 0,
            tried: track_backends.then(TriedBackends::default),
        }
    }

    /// Prepares the body for every attempt and marks the first attempt's parts; gives the
    /// first attempt's body and the id of its reader. A body that cannot be replayed is
    /// given back as it is, to be sent once. The first attempt sends the request's own
    /// parts; the later ones, copies.
    #[inline(always)]
    pub(crate) fn first_attempt(
        &mut self,
        parts: &mut http::request::Parts,
        body: B,
        limits: &BufferLimits,
    ) -> (B, u64) {
        let (first, reader) = match body.prepare(limits) {
            Ok(copies) => {
                let first = copies.first();
                self.body = Body::Copies(copies);
                first
            }
            Err(original) => (original, 0),
        };
        self.mark_headers(&mut parts.headers);
        self.sent += 1;
        self.mark_extensions(&mut parts.extensions, false);
        (first, reader)
    }

    /// The request path, for statistics and tracing.
    pub(crate) fn path(&self) -> &str {
        self.head.uri.path()
    }

    pub(crate) fn method(&self) -> &http::Method {
        &self.head.method
    }

    /// Whether the request carries an `Idempotency-Key` header.
    pub(crate) fn has_idempotency_key(&self) -> bool {
        self.head.headers.contains_key("idempotency-key")
    }

    /// Whether another attempt may start: the body can still be replayed.
    pub(crate) fn can_replay(&self) -> bool {
        match &self.body {
            Body::Copies(copies) => !copies.is_committed(),
            Body::Spent => false,
        }
    }

    /// After commit, the reader id of the attempt that goes on.
    pub(crate) fn committed_reader(&self) -> Option<u64> {
        match &self.body {
            Body::Copies(copies) => copies.committed_reader(),
            _ => None,
        }
    }

    /// The request for the next attempt and the id of its body's reader, or `None` when no
    /// new attempt may start (the body outgrew the buffer, or could only be sent once).
    pub(crate) fn next_request(&mut self, hedge: bool) -> Option<(Request<B>, u64)> {
        let (body, reader) = match &self.body {
            Body::Copies(copies) => copies.copy()?,
            Body::Spent => return None,
        };
        Some((self.attempt(body, hedge), reader))
    }

    /// An attempt's request: the call's parts, with A6's metadata.
    fn attempt(&mut self, body: B, hedge: bool) -> Request<B> {
        let mut request = self.head.request(body);
        self.mark_headers(request.headers_mut());
        self.sent += 1;
        self.mark_extensions(request.extensions_mut(), hedge);
        request
    }

    /// Adds A6's headers to the next attempt (before it is counted in `sent`).
    fn mark_headers(&self, headers: &mut http::HeaderMap) {
        if self.grpc {
            if self.sent > 0 {
                headers.insert(
                    GRPC_PREVIOUS_RPC_ATTEMPTS_NAME,
                    HeaderValue::from(self.sent),
                );
            }
            // The first attempt keeps the caller's own `grpc-timeout`: re-encoding the same
            // value would only cost an allocation.
            let keep = self.sent == 0 && self.header_timeout;
            // The clock is read only when there is a deadline to measure against.
            if !keep && let Some(deadline) = self.deadline {
                let remaining = deadline.saturating_duration_since(Instant::now());
                headers.insert(
                    grpc_timeout::GRPC_TIMEOUT_NAME,
                    grpc_timeout::encode(remaining),
                );
            }
        }
    }

    /// Adds the attempt's extensions (after it is counted in `sent`).
    fn mark_extensions(&self, extensions: &mut http::Extensions, hedge: bool) {
        // The first attempt carries no extension: inserting one allocates, and the success
        // path should not pay for what only later attempts need.
        if self.sent > 1 {
            extensions.insert(AttemptInfo {
                number: self.sent,
                hedge,
            });
        }
        if let Some(tried) = &self.tried {
            extensions.insert(tried.clone());
        }
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

/// Marks a response of a call that made more than one attempt: an [`Attempts`] extension,
/// and for gRPC, `grpc-previous-rpc-attempts`. Like that header (A6: "it will not be present
/// on the first RPC"), the extension is absent after a single attempt, so that the success
/// path allocates nothing for it; [`Attempts::of`] reads either case.
pub(crate) fn annotate<RB>(
    mut response: http::Response<RB>,
    sent: u32,
    transparent: u32,
    grpc: bool,
) -> http::Response<RB> {
    if sent > 1 {
        if grpc {
            response
                .headers_mut()
                .insert(GRPC_PREVIOUS_RPC_ATTEMPTS_NAME, HeaderValue::from(sent - 1));
        }
        response
            .extensions_mut()
            .insert(Attempts::new(sent, transparent));
    }
    response
}

/// The error for a call that must end with no attempt result left to return. The engines
/// keep the last failure whenever no attempt is in flight, so this is never expected; it
/// stands in for a panic.
pub(crate) fn no_result() -> crate::BoxError {
    "no attempt result left to return (request body could not be replayed)".into()
}

/// Makes a timer for `deadline` if there is none yet, and tells whether it has fired (never,
/// without a deadline).
///
/// The engines make their timers (the call's deadline, the next hedge) only once the call
/// has to wait: an answer on the first poll needs no timer, and registering one costs more
/// than the rest of the success path.
pub(crate) fn deadline_fired(
    mut timer: std::pin::Pin<&mut Option<tokio::time::Sleep>>,
    deadline: Option<Instant>,
    cx: &mut std::task::Context<'_>,
) -> bool {
    if timer.is_none() {
        match deadline {
            Some(deadline) => timer.set(Some(tokio::time::sleep_until(deadline))),
            None => return false,
        }
    }
    timer
        .as_pin_mut()
        .is_some_and(|timer| std::future::Future::poll(timer, cx).is_ready())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use http::header::{HeaderName, USER_AGENT};

    fn headers(pairs: &[(&'static str, &'static str)], filler: usize) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        for i in 0..filler {
            headers.append(USER_AGENT, HeaderValue::from(i));
        }
        headers
    }

    /// Request headers, and what `grpc_timeout_of` reads from them.
    type Case = (
        &'static [(&'static str, &'static str)],
        (bool, Option<Duration>),
    );

    #[test]
    fn the_one_pass_reads_what_the_lookups_read() {
        let cases: [Case; 7] = [
            (&[], (false, None)),
            (&[("content-type", "application/grpc")], (true, None)),
            (
                &[
                    ("grpc-timeout", "1S"),
                    ("content-type", "application/grpc+proto"),
                ],
                (true, Some(Duration::from_secs(1))),
            ),
            // Not gRPC: its `grpc-timeout` is not the call's.
            (
                &[("content-type", "application/json"), ("grpc-timeout", "1S")],
                (false, None),
            ),
            (
                &[
                    ("content-type", "application/grpcx"),
                    ("grpc-timeout", "1S"),
                ],
                (false, None),
            ),
            // The first value counts, as `HeaderMap::get` reads.
            (
                &[
                    ("content-type", "application/grpc"),
                    ("grpc-timeout", "2m"),
                    ("grpc-timeout", "1S"),
                ],
                (true, Some(Duration::from_millis(2))),
            ),
            (
                &[
                    ("content-type", "application/grpc"),
                    ("grpc-timeout", "bad"),
                ],
                (true, None),
            ),
        ];
        for (pairs, expected) in cases {
            // A few headers are read in one pass; more (with filler) are looked up.
            for filler in [0, 10] {
                let headers = headers(pairs, filler);
                assert_eq!(grpc_timeout_of(&headers), expected, "{pairs:?} +{filler}");
            }
        }
    }
}
