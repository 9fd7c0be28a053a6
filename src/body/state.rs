//! How one reader of a [`ReplayBody`](super::ReplayBody) gets its next frame: from the
//! record when it is behind, else from the source, which it records for the others.

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use std::sync::OnceLock;
use std::task::{Context, Poll};

use super::buffer::Overflow;
use super::{
    After, BoxError, Commit, Cursor, Polled, Reason, SourceEnd, SourceState, SourceWaker,
    bounded_message,
};

impl<B> SourceState<B>
where
    B: Body,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    /// Polls for `cursor`'s next frame, from the record or else from the source.
    pub(super) fn poll_reader(
        &mut self,
        cursor: &mut Cursor,
        waiters: &OnceLock<SourceWaker>,
        cx: &mut Context<'_>,
        after: &mut After<'_, B>,
    ) -> Polled {
        if let Some(reason) = self.excludes(cursor).cloned() {
            let at_the_end = self.positions.next_chunk(cursor.slot) >= self.record.end();
            if at_the_end && self.is_whole() {
                // The source ended after the commit with nothing more: this reader had sent
                // the whole body, and ends it as the source did.
                cursor.done = true;
                return match &self.end {
                    Some(SourceEnd::Trailers(trailers)) => {
                        Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))))
                    }
                    _ => Poll::Ready(None),
                };
            }
            if at_the_end && self.may_still_end() {
                return wait(waiters, None, cursor, cx);
            }
            return Poll::Ready(Some(Err(cursor.fail(reason))));
        }

        // Behind the front: send the recorded chunk, the same `Bytes` the source gave.
        let next_chunk = self.positions.next_chunk(cursor.slot);
        if next_chunk < self.record.end() {
            let Some(chunk) = self.record.get(next_chunk).cloned() else {
                // Chunks are freed only behind the reader the call is committed to, and
                // that is not this one.
                return Poll::Ready(Some(Err(cursor.fail(Reason::Chosen))));
            };
            let next_chunk = next_chunk.saturating_add(1);
            self.positions.set_next_chunk(cursor.slot, next_chunk);
            cursor.sent(&chunk);
            if self.commit.is_some() && !self.kept {
                // Committed to this reader: what it has sent will never be sent again.
                self.record.free_before(next_chunk);
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }

        // At the front: the source has ended, or this reader polls it.
        match &self.end {
            Some(SourceEnd::Eos) => {
                cursor.done = true;
                return Poll::Ready(None);
            }
            Some(SourceEnd::Trailers(trailers)) => {
                cursor.done = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
            }
            Some(SourceEnd::Failed) => {
                // Only the reader that hit the error could be here, and it is done.
                cursor.done = true;
                return Poll::Ready(None);
            }
            None => {}
        }
        self.poll_source(cursor, waiters, cx, after)
    }

    /// Whether a reader cut off by a commit at the end of the record, before the source
    /// ended, may still find the record whole: the reader the call is committed to pulls the
    /// source on and tells, unless it is gone. Such a reader waits rather than fails.
    fn may_still_end(&self) -> bool {
        let committed_alive = self
            .commit
            .as_ref()
            .is_some_and(|commit| self.positions.of(commit.reader).is_some());
        self.end.is_none() && !self.unrecorded && committed_alive
    }

    fn poll_source(
        &mut self,
        cursor: &mut Cursor,
        waiters: &OnceLock<SourceWaker>,
        cx: &mut Context<'_>,
        after: &mut After<'_, B>,
    ) -> Polled {
        loop {
            let Some(source) = self.source.as_mut() else {
                // `end` is set whenever the source is taken; nothing more will come.
                cursor.done = true;
                return Poll::Ready(None);
            };
            // Some bodies panic when polled after their end; never poll one that says so.
            if source.get().is_end_stream() {
                return self.finish(SourceEnd::Eos, cursor, after, Poll::Ready(None));
            }
            let source_waker = waiters.get();
            // Until a source waker exists no reader waits: this one's waker is the only one.
            let waker = source_waker.map_or(cx.waker(), |source_waker| &source_waker.waker);
            let seen = source_waker.map(|source_waker| source_waker.waiters.wakes());
            match source.pinned().poll_frame(&mut Context::from_waker(waker)) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => return self.record_data(data, cursor, after),
                    Err(frame) => {
                        if let Some(polled) = self.record_trailers(frame, cursor, after) {
                            return polled;
                        }
                    }
                },
                Poll::Pending => return wait(waiters, seen, cursor, cx),
                Poll::Ready(None) => {
                    return self.finish(SourceEnd::Eos, cursor, after, Poll::Ready(None));
                }
                Poll::Ready(Some(Err(error))) => return self.fail(error.into(), cursor, after),
            }
        }
    }

    /// Records a data frame `cursor` pulled from the source, and sends it on.
    fn record_data(
        &mut self,
        mut data: B::Data,
        cursor: &mut Cursor,
        after: &mut After<'_, B>,
    ) -> Polled {
        let len = data.remaining();
        // Zero-copy when `data` is `Bytes`: a reference-count bump.
        let chunk = data.copy_to_bytes(len);
        cursor.sent(&chunk);
        if chunk.is_empty() && !self.records_empty {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if self.commit.is_some() {
            // Not recorded: the call is committed, and its reader at the front has already
            // had everything it sent freed. Readers waiting at the end of the record learn
            // that they are short of the body.
            self.unrecorded = true;
            after.wake_others = true;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        match self.record.try_push(&chunk) {
            Ok(()) => {
                self.positions
                    .set_next_chunk(cursor.slot, self.record.end());
                // A source that says it has ended with its last frame may never be polled
                // again (hyper stops there): its end is known now, and the record whole.
                if self
                    .source
                    .as_ref()
                    .is_some_and(|source| source.get().is_end_stream())
                {
                    self.end = Some(SourceEnd::Eos);
                    after.finished = self.source.take();
                }
            }
            Err(overflow) => self.overflow(overflow, cursor, after),
        }
        after.wake_others = true;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    /// A chunk `cursor` pulled would take the record over a limit: the call is committed
    /// to `cursor`, and the record freed.
    fn overflow(&mut self, overflow: Overflow, cursor: &Cursor, after: &mut After<'_, B>) {
        tracing::debug!(
            reader = cursor.id,
            bytes_read = cursor.bytes_read,
            ?overflow,
            "request body outgrew the retry buffer; committed"
        );
        self.commit = Some(Commit {
            reader: cursor.id,
            reason: Reason::Limit(overflow),
        });
        // The chunk is not recorded.
        self.unrecorded = true;
        // `cursor` is at the front: it has sent every recorded chunk.
        self.record.free_all();
        after.commit_waker = self.commit_waker.take();
    }

    /// Records the trailers `cursor` pulled from the source, and sends them on; `None` for a
    /// kind of frame this crate does not know, which cannot be replayed, so it is not sent
    /// either.
    fn record_trailers(
        &mut self,
        frame: Frame<B::Data>,
        cursor: &mut Cursor,
        after: &mut After<'_, B>,
    ) -> Option<Polled> {
        let trailers = frame.into_trailers().ok()?;
        let end = if self.commit.is_none() {
            SourceEnd::Trailers(trailers.clone())
        } else {
            self.unrecorded = true;
            SourceEnd::Eos
        };
        let polled = Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        Some(self.finish(end, cursor, after, polled))
    }

    /// The source failed: its error goes to `cursor`, and the call is committed to it.
    fn fail(&mut self, error: BoxError, cursor: &mut Cursor, after: &mut After<'_, B>) -> Polled {
        let message = bounded_message(&error);
        tracing::debug!(reader = cursor.id, error = %message, "request body source failed");
        if self.commit.is_none() {
            self.commit = Some(Commit {
                reader: cursor.id,
                reason: Reason::SourceFailed(message),
            });
            after.commit_waker = self.commit_waker.take();
        }
        self.record.free_all();
        self.finish(
            SourceEnd::Failed,
            cursor,
            after,
            Poll::Ready(Some(Err(error))),
        )
    }

    /// Records how the source ended; `polled` is `cursor`'s last frame.
    fn finish(
        &mut self,
        end: SourceEnd,
        cursor: &mut Cursor,
        after: &mut After<'_, B>,
        polled: Polled,
    ) -> Polled {
        self.end = Some(end);
        cursor.done = true;
        after.finished = self.source.take();
        after.wake_others = true;
        polled
    }
}

/// The source returned `Pending` to `cursor`'s poll: registers it to be woken. `seen` is the
/// source waker's count of wakes before the poll, if the source was polled with it.
fn wait(
    waiters: &OnceLock<SourceWaker>,
    seen: Option<u64>,
    cursor: &Cursor,
    cx: &mut Context<'_>,
) -> Polled {
    let source_waker = waiters.get_or_init(SourceWaker::new);
    // Polled with this reader's own waker, the source will wake it directly; registering it
    // lets a wake of the shared waker, once another reader polls with it, reach it too.
    let seen = seen.unwrap_or_else(|| source_waker.waiters.wakes());
    if !source_waker.waiters.register(cursor.id, cx.waker(), seen) {
        // The source woke while it was being polled (or just after): poll again rather
        // than wait for a wake that has come and gone.
        cx.waker().wake_by_ref();
    }
    Poll::Pending
}

impl<B: Body> SourceState<B> {
    pub(super) fn size_hint(&self, cursor: &Cursor) -> SizeHint {
        if cursor.done || self.excludes(cursor).is_some() {
            return SizeHint::with_exact(0);
        }
        let recorded = if self.positions.next_chunk(cursor.slot) < self.record.end() {
            self.record.end_offset().saturating_sub(cursor.bytes_read)
        } else {
            0
        };
        let Some(source) = &self.source else {
            return SizeHint::with_exact(recorded);
        };
        let rest = source.get().size_hint();
        let mut hint = SizeHint::new();
        let lower = rest.lower().saturating_add(recorded);
        hint.set_lower(lower);
        // `upper >= lower` always holds for a valid source hint; checked anyway, as
        // `set_upper` panics otherwise.
        if let Some(upper) = rest.upper().and_then(|upper| upper.checked_add(recorded))
            && upper >= lower
        {
            hint.set_upper(upper);
        }
        hint
    }

    pub(super) fn is_end_stream(&self, cursor: &Cursor) -> bool {
        if cursor.done {
            return true;
        }
        if self.excludes(cursor).is_some()
            || self.positions.next_chunk(cursor.slot) < self.record.end()
        {
            return false;
        }
        match (&self.end, &self.source) {
            (Some(SourceEnd::Eos), _) => true,
            (Some(SourceEnd::Trailers(_) | SourceEnd::Failed), _) => false,
            (None, Some(source)) => source.get().is_end_stream(),
            (None, None) => true,
        }
    }
}

impl<B> SourceState<B> {
    /// Whether `cursor` may no longer send the body, and why: the call is committed to
    /// another reader, and the record did not hold the whole body then. A body the record
    /// held whole when the call committed may be sent to the end by every reader: its
    /// request is complete, and a transport that saw it fail instead would reset its stream,
    /// which peers' rapid-reset guards count (see `crate::resets`). Its record is then kept
    /// until the last reader is dropped.
    pub(super) fn excludes(&self, cursor: &Cursor) -> Option<&Reason> {
        if self.kept {
            return None;
        }
        cursor.excluded(&self.commit)
    }

    /// Whether the record holds the whole body.
    pub(super) fn is_whole(&self) -> bool {
        matches!(self.end, Some(SourceEnd::Eos | SourceEnd::Trailers(_))) && !self.unrecorded
    }
}
