//! The record a [`ReplayBody`](super::ReplayBody) keeps of what its source sent, and the
//! byte limits that bound it.

use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The per-call limit used by [`BufferLimits::default`]: 256 KiB, as in grpc-go and C-core.
const DEFAULT_PER_CALL: usize = 256 * 1024;
/// The total budget used by [`BufferLimits::default`]: 16 MiB, as grpc-java's per-channel limit.
const DEFAULT_TOTAL: usize = 16 * 1024 * 1024;

/// Per-call and total limits on the bytes recorded for replay.
///
/// gRFC A6 asks for two limits: one per call (`per_rpc_buffer_limit_in_bytes`), so that one
/// large call cannot take the whole budget, and one total (`retry_buffer_size_in_bytes`)
/// shared by every call. Cloning a `BufferLimits` shares the total budget: give one value (or
/// clones of it) to every [`ReplayBody`](super::ReplayBody) of a layer. Bytes are counted
/// exactly, chunk by chunk, and returned to the budget as soon as a record is freed.
///
/// ```
/// use tower_retry_hedge::body::BufferLimits;
///
/// let limits = BufferLimits::default();
/// assert_eq!(limits.per_call(), 256 * 1024);
/// assert_eq!(limits.total(), 16 * 1024 * 1024);
/// assert_eq!(limits.in_use(), 0);
///
/// let small = BufferLimits::new(4096, 64 * 1024);
/// let shared = small.clone(); // the same 64 KiB budget
/// assert_eq!(shared.total(), 64 * 1024);
/// ```
#[derive(Clone, Debug)]
pub struct BufferLimits {
    per_call: usize,
    budget: Arc<Budget>,
}

/// The total budget shared by every clone of a [`BufferLimits`].
#[derive(Debug)]
struct Budget {
    total: usize,
    in_use: AtomicUsize,
}

impl BufferLimits {
    /// Limits of `per_call` bytes for any one call and `total` bytes for all calls sharing
    /// the returned value (and its clones).
    ///
    /// Either may be 0: a limit of 0 records nothing, so any body with data is committed to
    /// its first attempt as soon as it sends a byte.
    pub fn new(per_call: usize, total: usize) -> BufferLimits {
        BufferLimits {
            per_call,
            budget: Arc::new(Budget {
                total,
                in_use: AtomicUsize::new(0),
            }),
        }
    }

    /// The most bytes any one call may record.
    pub fn per_call(&self) -> usize {
        self.per_call
    }

    /// The most bytes all calls sharing this budget may record together.
    pub fn total(&self) -> usize {
        self.budget.total
    }

    /// The bytes currently recorded by all calls sharing this budget.
    pub fn in_use(&self) -> usize {
        self.budget.in_use.load(Ordering::Acquire)
    }

    /// What the total budget has left.
    pub(super) fn available(&self) -> usize {
        self.budget.total.saturating_sub(self.in_use())
    }

    /// Takes `len` bytes from the total budget, or nothing if fewer than `len` are left.
    fn try_reserve(&self, len: usize) -> bool {
        let total = self.budget.total;
        // A compare-and-swap loop rather than add-then-undo, so that a call that does not fit
        // never pushes `in_use` over `total`, not even for a moment another call could see.
        self.budget
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                in_use.checked_add(len).filter(|&sum| sum <= total)
            })
            .is_ok()
    }

    /// Gives `len` bytes back to the total budget.
    fn release(&self, len: usize) {
        if len == 0 {
            return;
        }
        // Saturating so that a bookkeeping mistake could only under-count, never wrap.
        let _ = self
            .budget
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                Some(in_use.saturating_sub(len))
            });
    }
}

impl Default for BufferLimits {
    /// 256 KiB per call, 16 MiB in total.
    fn default() -> BufferLimits {
        BufferLimits::new(DEFAULT_PER_CALL, DEFAULT_TOTAL)
    }
}

/// Which limit a chunk would have crossed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Overflow {
    /// The call would hold more than the per-call limit.
    PerCall,
    /// The calls sharing the budget would hold more than the total.
    Total,
}

/// The chunks a source has sent so far, as the `Bytes` it sent them in (no copies).
///
/// Chunks are numbered from 0 in the order they were recorded; a reader's position is the
/// number of the next chunk it will send. Chunks can be freed from the front (once the call
/// is committed to one reader), so `first` is the number of the oldest chunk still held.
#[derive(Debug)]
pub(super) struct Record {
    chunks: Chunks,
    /// The number of the oldest chunk held.
    first: usize,
    /// Bytes ever recorded by this call: the byte offset in the body of the end of the last
    /// recorded chunk.
    recorded: usize,
    /// What the call has charged against the per-call limit: the bytes recorded, and
    /// `overhead` for each chunk.
    charged: usize,
    /// What a chunk costs beyond its bytes (see [`Record::charge_per_chunk`]).
    overhead: usize,
    /// What the chunks held cost, all of it reserved from the budget.
    held: usize,
    limits: BufferLimits,
}

