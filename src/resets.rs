//! Stopping attempts without tearing down their HTTP/2 connection.
//!
//! Every attempt a call no longer needs (a hedge that lost, an attempt cut off by a commit,
//! one still running when the deadline ended the call) is an HTTP/2 stream that the client
//! resets when it drops it. Peers guard against rapid resets, and a hedging client at load
//! trips both guards of the `h2` crate that tonic and hyper use:
//!
//! - the client remembers the streams it reset (50 of them, for 1 s, by default) and ignores
//!   frames the server had already sent on them; a frame on a stream it has forgotten counts
//!   towards `max_local_error_reset_streams` (1 024 per connection, for its whole life), and
//!   past it the client closes the connection itself (`GOAWAY`, `too_many_internal_resets`);
//! - the server closes the connection when more than `max_pending_accept_reset_streams`
//!   (20) streams were reset before it accepted them (`too_many_resets`).
//!
//! Either way every call on the connection fails. So the layers keep their resets within
//! what both guards allow: each table allows [`DEFAULT_PER_SECOND`] resets a second, paced
//! evenly (a token bucket that holds a quarter second's worth), one bucket shared by every
//! clone of the layers built on it, whatever the connection. The layers' own resets then
//! never give the client more than 40 reset streams to remember in a second (its caller's
//! cancellations, and other tables on the same connection, come on top), and a server that
//! lags behind never finds more than a handful reset at once before it accepted them. An attempt stopped past that is
//! let finish on a task of its own instead (its answer is read and dropped, a bounded number
//! of bytes and for a bounded time), which closes its stream without a reset. That departs
//! from gRFC A6's "cancel", and only past the limit: the server does the work it was asked
//! for, as it mostly has by the time a hedge loses.
//!
//! A call the caller drops is cancelled at once, as always: its resets are taken from the
//! bucket all the same.
//!
//! A loser let finish must be able to finish: its request body is the replay body's, which
//! sends a body it recorded whole to every attempt, even after the call committed to another
//! (see [`crate::body`]). Otherwise its transport would reset the stream itself when the
//! body failed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::stats::MethodStats;

/// Resets a table allows per second by default: below the 50 reset streams `h2` remembers,
/// with room for the caller's own cancellations.
pub(crate) const DEFAULT_PER_SECOND: u32 = 32;

/// The most resets the bucket holds, as a share of a second's: a burst of resets may not
/// exceed it. Bursts are what a server's pending-accept guard (20 by default) sees.
const BURST_SHARE: u32 = 4;

/// The bucket's size at `limit` resets a second: a share of them, and at least 1.
fn burst(limit: u32) -> u32 {
    (limit / BURST_SHARE).max(limit.min(1))
}

/// How far into debt resets made past the limit may put the bucket: a second's worth.
const MAX_DEBT_SECONDS: f64 = 1.0;

/// Attempts a table lets finish at once; past them, a stopped attempt is reset.
const MAX_FINISHING: usize = 256;

/// The longest an attempt is let finish (from when it was stopped, and past the call's
/// deadline, which its server enforces too): then it is reset after all.
const MAX_FINISH_TIME: Duration = Duration::from_secs(10);

/// How long past the call's deadline a stopped attempt is let finish: its server's own
/// deadline (`grpc-timeout`) ends it by then.
const PAST_DEADLINE: Duration = Duration::from_secs(1);

/// The most response bytes read from an attempt let finish: past them, it is reset.
const MAX_FINISH_BYTES: u64 = 1 << 20;

