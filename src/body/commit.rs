//! Committing a call to one of its readers, and telling the call when it is committed.
//!
//! A call commits to one attempt (gRFC A6): the layers choose it ([`ReplayBody::commit_to`]),
//! or the body chooses it, inside whichever task polls it, when it outgrows a limit or its
//! source fails. Either way the record stops recording, the call's waiter
//! ([`ReplayBody::poll_committed`]) is woken to cancel the other attempts, and, while the
//! source has not ended, what the chosen reader has sent goes back to the budget at once and
//! every other reader fails with [`NotReplayable`]. A body recorded whole may still be sent
//! to its end by every reader.
//!
//! [`NotReplayable`]: super::NotReplayable

use super::{Commit, Reason, ReplayBody};
use std::task::{Context, Poll};

impl<B> ReplayBody<B> {
    /// Commits the call to this reader, unless it is committed already; the same as
    /// [`commit_to`](Self::commit_to) with this reader's id.
    ///
    /// For the retry and hedge layers, once an attempt is known to be the last (its response
    /// headers have arrived, say): every other reader fails with [`NotReplayable`], what this
    /// reader has sent is freed at once and the rest of the record as this reader sends it.
    /// Returns whether the call is now committed to this reader.
    ///
    /// Never commit to a template that is not sent: no reader could then finish the body.
    ///
    /// [`NotReplayable`]: super::NotReplayable
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower_retry_hedge::body::{BufferLimits, ReplayBody};
    ///
    /// let limits = BufferLimits::default();
    /// let template = ReplayBody::try_new(Full::new(Bytes::from_static(b"x")), &limits)
    ///     .map_err(|_| "body too large to replay")?;
    /// let (first, second) = (template.clone(), template.clone());
    /// assert!(second.commit());
    /// assert!(!first.commit());
    /// assert_eq!(template.committed_reader(), Some(second.reader_id()));
    /// # Ok::<(), &str>(())
    /// ```
    pub fn commit(&self) -> bool {
        self.commit_to(self.cursor.id)
    }

