//! Replayable request bodies.
//!
//! tonic's request body and hyper's streaming bodies are not `Clone`, so a later attempt of a
//! call cannot simply send the request again. [`ReplayBody`] wraps any
//! [`http_body::Body`] and records what the first attempt sends, so that every later (or
//! parallel, hedged) attempt can send the same bytes and trailers.
//!
//! # Readers
//!
//! Each clone of a `ReplayBody` is a *reader* with its own position, and any number of them
//! may be polled at the same time, from any threads:
//!
//! - the reader furthest ahead pulls the next frame from the source, records it and sends it
//!   on at once: the first attempt streams with no added latency, and `Bytes` chunks are
//!   recorded without a copy ([`Buf::copy_to_bytes`] on `Bytes` is a reference-count bump);
//! - a reader behind it sends the recorded chunks, the very `Bytes` the source gave;
//! - a reader that catches up waits for the source, and is woken when any reader records
//!   new data, the trailers, the end or an error, or when the source itself is ready.
//!
//! [`size_hint`](http_body::Body::size_hint) and
//! [`is_end_stream`](http_body::Body::is_end_stream) are exact for every reader, given what
//! the source reports about itself. Trailers are recorded and replayed (they do not count
//! towards the limits below).
//!
//! # Limits and commitment
//!
//! gRFC A6 bounds the memory used for retries twice: per call, and in total for all calls.
//! [`BufferLimits`] holds both (256 KiB per call and 16 MiB in total by default); clones of a
//! `BufferLimits` share the total. Bytes are counted exactly, as recorded.
//!
//! - A body whose size hint already says it is larger than the per-call limit, or than what
//!   the total budget has left, is not recorded at all: [`ReplayBody::try_new`] gives it back
//!   untouched, to be sent once with no retries.
//! - A chunk that would take the call over either limit *commits* the call to the reader that
//!   pulled it, the one that has sent the most. That reader sends the chunk and the rest of
//!   the body as usual; the record is freed at once and its bytes go back to the budget;
//!   every other reader, and every clone made later, fails with [`NotReplayable`], and
//!   [`ReplayBody::is_committed`] tells the retry and hedge layers that no attempt may start.
//! - After any commit, a reader that has already sent the whole body ends it as the source
//!   did rather than failing: its request is complete, and a transport that saw it fail would
//!   reset its stream. One at the end of the record while the source has not ended yet waits
//!   for the committed reader to find out: it ends if the source ends there, and fails if
//!   more comes (never recorded) or the committed reader is dropped.
//! - The layers may commit a call themselves, from any clone ([`ReplayBody::commit_to`]), for
//!   example once an attempt receives response headers: what that reader has sent is freed at
//!   once, even while it keeps streaming, and the rest of the record as it sends it.
//! - However it commits, the call learns of it through [`ReplayBody::poll_committed`], woken
//!   from whichever task made the commit, to cancel its other attempts.
//!
//! An error from the source commits the call to the reader that hit it: see [the guide's section
//! on errors from the source](crate::guide#replay-bodies-errors-from-the-source).
//!
//! # Memory
//!
//! The record, the source and the trailers live in one shared state behind an `Arc`, and are
//! released when the last clone is dropped (or, for the record of a body still streaming when
//! the call is committed, as the reader it is committed to sends it, and at once when that
//! reader is dropped; a body recorded whole when the call commits keeps its record until the
//! last clone is dropped, since every reader may still send it).
//! Keep a never-polled clone as a template and clone it for each attempt: it holds the record
//! only for as long as it lives, and since it never sends anything it is never the reader a
//! call commits to.
//!
//! # Examples
//!
//! A body sent twice:
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use tower_retry_hedge::body::{BufferLimits, ReplayBody};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_retry_hedge::body::BoxError> {
//! let limits = BufferLimits::default();
//! let first = ReplayBody::try_new(Full::new(Bytes::from_static(b"hello")), &limits)
//!     .map_err(|_| "body too large to replay")?;
//! let template = first.clone(); // never polled; cloned for each later attempt
//!
//! assert_eq!(first.collect().await?.to_bytes(), "hello");
//! assert_eq!(limits.in_use(), 5);
//! assert_eq!(template.clone().collect().await?.to_bytes(), "hello");
//! assert!(!template.is_committed());
//!
//! drop(template); // the last clone: the record is freed
//! assert_eq!(limits.in_use(), 0);
//! # Ok(())
//! # }
//! ```
//!
//! Small limits: a streaming body that outgrows them commits the call to its first reader.
//!
//! ```
//! use bytes::Bytes;
//! use futures_util::stream;
//! use http_body::Frame;
//! use http_body_util::{BodyExt, StreamBody};
//! use std::convert::Infallible;
//! use tower_retry_hedge::body::{BufferLimits, NotReplayable, ReplayBody};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_retry_hedge::body::BoxError> {
//! let limits = BufferLimits::new(4, 64 * 1024); // 4 bytes per call, 64 KiB in all
//! let frames = ["abcd", "efgh"].map(|s| Ok::<_, Infallible>(Frame::data(Bytes::from(s))));
//! let first = ReplayBody::try_new(StreamBody::new(stream::iter(frames)), &limits)
//!     .map_err(|_| "body too large to replay")?;
//! let template = first.clone();
//!
//! // The first attempt gets the whole body; the record was freed when it outgrew 4 bytes.
//! assert_eq!(first.collect().await?.to_bytes(), "abcdefgh");
//! assert!(template.is_committed());
//! assert_eq!(template.committed_reader(), Some(0));
//! assert_eq!(limits.in_use(), 0);
//!
//! // A later attempt cannot be sent.
//! let error = template.clone().collect().await.err().ok_or("a replay must fail")?;
//! assert!(error.is::<NotReplayable>());
//! # Ok(())
//! # }
//! ```

mod buffer;
mod commit;
mod copies;
mod error;
mod positions;
mod state;
mod wake;

pub use buffer::BufferLimits;
pub use copies::{Clones, Copies, Recorded, Replay};
pub use error::NotReplayable;
use error::{Reason, bounded_message};

use buffer::{Overflow, Record};
use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use positions::Positions;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use wake::Waiters;

pub use crate::error::BoxError;

/// A request body that can be sent more than once.
///
/// See the [module docs](self) for how clones read, record and commit.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower_retry_hedge::body::{BufferLimits, ReplayBody};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_retry_hedge::body::BoxError> {
/// let limits = BufferLimits::default();
/// let body = ReplayBody::try_new(Full::new(Bytes::from_static(b"ping")), &limits)
///     .map_err(|_| "body too large to replay")?;
/// let attempt = body.clone();
/// assert_eq!((body.reader_id(), attempt.reader_id()), (0, 1));
///
/// // Readers are independent: the second attempt may even go first.
/// assert_eq!(attempt.collect().await?.to_bytes(), "ping");
/// assert_eq!(body.collect().await?.to_bytes(), "ping");
/// # Ok(())
/// # }
/// ```
pub struct ReplayBody<B> {
    shared: Arc<Recording<B>>,
    cursor: Cursor,
}

/// What every reader of one body shares.
struct Recording<B> {
    /// One lock for the source and the record. The source is polled while it is held: only
    /// one reader may poll the source at a time in any case (`poll_frame` takes `&mut`), a
    /// poll does not block, and the reader that polls records what it gets before anyone can
    /// look, so no reader ever sees the source ahead of the record. Wakers are called after
    /// it is released, except when a source wakes its waker from inside its own poll.
    state: Mutex<SourceState<B>>,
    /// The readers waiting for the source, made (under the state lock) the first time the
    /// source makes a reader wait: a source that is always ready, such as a unary gRPC
    /// message or a buffered body, never needs them.
    waiters: OnceLock<SourceWaker>,
}

/// The readers waiting for the source, and the waker that wakes them all.
///
/// Until it exists, the source is polled with the polling reader's own waker: no reader is
/// waiting then, so that waker is the only one a wake must reach. The poll that first
/// returns `Pending` makes this set and registers its reader; from then on the source is
/// polled with `waker`, so a wake reaches every reader that waits, whichever polled last.
struct SourceWaker {
    waiters: Arc<Waiters>,
    /// Wakes every reader in `waiters`.
    waker: Waker,
}

impl SourceWaker {
    fn new() -> SourceWaker {
        let (waiters, waker) = Waiters::new();
        SourceWaker { waiters, waker }
    }
}

/// The source and what it has sent so far.
struct SourceState<B> {
    /// The source, until it has ended (or failed).
    source: Option<Source<B>>,
    record: Record,
    /// How the source ended, once it has; `Some` exactly when `source` is `None`.
    end: Option<SourceEnd>,
    /// The source gave a frame after the call committed, which the record does not hold: a
    /// reader that has sent every recorded chunk may be short of the body.
    unrecorded: bool,
    /// The call committed when the record held the whole body: every reader may still send
    /// it, and the record is kept until the last reader is dropped.
    kept: bool,
    /// Empty data frames are recorded too (see [`ReplayBody::records_messages`]).
    records_empty: bool,
    /// The reader the call is committed to, once it is.
    commit: Option<Commit>,
    /// Where each live reader is in the record.
    positions: Positions,
    /// The id the next clone gets.
    next_id: u64,
    /// The call's waiter for a commit ([`ReplayBody::poll_committed`]); taken and woken by
    /// the commit.
    commit_waker: Option<Waker>,
}

/// The source body, where it can be polled from: `poll_frame` takes it pinned.
enum Source<B> {
    /// Any body: boxed, so that `B` need not be `Unpin`.
    Boxed(Pin<Box<B>>),
    /// A body known to be `Unpin`, held as it is: `pin` is [`Pin::new`], which only code that
    /// knows `B: Unpin` can name, so no box (and no allocation) is needed.
    Unpinned(B, for<'a> fn(&'a mut B) -> Pin<&'a mut B>),
}

impl<B> Source<B> {
    fn pinned(&mut self) -> Pin<&mut B> {
        match self {
            Source::Boxed(body) => body.as_mut(),
            Source::Unpinned(body, pin) => pin(body),
        }
    }

    fn get(&self) -> &B {
        match self {
            Source::Boxed(body) => body,
            Source::Unpinned(body, _) => body,
        }
    }
}

/// How the source ended.
#[derive(Debug)]
enum SourceEnd {
    /// With no trailers (or after trailers that were not recorded, the call being committed).
    Eos,
    /// With these trailers.
    Trailers(HeaderMap),
    /// With an error, which went to the reader that hit it.
    Failed,
}

/// The reader a call is committed to, and why.
#[derive(Debug)]
struct Commit {
    reader: u64,
    reason: Reason,
}

/// One reader's place in the body.
#[derive(Debug)]
struct Cursor {
    id: u64,
    /// This reader's slot in [`SourceState::positions`], which holds the number of the next
    /// recorded chunk it sends.
    slot: usize,
    bytes_read: u64,
    /// This reader has sent its last frame, or its error.
    done: bool,
}

/// What a reader polls for.
type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// What to do once a poll has released the lock: done when it is dropped.
struct After<'a, B> {
    shared: &'a Recording<B>,
    /// The reader that polled.
    reader: u64,
    /// The shared state changed: wake the other readers waiting for the source.
    wake_others: bool,
    /// A source that has ended, dropped outside the lock.
    finished: Option<Source<B>>,
    /// The call's waiter for a commit, when this poll committed the call.
    commit_waker: Option<Waker>,
}

