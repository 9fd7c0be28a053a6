//! One call through the layer: whether it is driven, what it keeps to make its attempts, and
//! the future that drives the [engine](crate::engine) for it.

mod driver;
mod future;
mod handles;
mod marks;

use std::sync::{Arc, Mutex};

use http::Request;
use http::header::CONTENT_TYPE;
use tokio::time::Instant;
use tower_service::Service;

use self::driver::LayerIo;
pub use self::future::ResponseFuture;
pub(crate) use self::handles::Handles;
use crate::body::{Copies, Replay};
use crate::drive::Drive;
use crate::engine::{
    self, AttemptId, BodyKind, CallFacts, CommitBody, Engine, Entrance, Mode, Start,
};
use crate::grpc_timeout;
use crate::metadata::{AttemptInfo, Deadline, GRPC_PREVIOUS_RPC_ATTEMPTS_NAME, TriedBackends};
use crate::policy::{MethodPolicy, Policies, ThrottleHandle};
use crate::telemetry::CallTrace;

/// Whether a request is a gRPC call: its content type is `application/grpc` or
/// `application/grpc+<codec>`.
pub(crate) fn is_grpc<B>(request: &Request<B>) -> bool {
    crate::classify::is_grpc_content_type(request.headers().get(CONTENT_TYPE))
}

/// The mark of a call that a layer of this crate drives, on every attempt after the first: a
/// layer below passes such a request through, so a stack of both layers drives each call once.
/// The first attempt is known by [`sending`] instead: marking it would cost a request without
/// extensions the map `http::Extensions` allocates, two allocations on every call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Driven;

thread_local! {
    /// Set while a driving layer hands an attempt to the service below it.
    static SENDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Calls `send` (a driving layer's call of the service below it) so that a layer of this
/// crate met on the way, in the same `call`, passes the request through.
///
/// A layer below one that moves the call to another task (a `tower::buffer::Buffer`) does
/// not see this for the first attempt, and drives it too; later attempts carry [`Driven`].
/// A service below that, inside its own `call`, calls another client through a layer of
/// this crate would see that call passed through: services do their IO in their futures.
pub(crate) fn sending<R>(send: impl FnOnce() -> R) -> R {
    /// Puts the flag back as it was, even if `send` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SENDING.set(self.0);
        }
    }
    let _restore = Restore(SENDING.replace(true));
    send()
}

/// A layer's `call`: drives the call as the engine's entry ([`enter`](crate::engine::enter))
/// says, or passes it through. `handles` are the service clone's own (see [`Handles`]).
pub(crate) fn call<S, B>(
    inner: &mut S,
    handles: &mut Handles<S>,
    policies: &Policies,
    request: Request<B>,
) -> ResponseFuture<S, B>
where
    S: Service<Request<B>> + Clone,
    B: Replay,
{
    if SENDING.get() || request.extensions().get::<Driven>().is_some() {
        // A layer above drives the call: nothing to look up.
        return ResponseFuture::passthrough(inner.call(request));
    }
    let read = || Instant::now().into_std();
    let (method, path) = (request.method(), request.uri().path());
    let mut entrance = LayerEntrance {
        handles,
        policies,
        request: &request,
    };
    let Some(start) = engine::enter(policies, method, path, &mut entrance, &read) else {
        return ResponseFuture::passthrough(inner.call(request));
    };
    // Named for what the call does, whichever layer drives it.
    let hedged = matches!(start.rules.mode, Mode::Hedge(..));
    let span = CallTrace::call_span(hedged, request.uri().path());
    // The ready service takes the first attempt and stays in the layer, warm for the next
    // call; the call holds the shared spare and clones it only to send another attempt.
    let shared = LayerShared::get_or_make(&mut handles.shared, inner, policies);
    drive(inner, shared, request, start, span)
}

/// What a layer tells the engine of a call as it enters.
struct LayerEntrance<'a, S, B> {
    handles: &'a mut Handles<S>,
    policies: &'a Policies,
    request: &'a Request<B>,
}