/// How often at most the guard warning is logged per table.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The stream resets the calls of one table may make, and the attempts they let finish
/// instead. Only a stopped attempt or a dropped call touches it: a call answered by its first
/// attempt never does.
pub(crate) struct StreamResets {
    /// `None`: every stopped attempt is reset at once (gRFC A6 as written).
    per_second: Option<u32>,
    /// The resets that may be made now, refilled at `per_second`.
    bucket: Mutex<Bucket>,
    /// Attempts being let finish now.
    finishing: AtomicUsize,
    /// When the guard warning was last logged.
    warned_at: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for StreamResets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResets")
            .field("per_second", &self.per_second)
            .field("finishing", &self.finishing.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// How to stop an attempt the call no longer needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Drop it now: its stream is reset (within the limit).
    Reset,
    /// Let it finish on a task of its own ([`let_finish`]).
    Finish,
    /// Drop it now although the limit is reached, as no more attempts can be let finish.
    ResetOverLimit,
}

impl Stop {
    /// Records this stop in `stats`, unless it is a reset within the limit.
    pub(crate) fn record(self, stats: &MethodStats) {
        match self {
            Stop::Reset => {}
            Stop::Finish => stats.record_let_finish(),
            Stop::ResetOverLimit => stats.record_reset_over_limit(),
        }
    }
}

impl StreamResets {
    /// A limit of `per_second` resets; `None` resets every stopped attempt at once.
    pub(crate) fn new(per_second: Option<u32>) -> StreamResets {
        StreamResets {
            per_second,
            bucket: Mutex::new(Bucket {
                tokens: None,
                at: None,
            }),
            finishing: AtomicUsize::new(0),
            warned_at: Mutex::new(None),
        }
    }

    /// The resets allowed per second, if they are limited.
    pub(crate) fn per_second(&self) -> Option<u32> {
        self.per_second
    }

    /// The most resets made at once, if they are limited (the README's defaults table).
    #[cfg(test)]
    pub(crate) fn burst(&self) -> Option<u32> {
        self.per_second.map(burst)
    }

    /// Decides how to stop an attempt the call no longer needs. `can_finish`: the driver can
    /// hand the attempt to a task of its own, and its request can still be sent whole (else
    /// its transport resets the stream anyway). Letting it finish also takes a tokio runtime
    /// to run it on.
    pub(crate) fn stop(&self, can_finish: bool) -> Stop {
        let Some(limit) = self.per_second else {
            return Stop::Reset;
        };
        let now = Instant::now();
        if self.take(now, limit) {
            return Stop::Reset;
        }
        if can_finish && tokio::runtime::Handle::try_current().is_ok() && self.try_finishing() {
            return Stop::Finish;
        }
        self.count(now, limit, 1);
        Stop::ResetOverLimit
    }

    /// Counts `resets` made whatever the limit says (a call the caller dropped).
    pub(crate) fn count_resets(&self, resets: usize) {
        if let Some(limit) = self.per_second {
            self.count(Instant::now(), limit, resets);
        }
    }

    /// Takes one reset from the bucket if it holds one.
    fn take(&self, now: Instant, limit: u32) -> bool {
        let mut bucket = self.bucket(now, limit);
        let tokens = bucket.tokens.get_or_insert(0.0);
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return true;
        }
        false
    }

    /// Counts `resets` made past the limit: they are taken from what the bucket refills next.
    fn count(&self, now: Instant, limit: u32, resets: usize) {
        let mut bucket = self.bucket(now, limit);
        let floor = -f64::from(limit) * MAX_DEBT_SECONDS;
        let tokens = bucket.tokens.get_or_insert(0.0);
        // Past the floor, any count is the floor: a usize need not fit an f64 exactly.
        *tokens = (*tokens - resets as f64).max(floor);
    }