impl<B> Drop for After<'_, B> {
    fn drop(&mut self) {
        // A source's drop and a waker may run arbitrary code, which must not find the lock
        // held.
        drop(self.finished.take());
        if self.wake_others {
            self.shared.wake_waiting_except(Some(self.reader));
        }
        if let Some(waker) = self.commit_waker.take() {
            waker.wake();
        }
    }
}

impl<B> ReplayBody<B>
where
    B: Body,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    /// Wraps `body` so that it can be replayed within `limits`.
    ///
    /// Gives `body` back, untouched, if its size hint's lower bound is already over the
    /// per-call limit or over what the total budget has left: such a body can only be sent
    /// once, so it is better not to record any of it.
    ///
    /// The returned body is reader 0.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower_retry_hedge::body::{BufferLimits, ReplayBody};
    ///
    /// let limits = BufferLimits::new(4, 1024);
    /// assert!(ReplayBody::try_new(Full::new(Bytes::from_static(b"four")), &limits).is_ok());
    /// let too_big = ReplayBody::try_new(Full::new(Bytes::from_static(b"fives")), &limits);
    /// assert!(too_big.is_err()); // the original body, to send without retries
    /// ```
    pub fn try_new(body: B, limits: &BufferLimits) -> Result<ReplayBody<B>, B> {
        ReplayBody::wrap(body, limits, |body| Source::Boxed(Box::pin(body)))
    }

    /// [`try_new`](Self::try_new) for a body that is `Unpin`, such as a boxed body: the
    /// source is held as it is, with no box of its own.
    pub(crate) fn try_new_unpin(body: B, limits: &BufferLimits) -> Result<ReplayBody<B>, B>
    where
        B: Unpin,
    {
        ReplayBody::wrap(body, limits, |body| {
            Source::Unpinned(body, |body| Pin::new(body))
        })
    }

    fn wrap(
        body: B,
        limits: &BufferLimits,
        source: impl FnOnce(B) -> Source<B>,
    ) -> Result<ReplayBody<B>, B> {
        let lower = body.size_hint().lower();
        let room = limits.per_call().min(limits.available());
        if lower > u64::try_from(room).unwrap_or(u64::MAX) {
            tracing::debug!(
                size_hint.lower = lower,
                per_call = limits.per_call(),
                available = limits.available(),
                "request body too large to record for replay"
            );
            return Err(body);
        }
        // An empty body is finished before it starts: nothing to poll, nothing to record.
        let (source, end) = if body.is_end_stream() {
            (None, Some(SourceEnd::Eos))
        } else {
            (Some(source(body)), None)
        };
        let mut positions = Positions::default();
        let slot = positions.insert(0);
        let shared = Arc::new(Recording {
            state: Mutex::new(SourceState {
                source,
                record: Record::new(limits.clone()),
                end,
                unrecorded: false,
                kept: false,
                records_empty: false,
                commit: None,
                positions,
                next_id: 1,
                commit_waker: None,
            }),
            waiters: OnceLock::new(),
        });
        Ok(ReplayBody {
            shared,
            cursor: Cursor::new(0, slot),
        })
    }
}