impl<S, B> Entrance for LayerEntrance<'_, S, B> {
    fn facts(&self) -> CallFacts<'_> {
        let request = self.request;
        CallFacts {
            method: request.method(),
            grpc: is_grpc(request),
            headers: request.headers(),
            deadline: request
                .extensions()
                .get::<Deadline>()
                .map(|deadline| deadline.at().into_std()),
        }
    }

    fn lookup(
        &mut self,
        policies: &Policies,
        method: &http::Method,
        path: &str,
    ) -> Option<(MethodPolicy, Option<usize>)> {
        self.handles.lookup(policies, method, path)
    }

    fn throttle(&mut self) -> Option<ThrottleHandle> {
        self.handles.throttle(self.policies, self.request)
    }
}

/// Starts a call as `start` says: sends its first attempt on `inner` (the service that was
/// polled ready) and gives the future that drives the rest.
fn drive<S, B>(
    inner: &mut S,
    shared: Arc<LayerShared<S>>,
    mut request: Request<B>,
    start: Start,
    span: tracing::Span,
) -> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    if let Some(timeout) = start.first_timeout(|| Instant::now().into_std()) {
        // The first attempt tells the server the call's deadline too.
        request
            .headers_mut()
            .insert(grpc_timeout::GRPC_TIMEOUT_NAME, timeout);
    }
    let (mut parts, body) = request.into_parts();
    // The record of backends tried that every attempt shares: one the request brings, else a
    // new one. The copy of the parts holds it beside their extensions, which are copied
    // without it: a new record in the copy would cost a second map and a box on every call.
    // `true` with a record the request does not carry yet.
    let tried = start
        .track_backends
        .then(|| match parts.extensions.get::<TriedBackends>() {
            Some(brought) => (brought.clone(), false),
            None => (TriedBackends::default(), true),
        });
    let (body, first_body, reader) = match body.prepare(shared.policies.buffer_limits()) {
        Ok(copies) => {
            let (first, reader) = copies.first();
            (Body::Copies(copies), first, reader)
        }
        // A body that cannot be replayed is sent once, as it is.
        Err(original) => (Body::Spent, original, 0),
    };
    // Boxed only where it may have to be let finish.
    let paced = shared.policies.stream_resets().per_second().is_some();
    let boxed = paced && start.may_stop_first();
    let grpc = start.rules.grpc;
    // A table holds far fewer than 2³² routes.
    let route = start.route.map(|route| route as u32);
    let deadline = start.deadline.map(Instant::from_std);
    let body_kind = body_kind(&body);
    // Each part is made where the call keeps it, so that none is copied on its way there.
    let state = Drive::state(
        || {
            Engine::new(
                start.rules,
                start.deadline,
                body_kind,
                reader,
                start.first_sent_at,
            )
        },
        span,
        || LayerIo {
            shared,
            call: Call {
                head: RequestHead::of(&parts),
                body,
                tried: tried.as_ref().map(|(tried, _)| tried.clone()),
            },
            grpc,
            deadline,
            route,
        },
    );
    if let Some((tried, true)) = tried {
        parts.extensions.insert(tried);
    }
    let first = sending(|| inner.call(Request::from_parts(parts, first_body)));
    ResponseFuture::driven(Drive::new(first, boxed, state))
}

/// What the calls of one layer share: a spare clone of the inner service and the policy
/// table.
///
/// The spare is made at the layer's first call. A call that needs a service of its own (to
/// retry, or to send a hedge) clones the spare then; a call answered by its first attempt
/// clones nothing. A clone per call would cost real services something: a tonic `Channel`
/// clone allocates again for its first `poll_ready`.
// Alone on its cache lines (see `handles`): every call writes its reference count.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct LayerShared<S> {
    spare: Mutex<S>,
    pub(crate) policies: Policies,
}

