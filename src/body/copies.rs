//! Request body types the layers know how to send more than once.

use bytes::Bytes;
use http_body_util::{Empty, Full};
use std::task::{Context, Poll};

use super::{BoxError, BufferLimits, ReplayBody};

/// A request body type that the retry and hedge layers can send more than once.
///
/// [`prepare`](Replay::prepare) turns the call's body into [`Copies`], from which each attempt
/// takes its own body. A body that cannot be replayed (its size hint is already over the
/// buffer limits) is given back untouched and sent once.
///
/// Implemented for:
/// - bodies that are cheap to clone: [`Full<Bytes>`](http_body_util::Full),
///   [`Empty<Bytes>`](http_body_util::Empty) (copies are clones; nothing is buffered);
/// - streaming bodies, through a [`ReplayBody`]: boxed bodies
///   ([`BoxBody`](http_body_util::combinators::BoxBody) and
///   [`UnsyncBoxBody`](http_body_util::combinators::UnsyncBoxBody) with a [`BoxError`]),
///   `tonic::body::Body` (with the `tonic` feature), and [`ReplayBody`] itself, for any other
///   body type wrapped by the caller.
///
/// Any other streaming body (axum's `Body`, hyper's `Incoming`, a `StreamBody`) is boxed first:
/// `UnsyncBoxBody::new(body.map_err(Into::into))`, or `BoxBody` for a `Sync` body, both with
/// [`BoxError`] as the error type.
///
/// # Compile errors
///
/// A body type that is not `Replay` is a compile error. Where rustc checks the layers'
/// `Service` bounds one by one (a function with a `Service` bound,
/// `Service::call(&mut svc, request)`), the error names this trait and lists the bodies
/// above. Through a `tower::ServiceExt` method (`svc.oneshot(request)`, `svc.ready()`),
/// rustc 1.95 picks the method first and reports only the method's unsatisfied bound, without
/// a word about this trait: E0599, "the method `oneshot` exists for struct `Retry<…>`, but its
/// trait bounds were not satisfied", with the note "`Retry<…>: Service<_>`". Box the body as
/// above; written as `Service::call(&mut svc, request)`, the same call makes rustc name the
/// bound that fails.
#[diagnostic::on_unimplemented(
    message = "the retry and hedge layers cannot replay a request body of type `{Self}`",
    label = "a request with this body cannot be sent more than once",
    note = "bodies that can be replayed: `Full<Bytes>`, `Empty<Bytes>`, `BoxBody<Bytes, BoxError>`, \
            `UnsyncBoxBody<Bytes, BoxError>`, `tonic::body::Body` (feature `tonic`) and `ReplayBody<B>`",
    note = "box a streaming body: `UnsyncBoxBody::new(body.map_err(Into::<BoxError>::into))` \
            (`http_body_util::BodyExt::boxed_unsync`), and give the inner service that body type"
)]
pub trait Replay: http_body::Body + Sized {
    /// What a call keeps to make a body for each attempt.
    type Copies: Copies<Self>;

    /// Prepares the body for several attempts, or gives it back untouched if it cannot be
    /// replayed within `limits`.
    fn prepare(self, limits: &BufferLimits) -> Result<Self::Copies, Self>;
}

/// Makes a body for each attempt of one call.
pub trait Copies<B> {
    /// The body of the first attempt, and the id of its reader. Always available: a call
    /// cannot be committed before its first attempt starts.
    fn first(&self) -> (B, u64);

    /// A body for the next attempt, and the id of the reader behind it; `None` once the call
    /// is committed (the body outgrew the buffer), when no new attempt may start.
    fn copy(&self) -> Option<(B, u64)>;

    /// Whether the copies are made from a record of what the first attempt sends, which
    /// commits itself to one reader when it outgrows the buffer or its source fails. `false`
    /// for copies that record nothing and never commit ([`Clones`]). The layers claim a
    /// recorded body for the attempt whose answer they return (see [`commit`](Copies::commit)).
    fn records(&self) -> bool {
        true
    }

    /// Whether the call is committed: no new attempt may start.
    fn is_committed(&self) -> bool;

    /// After commit, the reader id of the attempt that goes on.
    fn committed_reader(&self) -> Option<u64>;

