//! The attempts of a call in flight, each with the body reader it sends.

use smallvec::SmallVec;

use super::AttemptId;

/// The attempts in flight. One is held inline: a retried call has one at a time, and a
/// hedged call's second attempt allocates its future anyway.
#[derive(Debug)]
pub(super) struct Live(SmallVec<[(AttemptId, u64); 1]>);

impl Live {
    /// The first attempt, sending body reader `reader`.
    pub(super) fn first(reader: u64) -> Live {
        let mut live = SmallVec::new();
        live.push((AttemptId::FIRST, reader));
        Live(live)
    }

    pub(super) fn push(&mut self, id: AttemptId, reader: u64) {
        self.0.push((id, reader));
    }

    pub(super) fn contains(&self, id: AttemptId) -> bool {
        self.0.iter().any(|(a, _)| *a == id)
    }

    pub(super) fn contains_send(&self, send: u32) -> bool {
        self.0.iter().any(|(a, _)| a.send == send)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes attempt `id` out, giving its reader; `None` if it was not in flight.
    pub(super) fn remove(&mut self, id: AttemptId) -> Option<u64> {
        let i = self.0.iter().position(|(a, _)| *a == id)?;
        Some(self.0.remove(i).1)
    }

    /// The attempt that sends body reader `reader`, if one in flight does.
    pub(super) fn holding(&self, reader: u64) -> Option<AttemptId> {
        self.0.iter().find(|(_, r)| *r == reader).map(|(a, _)| *a)
    }

    /// Keeps the attempts `keep` picks; tells whether any left.
    pub(super) fn retain(&mut self, keep: impl Fn(AttemptId) -> bool) -> bool {
        let before = self.0.len();
        self.0.retain(|(a, _)| keep(*a));
        self.0.len() != before
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}