    /// The bucket, refilled for the time since it was last looked at.
    fn bucket(&self, now: Instant, limit: u32) -> std::sync::MutexGuard<'_, Bucket> {
        // A panic while the lock was held leaves a valid bucket.
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let capacity = f64::from(burst(limit));
        let elapsed = bucket
            .at
            .map_or(Duration::MAX, |at| now.saturating_duration_since(at));
        let refill = elapsed.as_secs_f64() * f64::from(limit);
        // Full at first: a table starts with its burst.
        let tokens = bucket.tokens.map_or(capacity, |tokens| tokens + refill);
        bucket.tokens = Some(tokens.min(capacity));
        bucket.at = Some(now);
        bucket
    }

    fn try_finishing(&self) -> bool {
        self.finishing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_FINISHING).then_some(n + 1)
            })
            .is_ok()
    }

    /// Whether the guard warning is due (at most one every [`WARN_EVERY`]).
    fn warning_due(&self) -> bool {
        let now = Instant::now();
        let mut warned_at = self
            .warned_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if warned_at.is_some_and(|at| now.saturating_duration_since(at) < WARN_EVERY) {
            return false;
        }
        *warned_at = Some(now);
        true
    }

    /// An attempt failed with `error`: if an HTTP/2 reset guard tore its connection down,
    /// logs it (at most once every 10 s per table) and says which.
    pub(crate) fn guard_of(&self, error: &(dyn std::error::Error + 'static)) -> Option<Guard> {
        let guard = Guard::of(error)?;
        if self.warning_due() {
            tracing::warn!(
                guard = guard.name(),
                setting = guard.setting(),
                advice = guard.advice(),
                "HTTP/2 reset guard closed the connection"
            );
        }
        Some(guard)
    }
}

/// A place among the attempts a table lets finish at once: given back when dropped, however
/// the attempt ends (or if the task is never started).
struct Slot(Arc<StreamResets>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.finishing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The resets a table may make now.
#[derive(Debug)]
struct Bucket {
    /// `None` until first looked at; may be below zero after resets past the limit.
    tokens: Option<f64>,
    at: Option<Instant>,
}

/// Which HTTP/2 reset guard closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// The client's own: frames on streams it reset and forgot (`too_many_internal_resets`,
    /// a GOAWAY it sent itself).
    Client,
    /// The server's: streams reset before it accepted them (`too_many_resets`, a GOAWAY the
    /// server sent).
    ServerPendingAccept,
    /// The server's own count of frames on streams it reset and forgot
    /// (`too_many_internal_resets`, a GOAWAY the server sent).
    ServerLocalErrors,
}

/// How deep [`Guard::of`] walks an error's `source()` chain.
const MAX_SOURCE_DEPTH: usize = 32;

/// The debug data of the `GOAWAY` with which `h2`'s guard against frames on streams it reset
/// and forgot closes a connection, on either side (`proto/streams/streams.rs`).
const LOCAL_ERROR_RESETS: &str = "too_many_internal_resets";

/// The debug data of the `GOAWAY` with which an `h2` server's guard against streams reset
/// before it accepted them closes a connection (`proto/streams/recv.rs`).
const PENDING_ACCEPT_RESETS: &str = "too_many_resets";

/// What an error that carries only the text of an `h2::Error` is known by: the description of
/// `ENHANCE_YOUR_CALM` ("detected excessive load generating behavior"), and whose `GOAWAY`
/// it was (`h2`'s `Display` of a `GOAWAY` it sent itself, and of one it received).
const CALM: &str = "excessive load";
const LIBRARY_GOAWAY: &str = "connection error detected";
const REMOTE_GOAWAY: &str = "connection error received";