    /// Commits the call to the attempt whose body is reader `reader`, unless the call is
    /// committed already; returns whether the call is now committed to `reader`.
    ///
    /// No new copy can be made. While the source has not ended, what the record holds goes
    /// back to the budget at once: every chunk that attempt has sent, and the rest as it
    /// sends them; every other attempt's body fails with
    /// [`NotReplayable`](super::NotReplayable). Once the source has ended, every attempt may
    /// still send the whole body (a hedge that lost is then a complete request, not a reset
    /// stream), and the record goes back when the last copy is dropped. A reader that has
    /// been dropped may be committed to; an id the call never gave out commits nothing and
    /// returns `false` (see [`ReplayBody::commit_to`]). Copies that record nothing
    /// ([`Clones`]) have nothing to commit: this returns `true` and changes nothing.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full, StreamBody};
    /// use futures_util::stream;
    /// use http_body::Frame;
    /// use std::convert::Infallible;
    /// use tower_retry_hedge::body::{BufferLimits, Copies, Replay, ReplayBody};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_retry_hedge::body::BoxError> {
    /// let limits = BufferLimits::default();
    /// let frames = ["ab", "cd"].map(|s| Ok::<_, Infallible>(Frame::data(Bytes::from(s))));
    /// let body = ReplayBody::try_new(StreamBody::new(stream::iter(frames)), &limits)
    ///     .map_err(|_| "body too large to replay")?;
    /// let copies = body.prepare(&limits).map_err(|_| "body too large to replay")?;
    ///
    /// let (first, reader) = copies.first();
    /// let (second, _) = copies.copy().ok_or("not committed yet")?;
    /// assert_eq!(first.collect().await?.to_bytes(), "abcd");
    /// assert_eq!(limits.in_use(), 4);
    /// assert!(copies.commit(reader)); // its response has come
    /// assert!(copies.copy().is_none());
    /// // The body was recorded whole: the other attempt may still send all of it.
    /// assert_eq!(second.collect().await?.to_bytes(), "abcd");
    /// drop(copies);
    /// assert_eq!(limits.in_use(), 0);
    /// # Ok(())
    /// # }
    /// ```
    fn commit(&self, reader: u64) -> bool;

    /// `Ready` with the committed reader's id once the call is committed, whatever committed
    /// it; otherwise `Pending`, and `cx`'s waker is woken when the call commits.
    ///
    /// A recorded body commits itself when it outgrows a limit or its source fails, inside
    /// whichever task polls it (often the transport's, not the caller's): this is how the
    /// call learns of it, within one wake-up, to cancel its other attempts. One waker is
    /// kept per call, each registration replacing the one before. [`Clones`] can never
    /// commit: they stay `Pending` and register nothing.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use futures_util::stream;
    /// use http_body::Frame;
    /// use http_body_util::{BodyExt, StreamBody};
    /// use std::convert::Infallible;
    /// use std::task::{Context, Poll, Waker};
    /// use tower_retry_hedge::body::{BufferLimits, Copies, Replay, ReplayBody};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_retry_hedge::body::BoxError> {
    /// let limits = BufferLimits::new(4, 1024);
    /// let frames = ["abc", "def"].map(|s| Ok::<_, Infallible>(Frame::data(Bytes::from(s))));
    /// let body = ReplayBody::try_new(StreamBody::new(stream::iter(frames)), &limits)
    ///     .map_err(|_| "body too large to replay")?;
    /// let copies = body.prepare(&limits).map_err(|_| "body too large to replay")?;
    /// let (first, reader) = copies.first();
    ///
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(copies.poll_committed(&mut cx).is_pending());
    /// // The transport sends the body; 6 bytes outgrow the 4-byte limit.
    /// tokio::spawn(first.collect()).await??;
    /// assert_eq!(copies.poll_committed(&mut cx), Poll::Ready(reader));
    /// # Ok(())
    /// # }
    /// ```
    fn poll_committed(&self, cx: &mut Context<'_>) -> Poll<u64>;

    /// Whether every copy given out may still send the whole body: the call is not
    /// committed, or it committed with the body recorded whole (see
    /// [`ReplayBody::commit_to`]). The layers let an attempt they no longer need finish only
    /// then: otherwise its body fails, and its transport resets its stream anyway. The
    /// default, for copies that are clones, is `true`.
    fn every_copy_may_finish(&self) -> bool {
        true
    }
}

/// [`Copies`] of a body that is cheap to clone: every attempt gets a clone.
#[derive(Debug, Clone)]
pub struct Clones<B>(B);

impl<B: Clone> Copies<B> for Clones<B> {
    fn first(&self) -> (B, u64) {
        (self.0.clone(), 0)
    }

