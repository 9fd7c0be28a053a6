//! A sliding time window of rotating slots, shared by the adaptive hedge delay and the retry
//! budget.

use std::time::Duration;

use tokio::time::Instant;

/// `N` slots covering a window: new samples go to the current slot, and as time passes the
/// oldest slot is cleared and becomes the current one. Memory is fixed whatever the rate.
#[derive(Debug)]
pub(crate) struct Slots<T, const N: usize> {
    slots: [T; N],
    current: usize,
    slot_started: Instant,
    slot_len: Duration,
}

impl<T: Default, const N: usize> Slots<T, N> {
    /// A window of `window`, split into `N` slots, starting now.
    pub(crate) fn new(window: Duration, now: Instant) -> Self {
        Slots {
            slots: std::array::from_fn(|_| T::default()),
            current: 0,
            slot_started: now,
            slot_len: window / N as u32,
        }
    }

    /// Clears the slots that time has passed by, and returns the current one.
    pub(crate) fn current(&mut self, now: Instant) -> &mut T {
        let mut steps = 0;
        while now.saturating_duration_since(self.slot_started) >= self.slot_len && steps <= N {
            self.current = (self.current + 1) % N;
            self.slots[self.current] = T::default();
            self.slot_started += self.slot_len;
            steps += 1;
        }
        if steps > N {
            // Idle for longer than the window: every slot is clear; restart the clock.
            self.slot_started = now;
        }
        &mut self.slots[self.current]
    }

    /// Every slot of the window, as of the last [`current`](Slots::current).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_rotate_and_age_out() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut window: Slots<u32, 4> = Slots::new(4 * second, start);
        *window.current(start) += 1;
        *window.current(start + second) += 10;
        assert_eq!(window.iter().sum::<u32>(), 11);
        // Four seconds on, the first slot is reused and cleared.
        *window.current(start + 4 * second) += 100;
        assert_eq!(window.iter().sum::<u32>(), 110);
        // Idle for longer than the window: everything is gone.
        window.current(start + 60 * second);
        assert_eq!(window.iter().sum::<u32>(), 0);
        *window.current(start + 60 * second) += 1;
        *window.current(start + 61 * second) += 1;
        assert_eq!(window.iter().sum::<u32>(), 2);
    }
}