impl<B> ReplayBody<B> {
    /// Records a source whose every frame is a message (the `grpc` interceptor's): empty
    /// frames too (an empty message is a message, which a replay must send), each charged
    /// gRPC's 5-byte frame header beside its bytes, so that the limits bound a stream of
    /// empty messages as they bound the bytes on the wire.
    #[cfg(feature = "grpc")]
    pub(crate) fn records_messages(self) -> Self {
        /// A gRPC message's header on the wire: a flag byte and a 4-byte length.
        const MESSAGE_HEADER: usize = 5;
        let mut state = self.shared.lock();
        state.records_empty = true;
        state.record.charge_per_chunk(MESSAGE_HEADER);
        drop(state);
        self
    }

    /// Whether the call is committed, so that no new attempt may start: a limit was crossed,
    /// the source failed, or [`commit`](Self::commit) was called.
    pub fn is_committed(&self) -> bool {
        self.shared.lock().commit.is_some()
    }

    /// This reader's id: the body [`try_new`](Self::try_new) returns is 0, and each clone
    /// gets the next one.
    pub fn reader_id(&self) -> u64 {
        self.cursor.id
    }

    /// The reader the call is committed to, if it is: it alone may go on sending the body.
    ///
    /// After a limit was crossed this is the reader that had sent the most; after a source
    /// error, the reader that received the error.
    pub fn committed_reader(&self) -> Option<u64> {
        self.shared
            .lock()
            .commit
            .as_ref()
            .map(|commit| commit.reader)
    }