impl Guard {
    /// The guard that closed the connection `error` came from, if one did, anywhere in its
    /// `source()` chain. Each guard closes the connection with a `GOAWAY` of reason
    /// `ENHANCE_YOUR_CALM` and names itself in the debug data; a server's `GOAWAY` is taken at
    /// its word. An `h2::Error` (with the `h2` feature) is read by its type (see
    /// `Guard::of_h2`); any other error, by its text ([`Guard::of_text`]).
    pub(crate) fn of(error: &(dyn std::error::Error + 'static)) -> Option<Guard> {
        std::iter::successors(Some(error), |e| e.source())
            .take(MAX_SOURCE_DEPTH)
            .find_map(|error| {
                #[cfg(feature = "h2")]
                if let Some(error) = error.downcast_ref::<h2::Error>() {
                    return Guard::of_h2(error);
                }
                Guard::of_text(&error.to_string())
            })
    }

    /// The guard an `h2` error says closed its connection: a `GOAWAY` with
    /// `ENHANCE_YOUR_CALM`, sent by `h2` itself (the client's guard) or by the server. `h2`
    /// has more such `GOAWAY`s of its own (`too_many_continuations`, `too_many_data_frames`,
    /// `header_list_way_too_large`), and a server's two guards send the same reason: only the
    /// debug data tells them apart, and `h2` gives it only in its `Display`, after the reason
    /// (` (b"too_many_resets")`). The unit tests pin these names against the errors of real
    /// `h2` connections.
    #[cfg(feature = "h2")]
    fn of_h2(error: &h2::Error) -> Option<Guard> {
        if !error.is_go_away() || error.reason() != Some(h2::Reason::ENHANCE_YOUR_CALM) {
            return None;
        }
        let text = error.to_string();
        let names = |debug_data: &str| text.contains(debug_data);
        if error.is_library() {
            return names(LOCAL_ERROR_RESETS).then_some(Guard::Client);
        }
        if error.is_remote() {
            if names(PENDING_ACCEPT_RESETS) {
                return Some(Guard::ServerPendingAccept);
            }
            if names(LOCAL_ERROR_RESETS) {
                return Some(Guard::ServerLocalErrors);
            }
        }
        None
    }

    /// The guard an error that is no `h2::Error` names in its text, as `h2` displays its
    /// errors: `connection error detected: … (b"too_many_internal_resets")` for the client's
    /// own, `connection error received: …` for the server's, the reason being
    /// `ENHANCE_YOUR_CALM`. That is all there is to go by without the `h2` feature, with an
    /// `h2` other than the crate's, or where a wrapper kept only the text.
    fn of_text(text: &str) -> Option<Guard> {
        if !text.contains(CALM) {
            return None;
        }
        let local_errors = text.contains(LOCAL_ERROR_RESETS);
        if text.contains(LIBRARY_GOAWAY) && local_errors {
            return Some(Guard::Client);
        }
        if text.contains(REMOTE_GOAWAY) {
            if text.contains(PENDING_ACCEPT_RESETS) {
                return Some(Guard::ServerPendingAccept);
            }
            if local_errors {
                return Some(Guard::ServerLocalErrors);
            }
        }
        None
    }

    fn name(self) -> &'static str {
        match self {
            Guard::Client | Guard::ServerLocalErrors => LOCAL_ERROR_RESETS,
            Guard::ServerPendingAccept => PENDING_ACCEPT_RESETS,
        }
    }

    /// The setting that holds the guard's limit.
    fn setting(self) -> &'static str {
        match self {
            Guard::Client => "client max_local_error_reset_streams",
            Guard::ServerPendingAccept => "server max_pending_accept_reset_streams",
            Guard::ServerLocalErrors => "server max_local_error_reset_streams",
        }
    }

    fn advice(self) -> &'static str {
        match self {
            Guard::Client => {
                "the client's max_local_error_reset_streams (1024 by default, per connection) \
                 was spent; let the client remember more reset streams (tonic: \
                 Endpoint::http2_max_concurrent_reset_streams, hyper-util: \
                 http2_max_concurrent_reset_streams) or lower PoliciesBuilder::resets_per_second"
            }
            Guard::ServerPendingAccept => {
                "the server's max_pending_accept_reset_streams (20 by default) was exceeded; \
                 raise it (tonic: Server::http2_max_pending_accept_reset_streams, hyper: \
                 http2::Builder::max_pending_accept_reset_streams) or lower \
                 PoliciesBuilder::resets_per_second"
            }
            Guard::ServerLocalErrors => {
                "the server's max_local_error_reset_streams (1024 by default, per connection) \
                 was spent; raise it or let the server remember more reset streams (tonic: \
                 Server::http2_max_local_error_reset_streams)"
            }
        }
    }
}

