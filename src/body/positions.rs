//! Where each live reader of a [`ReplayBody`](super::ReplayBody) is in the record.
//!
//! A commit can be made from any clone (the layers keep a never-polled template and commit
//! from it), and must free at once every chunk the chosen reader has already sent; so each
//! reader's position lives in the shared state, not only in the reader.

/// Slots held inline: the template and the first attempt of most calls, so that a call with
/// one attempt at a time allocates nothing here.
const INLINE: usize = 2;

/// The live readers of one body, each with the number of the next recorded chunk it sends.
///
/// A reader takes a slot when it is made and gives it back when it is dropped. A slot never
/// moves, so a reader reaches its own entry by index, without a search; freed slots are
/// reused, so the table is bounded by the number of readers alive at once.
#[derive(Debug, Default)]
pub(super) struct Positions {
    inline: [Option<Position>; INLINE],
    more: Vec<Option<Position>>,
}

#[derive(Clone, Copy, Debug)]
struct Position {
    reader: u64,
    next_chunk: usize,
}

impl Positions {
    /// Adds `reader`, at the start of the body; returns its slot.
    pub(super) fn insert(&mut self, reader: u64) -> usize {
        let position = Some(Position {
            reader,
            next_chunk: 0,
        });
        let free = self
            .inline
            .iter_mut()
            .chain(self.more.iter_mut())
            .position(|slot| slot.is_none());
        match free {
            Some(slot) => {
                if let Some(entry) = self.slot_mut(slot) {
                    *entry = position;
                }
                slot
            }
            None => {
                let slot = INLINE.saturating_add(self.more.len());
                self.more.push(position);
                slot
            }
        }
    }

    /// Forgets the reader in `slot` (it was dropped).
    pub(super) fn remove(&mut self, slot: usize) {
        if let Some(entry) = self.slot_mut(slot) {
            *entry = None;
        }
    }

    /// The next chunk the reader in `slot` sends.
    pub(super) fn next_chunk(&self, slot: usize) -> usize {
        let entry = match slot.checked_sub(INLINE) {
            None => self.inline.get(slot),
            Some(slot) => self.more.get(slot),
        };
        entry
            .and_then(|entry| entry.as_ref())
            .map_or(0, |p| p.next_chunk)
    }

    /// Moves the reader in `slot` to `next_chunk`.
    pub(super) fn set_next_chunk(&mut self, slot: usize, next_chunk: usize) {
        if let Some(Some(position)) = self.slot_mut(slot) {
            position.next_chunk = next_chunk;
        }
    }

    /// The next chunk `reader` sends, if it is alive.
    pub(super) fn of(&self, reader: u64) -> Option<usize> {
        self.inline
            .iter()
            .chain(&self.more)
            .flatten()
            .find(|position| position.reader == reader)
            .map(|position| position.next_chunk)
    }

    fn slot_mut(&mut self, slot: usize) -> Option<&mut Option<Position>> {
        match slot.checked_sub(INLINE) {
            None => self.inline.get_mut(slot),
            Some(slot) => self.more.get_mut(slot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_never_move() {
        let mut positions = Positions::default();
        let template = positions.insert(0);
        let first = positions.insert(1);
        assert_eq!((template, first), (0, 1));
        assert_eq!(positions.more.capacity(), 0, "two readers allocate nothing");

        let second = positions.insert(2);
        positions.set_next_chunk(second, 7);
        positions.set_next_chunk(first, 3);
        positions.remove(first);
        assert_eq!(positions.of(1), None);
        assert_eq!(positions.of(2), Some(7));

        let third = positions.insert(3);
        assert_eq!(third, first, "a freed slot is taken again");
        assert_eq!(positions.of(3), Some(0));
        assert_eq!(positions.next_chunk(second), 7);
        assert_eq!(positions.next_chunk(third), 0);
        assert_eq!(positions.insert(4), 3);
    }

    #[test]
    fn unknown_slots_and_readers_are_harmless() {
        let mut positions = Positions::default();
        positions.set_next_chunk(9, 1);
        positions.remove(9);
        assert_eq!(positions.next_chunk(9), 0);
        assert_eq!(positions.of(0), None);
    }
}