impl<S: Clone> LayerShared<S> {
    /// The layer's shared state, made from its service and table at its first call.
    pub(crate) fn get_or_make(
        slot: &mut Option<Arc<LayerShared<S>>>,
        inner: &S,
        policies: &Policies,
    ) -> Arc<LayerShared<S>> {
        let shared = slot.get_or_insert_with(|| {
            Arc::new(LayerShared {
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
    head: RequestHead,
    body: Body<B>,
    /// The call's record of backends tried, which every attempt's extensions carry.
    tried: Option<TriedBackends>,
}

/// How a call's body can be sent again.
fn body_kind<B: Replay>(body: &Body<B>) -> BodyKind {
    match body {
        Body::Copies(copies) if copies.records() => BodyKind::Recorded,
        Body::Copies(_) => BodyKind::Clones,
        Body::Spent => BodyKind::Once,
    }
}

impl<B: Replay> Call<B> {
    /// The request path, for statistics and tracing.
    pub(crate) fn path(&self) -> &str {
        self.head.uri.path()
    }

    /// The request's authority, for the A96 metrics: its URI's, else its `Host` header.
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

    /// The extensions every attempt's request is made from (gRFC A108's custom label is read
    /// from them).
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn extensions(&self) -> &http::Extensions {
        &self.head.extensions
    }

    /// Whether an attempt the call no longer needs can still send its whole request: if not,
    /// its body fails and its transport resets its stream, whatever the call does with it.
    pub(crate) fn every_attempt_may_finish(&self) -> bool {
        match &self.body {
            Body::Copies(copies) => copies.every_copy_may_finish(),
            // Sent once, with the one attempt there is.
            Body::Spent => true,
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

    /// A copy of the body for a new attempt, and the id of its reader; `None` when no new
    /// attempt may start (the body outgrew the buffer, or could only be sent once).
    pub(crate) fn copy_body(&mut self) -> Option<(B, u64)> {
        match &self.body {
            Body::Copies(copies) => copies.copy(),
            Body::Spent => None,
        }
    }

    /// The request of attempt `id` (a hedge when `hedge`), with `body` and the headers the
    /// engine gave it.
    pub(crate) fn request(
        &self,
        body: B,
        id: AttemptId,
        hedge: bool,
        attempt_headers: engine::AttemptHeaders,
    ) -> Request<B> {
        let mut request = self.head.request(body);
        if let Some(tried) = &self.tried {
            request.extensions_mut().insert(tried.clone());
        }
        let headers = request.headers_mut();
        if let Some(previous) = attempt_headers.previous {
            headers.insert(GRPC_PREVIOUS_RPC_ATTEMPTS_NAME, previous);
        }
        if let Some(timeout) = attempt_headers.timeout {
            headers.insert(grpc_timeout::GRPC_TIMEOUT_NAME, timeout);
        }
        let extensions = request.extensions_mut();
        extensions.insert(AttemptInfo {
            number: id.send,
            hedge,
        });
        extensions.insert(Driven);
        request
    }
}

/// The engine claims the body for the attempt whose answer ends the call: nothing is
/// recorded any more, and what was gives its bytes back to the budget at once, while that
/// attempt may go on streaming.
impl<B: Replay> CommitBody for Call<B> {
    fn commit(&self, reader: u64) -> u64 {
        match &self.body {
            Body::Copies(copies) if !copies.commit(reader) => {
                copies.committed_reader().unwrap_or(reader)
            }
            _ => reader,
        }
    }
}

/// A copy of a request's parts (everything but its body), for the attempts after the first.
///
/// Not `http::request::Parts`, which can only be made with default fields: replacing them
/// would drop a default URI and header map on every call, for nothing.
struct RequestHead {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    extensions: http::Extensions,
}

impl RequestHead {
    fn of(parts: &http::request::Parts) -> RequestHead {
        RequestHead {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            // An empty map is made rather than cloned: cloning goes through its table and
            // both its lists, about 90 instructions per call of a request without headers
            // (`benches/support/instructions.sh`, `no_headers`).
            headers: match parts.headers.is_empty() {
                true => http::HeaderMap::new(),
                false => parts.headers.clone(),
            },
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