pin_project! {
    /// An attempt let finish: its answer, then its body to the end, read and dropped. Its
    /// slot goes back when it ends, however it ends.
    struct Finish<F, RB> {
        #[pin]
        state: FinishState<F, RB>,
        #[pin]
        until: Sleep,
        slot: Slot,
        stats: Arc<MethodStats>,
        read: u64,
    }
}

pin_project! {
    #[project = FinishProj]
    enum FinishState<F, RB> {
        // Waiting for the answer.
        Answer { future: Pin<Box<F>> },
        // Reading the body of the answer to its end.
        Body { #[pin] body: RB },
        Done,
    }
}

impl<F, E, RB> Future for Finish<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if this.until.as_mut().poll(cx).is_ready() {
            // Too long: reset it after all.
            this.slot.0.count_resets(1);
            this.stats.record_finish_cut_short();
            this.state.set(FinishState::Done);
            return Poll::Ready(());
        }
        loop {
            match this.state.as_mut().project() {
                FinishProj::Answer { future } => match ready!(future.as_mut().poll(cx)) {
                    Ok(response) => {
                        let body = response.into_body();
                        this.state.set(FinishState::Body { body });
                    }
                    Err(_) => {
                        this.state.set(FinishState::Done);
                        return Poll::Ready(());
                    }
                },
                FinishProj::Body { mut body } => {
                    if body.is_end_stream() {
                        this.state.set(FinishState::Done);
                        return Poll::Ready(());
                    }
                    match ready!(body.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref() {
                                *this.read += bytes::Buf::remaining(data) as u64;
                            }
                            if *this.read > MAX_FINISH_BYTES {
                                this.slot.0.count_resets(1);
                                this.stats.record_finish_cut_short();
                                this.state.set(FinishState::Done);
                                return Poll::Ready(());
                            }
                        }
                        Some(Err(_)) | None => {
                            this.state.set(FinishState::Done);
                            return Poll::Ready(());
                        }
                    }
                }
                FinishProj::Done => return Poll::Ready(()),
            }
        }
    }
}