    /// Commits the call to the reader whose id is `reader`, unless the call is committed
    /// already; returns whether the call is now committed to `reader`. It may be called from
    /// any clone: the layers call it on the never-polled template they keep.
    ///
    /// From then on the record records nothing more. While the source has not ended, every
    /// chunk `reader` has already sent goes back to the budget at once, even while `reader`
    /// keeps streaming from the source; the chunks it has yet to send go back as it sends
    /// them. Every other reader fails with [`NotReplayable`] (one that has sent every recorded
    /// chunk waits for `reader` to find out whether the source ends there, and ends too if it
    /// does): those waiting for the source are woken to find out, and so is the call's waiter
    /// ([`poll_committed`](Self::poll_committed)). If `reader` was made but has since been
    /// dropped, the whole record is freed at once: no reader may send it any more.
    ///
    /// Once the source has ended, the record holds the whole body: every reader may still
    /// send it to the end, as a complete request (a reader that fails makes its transport
    /// reset the stream, which HTTP/2 peers count against the connection), and the record
    /// goes back to the budget when the last clone is dropped. hyper drops a request body
    /// once it has sent all of it, often before the response arrives.
    ///
    /// A reader that waits at the end of the record waits for as long as `reader` lives
    /// without finding the source's end: poll `reader` on, or drop it, for the others to
    /// learn how the body ends.
    ///
    /// An id this body never gave out commits nothing and returns `false`: committing to it
    /// would fail every real attempt.
    ///
    /// [`NotReplayable`]: super::NotReplayable
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body::Frame;
    /// use http_body_util::{BodyExt, Full, StreamBody};
    /// use tower_retry_hedge::body::{BoxError, BufferLimits, NotReplayable, ReplayBody};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_retry_hedge::body::BoxError> {
    /// let limits = BufferLimits::default();
    /// let template = ReplayBody::try_new(Full::new(Bytes::from_static(b"hello")), &limits)
    ///     .map_err(|_| "body too large to replay")?;
    /// let (first, second) = (template.clone(), template.clone());
    /// let first_id = first.reader_id();
    /// assert_eq!(first.collect().await?.to_bytes(), "hello");
    /// assert_eq!(limits.in_use(), 5);
    ///
    /// // The first attempt's response has come: it is the one that goes on.
    /// assert!(template.commit_to(first_id));
    /// assert!(!template.commit_to(second.reader_id()));
    /// // The body was recorded whole: the other attempt may still send it, complete.
    /// assert_eq!(second.collect().await?.to_bytes(), "hello");
    /// drop(template);
    /// assert_eq!(limits.in_use(), 0);
    ///
    /// // A body still streaming when the call commits: the rest is never recorded, and the
    /// // other readers fail.
    /// let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(2);
    /// let streaming = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    /// let template = ReplayBody::try_new(streaming, &limits)
    ///     .map_err(|_| "body too large to replay")?;
    /// let (mut first, second) = (template.clone(), template.clone());
    /// tx.send(Ok(Frame::data(Bytes::from_static(b"he")))).await?;
    /// first.frame().await.ok_or("a frame")??;
    /// assert!(template.commit_to(first.reader_id()));
    /// tx.send(Ok(Frame::data(Bytes::from_static(b"llo")))).await?;
    /// drop(tx);
    /// assert_eq!(first.collect().await?.to_bytes(), "llo");
    /// let error = second.collect().await.err().ok_or("the other attempt must fail")?;
    /// assert!(error.is::<NotReplayable>());
    /// # Ok(())
    /// # }
    /// ```
    pub fn commit_to(&self, reader: u64) -> bool {
        let commit_waker = {
            let mut state = self.shared.lock();
            if let Some(commit) = &state.commit {
                return commit.reader == reader;
            }
            if reader >= state.next_id {
                tracing::debug!(reader, "request body has no such reader; not committed");
                return false;
            }
            state.commit = Some(Commit {
                reader,
                reason: Reason::Chosen,
            });
            match state.positions.of(reader) {
                // A record that holds the whole body is kept for the readers still sending
                // it, until the last is dropped (see `SourceState::excludes`).
                _ if state.is_whole() => state.kept = true,
                Some(next_chunk) => state.record.free_before(next_chunk),
                // Dropped: no reader may send the record any more.
                None => state.record.free_all(),
            }
            tracing::debug!(reader, "request body committed");
            state.commit_waker.take()
        };
        // Readers waiting at the front must learn that they will never be sent anything.
        // The chosen reader is woken too: waking takes every registration, and if it is
        // itself waiting for the source, a registration lost here would never be renewed.
        self.shared.wake_waiting_except(None);
        if let Some(waker) = commit_waker {
            waker.wake();
        }
        true
    }

    /// `Ready` with the id of the reader the call is committed to, once it is, whatever
    /// committed it: a limit crossed or a source error (inside whichever task polled the
    /// body, often the transport's), or [`commit_to`](Self::commit_to).
    ///
    /// Otherwise `Pending`, and `cx`'s waker is woken when the call commits, from whatever
    /// task commits it. A body keeps one such waiter for all its clones, meant for the call
    /// that owns them: each registration replaces the one before. Nothing is allocated
    /// unless a waker is registered, and the readers pay for it only when they commit.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use std::task::{Context, Poll, Waker};
    /// use tower_retry_hedge::body::{BufferLimits, ReplayBody};
    ///
    /// let limits = BufferLimits::default();
    /// let template = ReplayBody::try_new(Full::new(Bytes::from_static(b"x")), &limits)
    ///     .map_err(|_| "body too large to replay")?;
    /// let attempt = template.clone();
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(template.poll_committed(&mut cx).is_pending());
    /// attempt.commit();
    /// assert_eq!(template.poll_committed(&mut cx), Poll::Ready(attempt.reader_id()));
    /// # Ok::<(), &str>(())
    /// ```
    pub fn poll_committed(&self, cx: &mut Context<'_>) -> Poll<u64> {
        let replaced = {
            let mut state = self.shared.lock();
            if let Some(commit) = &state.commit {
                return Poll::Ready(commit.reader);
            }
            match &state.commit_waker {
                Some(waker) if waker.will_wake(cx.waker()) => None,
                _ => state.commit_waker.replace(cx.waker().clone()),
            }
        };
        // A waker's drop may run arbitrary code, which must not find the lock held.
        drop(replaced);
        Poll::Pending
    }
}
