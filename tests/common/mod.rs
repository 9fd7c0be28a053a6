//! Real network peers for the integration tests: a scriptable gRPC server
//! ([`spawn_grpc`], `grpc.rs`), a scriptable HTTP/1.1 + HTTP/2 server
//! ([`spawn_http`], `http.rs`), client helpers, and the [`Recorder`] both
//! servers write what they saw into. Everything is re-exported here, so
//! `use common::*;` is safe (it brings no `http` module to shadow the crate).
//!
//! Include it from a test crate (`tests/<dir>/main.rs`) with
//!
//! ```ignore
//! #[path = "../common/mod.rs"]
//! mod common;
//! ```
//!
//! Every peer binds `127.0.0.1:0`, runs on the test's own tokio runtime, and
//! is stopped with `peer.shutdown().await`, which waits for the server task
//! and its connections to finish. Scripted delays use `tokio::time`, so they
//! follow a paused clock; note that with a paused clock tokio advances time
//! whenever the runtime is idle, including while it waits on socket I/O.
// Not every test crate uses every helper.
#![allow(dead_code, unused_imports, unreachable_pub)]

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;
use tokio::time::Instant;

// Private, with everything re-exported below: a public `http` module would
// shadow the `http` crate in a test that does `use common::*`.
mod grpc;
mod http;

/// Code generated from `tests/proto/echo.proto` (package `test.echo`).
#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod pb {
    include!("pb/test.echo.rs");
}

pub(crate) use grpc::BidiAttempt;
pub use grpc::{
    Action, AttemptRecord, CALL_METADATA, ChunkStream, FaultEcho, GrpcPeer, Method, Outcome,
    PUSHBACK_METADATA, ReplyStream, SERVER_STREAM_REPLIES, Script, ServerTask, expected_previous,
    fed_request, grpc_channel, spawn_grpc, spawn_grpc_on,
};
pub use http::{
    CALL_HEADER, HttpAction, HttpAttemptRecord, HttpOutcome, HttpPeer, HttpScript,
    PEER_ATTEMPT_HEADER, PEER_CALL_HEADER, http_client, http2_client, spawn_http,
};

/// One attempt as a peer recorded it; implemented by [`AttemptRecord`] (gRPC)
/// and [`HttpAttemptRecord`] (HTTP).
pub trait Attempt: Clone + fmt::Debug + Send + 'static {
    /// The key that groups attempts into calls.
    type Call: Clone + fmt::Debug + PartialEq + Send + 'static;

    /// The call this attempt belongs to.
    fn call(&self) -> &Self::Call;

    /// Whether the client went away before the server answered.
    fn is_cancelled(&self) -> bool;

    /// Marks the attempt as cancelled at `at`.
    fn mark_cancelled(&mut self, at: Instant);
}

/// What a peer saw, attempt by attempt, in arrival order. Cheap to clone; all
/// clones share the same log.
///
/// `Recorder` alone names the gRPC recorder; the HTTP peer uses
/// `Recorder<HttpAttemptRecord>`.
pub struct Recorder<R = AttemptRecord> {
    inner: Arc<RecorderInner<R>>,
}

struct RecorderInner<R> {
    records: Mutex<Vec<R>>,
    // Bumped on every change so that waiters re-check their condition.
    changed: watch::Sender<()>,
}

impl<R> Clone for Recorder<R> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<R: Attempt> fmt::Debug for Recorder<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.lock().iter()).finish()
    }
}