/// Lets `attempt` finish on a task of its own (a [`Stop::Finish`] decision of `resets`, whose
/// slot it gives back when it ends), until the call's `deadline` has been past a while, or
/// [`MAX_FINISH_TIME`]. Outside a tokio runtime (which [`StreamResets::stop`] checked for) it
/// is dropped, and counted as a reset past the limit.
pub(crate) fn let_finish<F, E, RB>(
    resets: &Arc<StreamResets>,
    attempt: Pin<Box<F>>,
    deadline: Option<Instant>,
    stats: Arc<MethodStats>,
) where
    F: Future<Output = Result<Response<RB>, E>> + Send + 'static,
    RB: Body + Send + 'static,
    RB::Data: bytes::Buf,
{
    // Held first: whatever happens below, the slot goes back.
    let slot = Slot(Arc::clone(resets));
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        resets.count_resets(1);
        stats.record_finish_cut_short();
        return;
    };
    let now = Instant::now();
    let mut until = now + MAX_FINISH_TIME;
    if let Some(deadline) = deadline {
        until = until.min(deadline.max(now) + PAST_DEADLINE);
    }
    let task = Finish {
        state: FinishState::Answer { future: attempt },
        until: tokio::time::sleep_until(until),
        slot,
        stats,
        read: 0,
    };
    drop(runtime.spawn(task));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn resets_come_evenly_at_the_rate_with_bursts_of_a_quarter_second() {
        let resets = StreamResets::new(Some(40));
        // A burst of 10 (a quarter of a second's), then one every 25 ms.
        for _ in 0..10 {
            assert_eq!(resets.stop(true), Stop::Reset);
        }
        assert_eq!(resets.stop(true), Stop::Finish);
        assert_eq!(resets.stop(false), Stop::ResetOverLimit);
        // The reset past the limit is paid for first.
        tokio::time::advance(Duration::from_millis(26)).await;
        assert_eq!(resets.stop(true), Stop::Finish);
        tokio::time::advance(Duration::from_millis(25)).await;
        assert_eq!(resets.stop(true), Stop::Reset);
        assert_eq!(resets.stop(true), Stop::Finish);
        // Over any second, no more than a second's worth and one burst.
        let mut made = 0;
        for _ in 0..1000 {
            tokio::time::advance(Duration::from_millis(1)).await;
            made += usize::from(resets.take(Instant::now(), 40));
        }
        assert!((39..=50).contains(&made), "{made} resets in a second");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_limit_every_attempt_is_reset() {
        let a6 = StreamResets::new(None);
        for _ in 0..1000 {
            assert_eq!(a6.stop(true), Stop::Reset);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_cap_finish_at_once() {
        let resets = Arc::new(StreamResets::new(Some(0)));
        tokio::time::advance(Duration::from_secs(10)).await;
        for _ in 0..MAX_FINISHING {
            assert_eq!(resets.stop(true), Stop::Finish);
        }
        assert_eq!(resets.stop(true), Stop::ResetOverLimit);
        drop(Slot(Arc::clone(&resets)));
        assert_eq!(resets.stop(true), Stop::Finish);
    }

    /// A response body of 64 KiB chunks, `left` of them, that tells whether it was dropped
    /// before its end.
    struct Chunks {
        left: usize,
        cut_short: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Drop for Chunks {
        fn drop(&mut self) {
            self.cut_short.store(self.left > 0, Ordering::SeqCst);
        }
    }

    impl Body for Chunks {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            self.left -= 1;
            let chunk = bytes::Bytes::from(vec![0u8; 64 * 1024]);
            Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
        }
    }

    /// Lets an attempt answering `chunks` chunks finish; gives whether its body was cut
    /// short, and the attempts let finish that were reset after all.
    async fn finish_chunks(chunks: usize) -> (bool, u64) {
        let resets = Arc::new(StreamResets::new(Some(0)));
        let stats = Arc::new(MethodStats::default());
        let cut_short = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let body = Chunks {
            left: chunks,
            cut_short: Arc::clone(&cut_short),
        };
        let attempt = Box::pin(async move { Ok::<_, ()>(Response::new(body)) });
        assert_eq!(resets.stop(true), Stop::Finish);
        let_finish(&resets, attempt, None, Arc::clone(&stats));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            resets.finishing.load(Ordering::SeqCst),
            0,
            "the slot is back"
        );
        (
            cut_short.load(Ordering::SeqCst),
            stats.snapshot().let_finish_cut_short,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_let_finish_is_read_to_its_end_within_a_mebibyte_then_reset() {
        // 16 chunks of 64 KiB: read to the end.
        assert_eq!(finish_chunks(16).await, (false, 0));
        // Endless: dropped past 1 MiB, and counted.
        assert_eq!(finish_chunks(usize::MAX).await, (true, 1));
    }

    #[derive(Debug)]
    struct Wrapped(String, Option<Box<Wrapped>>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn the_guards_are_known_by_the_goaway_debug_data_anywhere_in_the_chain() {
        // Errors that carry only the text of an `h2::Error`, as h2 0.4 displays them (pinned
        // against real connections in `h2_tests`).
        const LOCAL: &str = "connection error detected: detected excessive load generating \
                             behavior";
        const REMOTE: &str = "connection error received: detected excessive load generating \
                              behavior";
        let wrapped = |text: String| {
            Wrapped(
                "transport error".into(),
                Some(Box::new(Wrapped(text, None))),
            )
        };
        let internal = r#" (b"too_many_internal_resets")"#;
        let pending = r#" (b"too_many_resets")"#;
        let guard = |text: String| Guard::of(&wrapped(text));
        assert_eq!(guard(format!("{LOCAL}{internal}")), Some(Guard::Client));
        assert_eq!(
            guard(format!("{REMOTE}{pending}")),
            Some(Guard::ServerPendingAccept)
        );
        assert_eq!(
            guard(format!("{REMOTE}{internal}")),
            Some(Guard::ServerLocalErrors)
        );
        // Not the guards: another reason, no debug data, or a debug data out of place.
        assert_eq!(guard("broken pipe".into()), None);
        assert_eq!(guard(LOCAL.into()), None);
        assert_eq!(guard(format!("{LOCAL}{pending}")), None);
        assert_eq!(guard("application said too_many_resets".into()), None);
    }
}

/// The errors of real `h2` connections whose guards trip, over an in-memory pipe: what
/// [`Guard::of`] reads in them, and the names it looks for in their debug data, are pinned
/// against `h2` itself.
#[cfg(all(test, feature = "h2"))]
mod h2_tests {
    use std::error::Error;
    use std::future::Future;
    use std::time::Duration;

    use bytes::Bytes;
    use h2::client::SendRequest;
    use tokio::io::DuplexStream;
    use tokio::task::JoinHandle;

    use super::Guard;

    /// Fails a test whose guard never trips instead of hanging it.
    async fn within<T>(future: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), future)
            .await
            .expect("no progress within 10 s")
    }

    fn get() -> http::Request<()> {
        http::Request::get("http://peer/").body(()).unwrap()
    }

    /// Lets the tasks of the test's one thread (the client's connection) run until they wait.
    async fn let_run() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    type Connection = JoinHandle<Result<(), h2::Error>>;

    /// A client on one end of a pipe, and its connection running on a task of its own.
    async fn client(
        builder: &h2::client::Builder,
        io: DuplexStream,
    ) -> (SendRequest<Bytes>, Connection) {
        let (send, connection) = builder.handshake(io).await.unwrap();
        (send, tokio::spawn(connection))
    }

    /// A server on one end of a pipe, built by `builder`, accepting every stream and
    /// answering none, on a task of its own.
    fn server(builder: h2::server::Builder, io: DuplexStream) -> Connection {
        tokio::spawn(async move {
            let mut connection = builder.handshake::<_, Bytes>(io).await?;
            while connection.accept().await.transpose()?.is_some() {}
            Ok(())
        })
    }

    /// What a call fails with once the client's connection closed: the error `h2` keeps for
    /// every call on it. (The connection's own result is the IO error that followed, or the
    /// `GOAWAY` without its debug data.)
    async fn closed(send: SendRequest<Bytes>, connection: Connection) -> h2::Error {
        let _ = within(connection).await.unwrap();
        within(send.ready())
            .await
            .expect_err("the connection is closed")
    }

    /// An error as hyper and tonic's transport wrap `h2`'s.
    #[derive(Debug)]
    struct Transport(h2::Error);

    impl std::fmt::Display for Transport {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("http2 error")
        }
    }

    impl Error for Transport {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    /// `error` is a `GOAWAY` with `ENHANCE_YOUR_CALM` and `debug_data` that `h2` sent itself
    /// (`library`) or received, which [`Guard::of`] takes for `guard`: by its type, wrapped as
    /// a transport wraps it, and by its text alone.
    fn assert_goaway(error: h2::Error, library: bool, debug_data: &str, guard: Option<Guard>) {
        assert!(error.is_go_away(), "{error}");
        assert_eq!(
            error.reason(),
            Some(h2::Reason::ENHANCE_YOUR_CALM),
            "{error}"
        );
        assert_eq!(
            (error.is_library(), error.is_remote()),
            (library, !library),
            "{error}"
        );
        // The debug data is in the text only; this is the name `Guard::of_h2` looks for.
        let text = error.to_string();
        assert!(text.ends_with(&format!(r#" (b"{debug_data}")"#)), "{text}");
        assert_eq!(Guard::of(&error), guard, "{text}");
        assert_eq!(Guard::of(&Transport(error)), guard, "{text}");
        assert_eq!(Guard::of_text(&text), guard, "{text}");
    }

    #[tokio::test]
    async fn the_clients_guard_is_a_goaway_of_its_own_naming_too_many_internal_resets() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        // A server whose answer has more body than its content-length says: the client resets
        // the stream itself, which counts as a frame on a stream it forgot does; it may reset
        // none.
        let server = tokio::spawn(async move {
            let mut connection = h2::server::handshake(server_io).await?;
            while let Some((_, mut respond)) = connection.accept().await.transpose()? {
                let response = http::Response::builder().header("content-length", "0");
                let mut body = respond.send_response(response.body(()).unwrap(), false)?;
                body.send_data(Bytes::from_static(b"x"), true)?;
            }
            Ok::<_, h2::Error>(())
        });
        let mut builder = h2::client::Builder::new();
        builder.max_local_error_reset_streams(Some(0));
        let (send, connection) = client(&builder, client_io).await;
        let (response, _) = send.clone().send_request(get(), true).unwrap();
        let _ = within(response).await;
        let error = closed(send, connection).await;
        assert_goaway(error, true, "too_many_internal_resets", Some(Guard::Client));
        let _ = within(server).await;
    }

    #[tokio::test]
    async fn the_servers_pending_accept_guard_is_a_goaway_naming_too_many_resets() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (mut send, connection) = client(&h2::client::Builder::new(), client_io).await;
        // A stream sent and reset before the server reads either: it finds the stream reset
        // before it accepted it, and allows none.
        let (response, _) = send.send_request(get(), true).unwrap();
        let_run().await;
        drop(response);
        let_run().await;
        let mut builder = h2::server::Builder::new();
        builder.max_pending_accept_reset_streams(0);
        let server = server(builder, server_io);
        let error = closed(send, connection).await;
        let guard = Some(Guard::ServerPendingAccept);
        assert_goaway(error, false, "too_many_resets", guard);
        let _ = within(server).await;
    }

    #[tokio::test]
    async fn the_servers_local_error_guard_is_a_goaway_naming_too_many_internal_resets() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (mut send, connection) = client(&h2::client::Builder::new(), client_io).await;
        // Two streams sent before the server's settings reach the client: the server refuses
        // the one past its limit of one, a reset that counts as one on a stream it forgot; it
        // may reset none.
        let responses = [(); 2].map(|()| send.send_request(get(), true).unwrap().0);
        let_run().await;
        let mut builder = h2::server::Builder::new();
        builder
            .max_concurrent_streams(1)
            .max_local_error_reset_streams(Some(0));
        let server = server(builder, server_io);
        let error = closed(send, connection).await;
        let guard = Some(Guard::ServerLocalErrors);
        assert_goaway(error, false, "too_many_internal_resets", guard);
        drop(responses);
        let _ = within(server).await;
    }

    #[tokio::test]
    async fn h2s_other_goaways_with_enhance_your_calm_are_no_reset_guard() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        // A server that answers with a small DATA frame, to a client that allows none.
        let server = tokio::spawn(async move {
            let mut connection = h2::server::handshake(server_io).await?;
            let mut bodies = Vec::new();
            while let Some((_, mut respond)) = connection.accept().await.transpose()? {
                let mut body = respond.send_response(http::Response::new(()), false)?;
                body.send_data(Bytes::from_static(b"x"), false)?;
                bodies.push(body);
            }
            Ok::<_, h2::Error>(())
        });
        let mut builder = h2::client::Builder::new();
        builder.data_frame_budget(0);
        let (send, connection) = client(&builder, client_io).await;
        let (response, _) = send.clone().send_request(get(), true).unwrap();
        let _ = within(response).await;
        let error = closed(send, connection).await;
        assert_goaway(error, true, "too_many_data_frames", None);
        let _ = within(server).await;
    }
}
