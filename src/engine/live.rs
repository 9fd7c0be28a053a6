//! The attempts of a call in flight, each with the body reader it sends.

use std::time::Instant;

use smallvec::SmallVec;

use super::AttemptId;

/// The attempts in flight. One is held inline: a retried call has one at a time, and a
/// hedged call's second attempt allocates its future anyway.
#[derive(Debug)]
pub(super) struct Live(SmallVec<[InFlight; 1]>);

/// One attempt in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) id: AttemptId,
    /// The body reader it sends.
    pub(super) reader: u64,
    /// When it went, for a call whose hedging delay learns from latencies.
    pub(super) sent_at: Option<Instant>,
}

impl Live {
    /// The first attempt, sending body reader `reader`.
    pub(super) fn first(reader: u64, sent_at: Option<Instant>) -> Live {
        let mut live = SmallVec::new();
        live.push(InFlight {
            id: AttemptId::FIRST,
            reader,
            sent_at,
        });
        Live(live)
    }

    pub(super) fn push(&mut self, attempt: InFlight) {
        self.0.push(attempt);
    }

    pub(super) fn contains(&self, id: AttemptId) -> bool {
        self.0.iter().any(|a| a.id == id)
    }

    #[cfg(test)]
    pub(super) fn contains_send(&self, send: u32) -> bool {
        self.0.iter().any(|a| a.id.send == send)
    }

    /// The one attempt in flight, if exactly one is.
    pub(super) fn single(&self) -> Option<AttemptId> {
        match self.0.as_slice() {
            [only] => Some(only.id),
            _ => None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes attempt `id` out; `None` if it was not in flight.
    pub(super) fn remove(&mut self, id: AttemptId) -> Option<InFlight> {
        let i = self.0.iter().position(|a| a.id == id)?;
        Some(self.0.remove(i))
    }

    /// The attempt that sends body reader `reader`, if one in flight does.
    pub(super) fn holding(&self, reader: u64) -> Option<AttemptId> {
        self.0.iter().find(|a| a.reader == reader).map(|a| a.id)
    }

    /// Keeps the attempts `keep` picks; tells whether any left.
    pub(super) fn retain(&mut self, keep: impl Fn(AttemptId) -> bool) -> bool {
        let before = self.0.len();
        self.0.retain(|a| keep(a.id));
        self.0.len() != before
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}