    /// How many body bytes this reader has sent.
    pub fn bytes_read(&self) -> u64 {
        self.cursor.bytes_read
    }

    /// Whether every reader may still send the whole body: the call is not committed, or it
    /// committed with the body recorded whole.
    pub(crate) fn every_reader_may_finish(&self) -> bool {
        let state = self.shared.lock();
        state.commit.is_none() || state.kept
    }
}

impl<B> Recording<B> {
    fn lock(&self) -> MutexGuard<'_, SourceState<B>> {
        // A poisoned lock means the source panicked while being polled; the state is only
        // changed after a poll returns, so it is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes every reader waiting for the source but `except`; call it without the lock.
    fn wake_waiting_except(&self, except: Option<u64>) {
        if let Some(source_waker) = self.waiters.get() {
            source_waker.waiters.wake_all_except(except);
        }
    }
}

impl Cursor {
    fn new(id: u64, slot: usize) -> Cursor {
        Cursor {
            id,
            slot,
            bytes_read: 0,
            done: false,
        }
    }

    fn sent(&mut self, chunk: &Bytes) {
        let len = u64::try_from(chunk.len()).unwrap_or(u64::MAX);
        self.bytes_read = self.bytes_read.saturating_add(len);
    }

    /// Why this reader cannot go on, if the call is committed to another one.
    fn excluded<'a>(&self, commit: &'a Option<Commit>) -> Option<&'a Reason> {
        commit
            .as_ref()
            .filter(|commit| commit.reader != self.id)
            .map(|commit| &commit.reason)
    }

    fn fail(&mut self, reason: Reason) -> BoxError {
        self.done = true;
        Box::new(NotReplayable { reason })
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.cursor.done {
            return Poll::Ready(None);
        }
        // Declared before the lock so that it is dropped after it: what it does runs unlocked.
        let mut after = After {
            shared: &this.shared,
            reader: this.cursor.id,
            wake_others: false,
            finished: None,
            commit_waker: None,
        };
        // Declared after `after`, so unlocked before it acts. The frame is returned straight
        // from under the lock: putting it in place before unlocking measurably beats holding
        // it in a local across the unlock.
        let mut state = this.shared.lock();
        state.poll_reader(&mut this.cursor, &this.shared.waiters, cx, &mut after)
    }

    fn is_end_stream(&self) -> bool {
        self.cursor.done || self.shared.lock().is_end_stream(&self.cursor)
    }

    fn size_hint(&self) -> SizeHint {
        if self.cursor.done {
            return SizeHint::with_exact(0);
        }
        self.shared.lock().size_hint(&self.cursor)
    }
}