/// The chunks held, oldest first. Most request bodies (a unary gRPC message, a buffered
/// HTTP body) are one chunk: that one is held inline, so that recording it allocates nothing.
#[derive(Debug, Default)]
struct Chunks {
    /// The oldest chunk, unless it has been freed: then every chunk is in `rest`.
    head: Option<Bytes>,
    rest: VecDeque<Bytes>,
}

impl Chunks {
    fn len(&self) -> usize {
        usize::from(self.head.is_some()).saturating_add(self.rest.len())
    }

    fn get(&self, index: usize) -> Option<&Bytes> {
        match &self.head {
            Some(head) => match index.checked_sub(1) {
                None => Some(head),
                Some(index) => self.rest.get(index),
            },
            None => self.rest.get(index),
        }
    }

    fn push_back(&mut self, chunk: Bytes) {
        if self.head.is_none() && self.rest.is_empty() {
            self.head = Some(chunk);
        } else {
            self.rest.push_back(chunk);
        }
    }

    fn pop_front(&mut self) -> Option<Bytes> {
        self.head.take().or_else(|| self.rest.pop_front())
    }
}

impl Record {
    pub(super) fn new(limits: BufferLimits) -> Record {
        Record {
            chunks: Chunks::default(),
            first: 0,
            recorded: 0,
            charged: 0,
            overhead: 0,
            held: 0,
            limits,
        }
    }

    /// Charges every chunk recorded from now on `overhead` beside its bytes, so that the
    /// limits bound a record of many small chunks (empty messages, each one a chunk) as well
    /// as a record of many bytes.
    #[cfg(feature = "grpc")]
    pub(super) fn charge_per_chunk(&mut self, overhead: usize) {
        self.overhead = overhead;
    }

    /// The number the next recorded chunk will get.
    pub(super) fn end(&self) -> usize {
        self.first.saturating_add(self.chunks.len())
    }

    /// The byte offset in the body just past the last recorded chunk.
    pub(super) fn end_offset(&self) -> u64 {
        u64::try_from(self.recorded).unwrap_or(u64::MAX)
    }

    /// The chunk numbered `index`, if it is still held.
    pub(super) fn get(&self, index: usize) -> Option<&Bytes> {
        index
            .checked_sub(self.first)
            .and_then(|i| self.chunks.get(i))
    }

    /// What the chunks held cost (reserved from the budget).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Records `chunk` if both limits allow it; otherwise records nothing.
    pub(super) fn try_push(&mut self, chunk: &Bytes) -> Result<(), Overflow> {
        let len = chunk.len();
        let cost = len.saturating_add(self.overhead);
        let charged = match self.charged.checked_add(cost) {
            Some(charged) if charged <= self.limits.per_call => charged,
            _ => return Err(Overflow::PerCall),
        };
        if !self.limits.try_reserve(cost) {
            return Err(Overflow::Total);
        }
        self.charged = charged;
        // `recorded <= charged` and `held <= charged`, so these cannot overflow either.
        self.recorded = self.recorded.saturating_add(len);
        self.held = self.held.saturating_add(cost);
        self.chunks.push_back(chunk.clone());
        Ok(())
    }

    /// Frees every chunk numbered below `index` and gives its bytes back to the budget.
    pub(super) fn free_before(&mut self, index: usize) {
        let mut freed = 0usize;
        while self.first < index {
            match self.chunks.pop_front() {
                Some(chunk) => {
                    freed = freed.saturating_add(chunk.len().saturating_add(self.overhead));
                    self.first = self.first.saturating_add(1);
                }
                None => break,
            }
        }
        self.give_back(freed);
    }

    /// Frees every chunk and gives their bytes back to the budget. Chunk numbers stay as
    /// they were, so a reader past the end stays past the end.
    pub(super) fn free_all(&mut self) {
        self.first = self.end();
        self.chunks = Chunks::default();
        let held = self.held;
        self.give_back(held);
    }