    fn copy(&self) -> Option<(B, u64)> {
        Some((self.0.clone(), 0))
    }

    fn records(&self) -> bool {
        false
    }

    fn is_committed(&self) -> bool {
        false
    }

    fn committed_reader(&self) -> Option<u64> {
        None
    }

    fn commit(&self, _: u64) -> bool {
        true
    }

    fn poll_committed(&self, _: &mut Context<'_>) -> Poll<u64> {
        Poll::Pending
    }
}

impl Replay for Full<Bytes> {
    type Copies = Clones<Full<Bytes>>;

    fn prepare(self, _: &BufferLimits) -> Result<Self::Copies, Self> {
        Ok(Clones(self))
    }
}

impl Replay for Empty<Bytes> {
    type Copies = Clones<Empty<Bytes>>;

    fn prepare(self, _: &BufferLimits) -> Result<Self::Copies, Self> {
        Ok(Clones(self))
    }
}

/// [`Copies`] through a [`ReplayBody`]: the first attempt streams and records; later (or
/// parallel) attempts replay the record. `wrap` turns a reader back into the body type the
/// inner service takes.
pub struct Recorded<B, T> {
    template: ReplayBody<B>,
    wrap: fn(ReplayBody<B>) -> T,
}

impl<B, T> std::fmt::Debug for Recorded<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorded").finish_non_exhaustive()
    }
}

impl<B, T> Copies<T> for Recorded<B, T>
where
    B: http_body::Body,
    B::Data: bytes::Buf,
    B::Error: Into<BoxError>,
{
    fn first(&self) -> (T, u64) {
        let reader = self.template.clone();
        let id = reader.reader_id();
        ((self.wrap)(reader), id)
    }

    fn copy(&self) -> Option<(T, u64)> {
        if self.template.is_committed() {
            return None;
        }
        Some(self.first())
    }

    fn is_committed(&self) -> bool {
        self.template.is_committed()
    }

    fn committed_reader(&self) -> Option<u64> {
        self.template.committed_reader()
    }

    fn commit(&self, reader: u64) -> bool {
        self.template.commit_to(reader)
    }

    fn poll_committed(&self, cx: &mut Context<'_>) -> Poll<u64> {
        self.template.poll_committed(cx)
    }

    fn every_copy_may_finish(&self) -> bool {
        self.template.every_reader_may_finish()
    }
}

macro_rules! recorded_via_replay_body {
    ($($(#[$meta:meta])* $body:ty => $wrap:expr;)+) => {$(
        $(#[$meta])*
        impl Replay for $body {
            type Copies = Recorded<$body, $body>;

            fn prepare(self, limits: &BufferLimits) -> Result<Self::Copies, Self> {
                // Boxed bodies are `Unpin`: the replay body holds them with no box of its own.
                let template = ReplayBody::try_new_unpin(self, limits)?;
                Ok(Recorded { template, wrap: $wrap })
            }
        }
    )+};
}

recorded_via_replay_body! {
    http_body_util::combinators::BoxBody<Bytes, BoxError> => http_body_util::combinators::BoxBody::new;
    http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError> => http_body_util::combinators::UnsyncBoxBody::new;
    #[cfg(feature = "tonic")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    tonic::body::Body => tonic::body::Body::new;
}

impl<B> Replay for ReplayBody<B>
where
    B: http_body::Body + Unpin,
    B::Data: bytes::Buf,
    B::Error: Into<BoxError>,
{
    type Copies = Recorded<B, ReplayBody<B>>;

    fn prepare(self, _: &BufferLimits) -> Result<Self::Copies, Self> {
        Ok(Recorded {
            template: self,
            wrap: std::convert::identity,
        })
    }
}