impl<B> Clone for ReplayBody<B> {
    /// A new reader, at the start of the body, with the next reader id.
    fn clone(&self) -> Self {
        let cursor = {
            let mut state = self.shared.lock();
            let id = state.next_id;
            state.next_id = id.saturating_add(1);
            Cursor::new(id, state.positions.insert(id))
        };
        ReplayBody {
            shared: Arc::clone(&self.shared),
            cursor,
        }
    }
}

impl<B> Drop for ReplayBody<B> {
    fn drop(&mut self) {
        // The last clone's drop frees the record and the source with the shared state, with
        // no lock: no one else can see it.
        if Arc::get_mut(&mut self.shared).is_some() {
            return;
        }
        if let Some(source_waker) = self.shared.waiters.get() {
            source_waker.waiters.remove(self.cursor.id);
        }
        let mut state = self.shared.lock();
        state.positions.remove(self.cursor.slot);
        if !state.kept
            && state
                .commit
                .as_ref()
                .is_some_and(|commit| commit.reader == self.cursor.id)
        {
            // The one reader allowed to send the rest of the record is gone.
            state.record.free_all();
            drop(state);
            // Readers waiting to learn from it how the source ends will not: they fail.
            if let Some(source_waker) = self.shared.waiters.get() {
                source_waker.waiters.wake_all_except(None);
            }
        }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayBody")
            .field("reader_id", &self.cursor.id)
            .field("bytes_read", &self.cursor.bytes_read)
            .field("done", &self.cursor.done)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::error::MAX_SOURCE_MESSAGE;
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn source_messages_are_bounded_on_a_char_boundary() {
        let long: BoxError = "é".repeat(MAX_SOURCE_MESSAGE).into();
        let message = bounded_message(&long);
        assert!(message.len() <= MAX_SOURCE_MESSAGE);
        assert!(message.len() >= MAX_SOURCE_MESSAGE - 1);
        assert!(message.chars().all(|c| c == 'é'));

        let short: BoxError = "boom".into();
        assert_eq!(&*bounded_message(&short), "boom");
    }

    /// A source that is pending until `open`, then sends one chunk.
    struct Gated(Arc<Mutex<(bool, Option<Waker>)>>);

    impl Body for Gated {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let mut gate = self.0.lock().unwrap();
            match gate.0 {
                true => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x"))))),
                false => {
                    gate.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }
    }

    struct Woken(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_reader_committed_while_it_waits_is_woken_by_the_source() {
        let gate = Arc::new(Mutex::new((false, None::<Waker>)));
        let limits = BufferLimits::default();
        let Ok(mut body) = ReplayBody::try_new(Gated(Arc::clone(&gate)), &limits) else {
            panic!("a source with no size hint is accepted");
        };
        let woken = Arc::new(Woken(std::sync::atomic::AtomicBool::new(false)));
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());

        // The layers commit to the attempt whose body is waiting for the source.
        assert!(body.commit());

        let source_waker = {
            let mut gate = gate.lock().unwrap();
            gate.0 = true;
            gate.1.take()
        };
        source_waker.expect("the source kept a waker").wake();
        assert!(
            woken.0.load(Ordering::SeqCst),
            "the committed reader must be woken when the source is ready"
        );
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_ready());
    }

    #[test]
    fn an_unpin_source_is_held_unboxed_and_behaves_the_same() {
        let gate = Arc::new(Mutex::new((false, None::<Waker>)));
        let limits = BufferLimits::default();
        let Ok(mut first) = ReplayBody::try_new_unpin(Gated(Arc::clone(&gate)), &limits) else {
            panic!("a source with no size hint is accepted");
        };
        assert!(matches!(
            first.shared.lock().source,
            Some(Source::Unpinned(..))
        ));
        let woken = Arc::new(Woken(std::sync::atomic::AtomicBool::new(false)));
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut first).poll_frame(&mut cx).is_pending());
        let source_waker = {
            let mut gate = gate.lock().unwrap();
            gate.0 = true;
            gate.1.take()
        };
        source_waker.expect("the source kept a waker").wake();
        assert!(woken.0.load(Ordering::SeqCst));

        let mut replay = first.clone();
        for body in [&mut first, &mut replay] {
            let Poll::Ready(Some(Ok(frame))) = Pin::new(body).poll_frame(&mut cx) else {
                panic!("a data frame");
            };
            assert_eq!(frame.into_data().ok().as_deref(), Some(&b"x"[..]));
        }
        assert_eq!((limits.in_use(), first.bytes_read()), (1, 1));
        drop((first, replay));
        assert_eq!(limits.in_use(), 0);
        assert_eq!(
            Arc::strong_count(&gate),
            1,
            "the source is dropped with the body"
        );
    }

    #[test]
    fn display_is_lower_case_and_names_the_limit() {
        let cases = [
            (Reason::Limit(Overflow::PerCall), "per-call"),
            (Reason::Limit(Overflow::Total), "total"),
            (Reason::Chosen, "committed"),
            (
                Reason::SourceFailed(Arc::from("reset")),
                "source failed: reset",
            ),
        ];
        for (reason, needle) in cases {
            let text = NotReplayable { reason }.to_string();
            assert!(text.starts_with("request body"), "{text}");
            assert!(text.contains(needle), "{text}");
        }
    }
}