impl<R: Attempt> Default for Recorder<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: Attempt> Recorder<R> {
    /// An empty recorder.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(RecorderInner {
                records: Mutex::new(Vec::new()),
                changed: watch::Sender::new(()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<R>> {
        // A panicking test thread must not hide what the peer recorded.
        self.inner
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Every attempt of every call, in arrival order.
    pub fn all(&self) -> Vec<R> {
        self.lock().clone()
    }

    /// The attempts of one call, in arrival order (index = attempt index).
    pub fn attempts<Q>(&self, call: Q) -> Vec<R>
    where
        R::Call: PartialEq<Q>,
    {
        self.lock()
            .iter()
            .filter(|r| *r.call() == call)
            .cloned()
            .collect()
    }

    /// How many attempts of one call arrived.
    pub fn attempt_count<Q>(&self, call: Q) -> usize
    where
        R::Call: PartialEq<Q>,
    {
        self.lock().iter().filter(|r| *r.call() == call).count()
    }

    /// How many attempts arrived, over all calls.
    pub fn total_attempts(&self) -> usize {
        self.lock().len()
    }

    /// How many attempts of one call were cancelled by the client.
    pub fn cancelled<Q>(&self, call: Q) -> usize
    where
        R::Call: PartialEq<Q>,
    {
        self.lock()
            .iter()
            .filter(|r| *r.call() == call && r.is_cancelled())
            .count()
    }

    /// How many attempts were cancelled by the client, over all calls.
    pub fn total_cancelled(&self) -> usize {
        self.lock().iter().filter(|r| r.is_cancelled()).count()
    }

    /// Waits until `done` holds for the log. Wrap it in `tokio::time::timeout`
    /// if the condition may never hold.
    pub async fn wait_until(&self, mut done: impl FnMut(&[R]) -> bool) {
        // Subscribing before the first check means no change can slip by.
        let mut changes = self.inner.changed.subscribe();
        loop {
            if done(&self.lock()) {
                return;
            }
            if changes.changed().await.is_err() {
                // Unreachable: `self` keeps the sender alive.
                return;
            }
        }
    }

    /// Waits until at least `n` attempts of `call` arrived.
    pub async fn wait_for_attempts<Q>(&self, call: Q, n: usize)
    where
        R::Call: PartialEq<Q>,
    {
        self.wait_until(|all| all.iter().filter(|r| *r.call() == call).count() >= n)
            .await;
    }

    /// Waits until at least `n` attempts of `call` were cancelled.
    pub async fn wait_for_cancelled<Q>(&self, call: Q, n: usize)
    where
        R::Call: PartialEq<Q>,
    {
        self.wait_until(|all| {
            all.iter()
                .filter(|r| *r.call() == call && r.is_cancelled())
                .count()
                >= n
        })
        .await;
    }

    /// Records a new attempt of `call`. `make` receives the attempt index (the
    /// number of attempts of `call` seen before this one). The returned guard
    /// marks the attempt cancelled if dropped before [`AttemptGuard::finish`].
    pub(crate) fn begin(&self, call: &R::Call, make: impl FnOnce(usize) -> R) -> AttemptGuard<R> {
        let (index, attempt) = {
            let mut records = self.lock();
            let attempt = records.iter().filter(|r| r.call() == call).count();
            records.push(make(attempt));
            (records.len() - 1, attempt)
        };
        self.inner.changed.send_replace(());
        AttemptGuard {
            recorder: self.clone(),
            index,
            attempt,
            finished: false,
        }
    }

    fn update(&self, index: usize, change: impl FnOnce(&mut R)) {
        if let Some(record) = self.lock().get_mut(index) {
            change(record);
        }
        self.inner.changed.send_replace(());
    }
}

/// A live attempt in a peer's handler. Dropping it unfinished (the handler
/// future was dropped, i.e. the client cancelled) marks the attempt cancelled.
pub(crate) struct AttemptGuard<R: Attempt> {
    recorder: Recorder<R>,
    index: usize,
    attempt: usize,
    finished: bool,
}

impl<R: Attempt> AttemptGuard<R> {
    /// Zero-based attempt index within the call.
    pub(crate) fn attempt(&self) -> usize {
        self.attempt
    }

    /// Changes the record while the attempt is still running.
    pub(crate) fn update(&self, change: impl FnOnce(&mut R)) {
        self.recorder.update(self.index, change);
    }

    /// Ends the attempt with a last change; it no longer counts as cancelled
    /// when dropped.
    pub(crate) fn finish(mut self, change: impl FnOnce(&mut R)) {
        self.finished = true;
        self.recorder.update(self.index, change);
    }
}

impl<R: Attempt> Drop for AttemptGuard<R> {
    fn drop(&mut self) {
        if !self.finished {
            let now = Instant::now();
            self.recorder
                .update(self.index, |record| record.mark_cancelled(now));
        }
    }
}

/// A service that notes when each request reaches the service it wraps: how many attempts a
/// call made below the layers, and when.
#[derive(Clone)]
pub struct Sends<S> {
    inner: S,
    at: Arc<Mutex<Vec<Instant>>>,
}

#[allow(dead_code)] // Not every test target counts sends.
impl<S> Sends<S> {
    pub fn new(inner: S) -> Self {
        Sends {
            inner,
            at: Arc::default(),
        }
    }

    /// The times of the sends so far (another clone's too: clones share the record).
    pub fn times(&self) -> Vec<Instant> {
        self.at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn count(&self) -> usize {
        self.times().len()
    }
}

impl<S, R> tower::Service<R> for Sends<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        let mut at = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        at.push(Instant::now());
        drop(at);
        self.inner.call(request)
    }
}

/// A service config retrying both echo services (`test.echo.Echo`, `test.echo.BidiEcho`) with
/// a `perAttemptRecvTimeout` of `timeout` (`"0.5s"`), these `retryableStatusCodes` (a JSON
/// array), a 1-10 ms backoff, and `extra` keys at the top level (`, "retryThrottling": …`):
/// the tower layer's and the `grpc` interceptor's tests of the timeout read the same JSON.
pub fn recv_timeout_service_config(
    max_attempts: u32,
    codes: &str,
    timeout: &str,
    extra: &str,
) -> String {
    format!(
        r#"{{
          "methodConfig": [{{
            "name": [{{"service": "test.echo.Echo"}}, {{"service": "test.echo.BidiEcho"}}],
            "retryPolicy": {{
              "maxAttempts": {max_attempts}, "initialBackoff": "0.001s", "maxBackoff": "0.01s",
              "backoffMultiplier": 2, "retryableStatusCodes": {codes},
              "perAttemptRecvTimeout": "{timeout}"
            }}
          }}]{extra}
        }}"#
    )
}