    fn give_back(&mut self, len: usize) {
        self.held = self.held.saturating_sub(len);
        self.limits.release(len);
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.limits.release(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_follow_grpc() {
        let limits = BufferLimits::default();
        assert_eq!(limits.per_call(), 256 * 1024);
        assert_eq!(limits.total(), 16 * 1024 * 1024);
        assert_eq!(limits.in_use(), 0);
        assert_eq!(limits.available(), 16 * 1024 * 1024);
    }

    #[test]
    fn reserve_is_exact_and_never_overshoots() {
        let limits = BufferLimits::new(100, 10);
        assert!(limits.try_reserve(10));
        assert!(!limits.try_reserve(1));
        assert_eq!(limits.in_use(), 10);
        limits.release(4);
        assert_eq!(limits.available(), 4);
        assert!(!limits.try_reserve(5));
        assert!(limits.try_reserve(4));
        limits.release(100); // saturates rather than wrapping
        assert_eq!(limits.in_use(), 0);
        assert!(!limits.try_reserve(usize::MAX));
    }

    #[test]
    fn record_counts_per_call_limit_exactly() {
        let limits = BufferLimits::new(5, 100);
        let mut record = Record::new(limits.clone());
        assert_eq!(record.try_push(&Bytes::from_static(b"abc")), Ok(()));
        assert_eq!(record.try_push(&Bytes::from_static(b"de")), Ok(()));
        assert_eq!(
            record.try_push(&Bytes::from_static(b"f")),
            Err(Overflow::PerCall)
        );
        assert_eq!(record.try_push(&Bytes::new()), Ok(()));
        assert_eq!(record.end(), 3);
        assert_eq!(record.end_offset(), 5);
        assert_eq!(limits.in_use(), 5);
        drop(record);
        assert_eq!(limits.in_use(), 0);
    }

    #[test]
    fn record_reports_the_total_budget() {
        let limits = BufferLimits::new(100, 4);
        let mut first = Record::new(limits.clone());
        let mut second = Record::new(limits.clone());
        assert_eq!(first.try_push(&Bytes::from_static(b"abc")), Ok(()));
        assert_eq!(
            second.try_push(&Bytes::from_static(b"de")),
            Err(Overflow::Total)
        );
        assert_eq!(second.try_push(&Bytes::from_static(b"d")), Ok(()));
        assert_eq!(limits.in_use(), 4);
        first.free_all();
        assert_eq!(limits.in_use(), 1);
        assert_eq!(first.held(), 0);
    }

    #[test]
    fn a_single_chunk_is_held_inline_and_order_is_kept_around_it() {
        let limits = BufferLimits::new(100, 100);
        let mut record = Record::new(limits.clone());
        assert_eq!(record.try_push(&Bytes::from_static(b"a")), Ok(()));
        assert_eq!(
            record.chunks.rest.capacity(),
            0,
            "one chunk allocates nothing"
        );
        assert_eq!(record.try_push(&Bytes::from_static(b"bb")), Ok(()));
        record.free_before(1);
        assert_eq!(record.try_push(&Bytes::from_static(b"ccc")), Ok(()));
        assert_eq!(record.get(0), None);
        assert_eq!(record.get(1).map(|b| &b[..]), Some(&b"bb"[..]));
        assert_eq!(record.get(2).map(|b| &b[..]), Some(&b"ccc"[..]));
        assert_eq!(record.get(3), None);
        assert_eq!((record.end(), record.end_offset()), (3, 6));
        assert_eq!(limits.in_use(), 5);
        record.free_before(3);
        assert_eq!(limits.in_use(), 0);
        // Emptied, the record holds the next chunk inline again.
        assert_eq!(record.try_push(&Bytes::from_static(b"d")), Ok(()));
        assert_eq!(record.get(3).map(|b| &b[..]), Some(&b"d"[..]));
        assert_eq!(record.end(), 4);
    }

    #[test]
    fn freeing_keeps_chunk_numbers() {
        let limits = BufferLimits::new(100, 100);
        let mut record = Record::new(limits.clone());
        for chunk in [&b"a"[..], b"bb", b"ccc"] {
            assert_eq!(record.try_push(&Bytes::copy_from_slice(chunk)), Ok(()));
        }
        record.free_before(2);
        assert_eq!(record.get(0), None);
        assert_eq!(record.get(1), None);
        assert_eq!(record.get(2).map(|b| &b[..]), Some(&b"ccc"[..]));
        assert_eq!(record.end(), 3);
        assert_eq!(limits.in_use(), 3);
        record.free_before(usize::MAX);
        assert_eq!(record.end(), 3);
        assert_eq!(limits.in_use(), 0);
        record.free_all();
        assert_eq!(record.end(), 3);
        assert_eq!(record.get(3), None);
    }
}
