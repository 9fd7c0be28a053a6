//! The choice of an endpoint: power of two choices on load, among the ready endpoints a call
//! has not tried, leaving out the ejected ones, and weighing recent failures. The part of the
//! balancer that no tower piece does: tower's `p2c::Balance` picks before it sees the request.

use rand::Rng;

use crate::metadata::BackendId;

/// The ready endpoints as the picker sees them, by index in `0..len`.
pub(crate) trait Candidates {
    /// The load measure: lower is better.
    type Load: PartialOrd;

    /// How many endpoints are ready.
    fn len(&self) -> usize;

    /// The id of endpoint `index`.
    fn id(&self, index: usize) -> BackendId;

    /// The load of endpoint `index`.
    fn load(&self, index: usize) -> Self::Load;

    /// Whether some endpoint may be ejected: when false, [`ejected`](Self::ejected) is not
    /// asked.
    fn any_ejected(&self) -> bool {
        false
    }

    /// Whether endpoint `index` is out of rotation (outlier detection).
    fn ejected(&self, _index: usize) -> bool {
        false
    }

    /// The weight of endpoint `index` in a draw it wins on load, in (0, 1]: 1 without recent
    /// failures.
    fn weight(&self, _index: usize) -> f64 {
        1.0
    }
}

/// Picks a ready endpoint by index: of two drawn at random, the one with the lower load (the
/// first drawn on a tie) — which keeps the pick with probability `w / w'` when its weight `w`
/// is below the other's `w'`, and else leaves it to the other. Ejected endpoints are not drawn
/// while another is ready; among the rest, only endpoints whose id is not in `tried` are drawn,
/// or all of them when each was tried — but a `hedge` whose call tried each one in rotation
/// goes to an ejected one it has not tried, if one is ready. `None` when no endpoint is ready.
pub(crate) fn pick<C: Candidates>(
    candidates: &C,
    tried: &[BackendId],
    hedge: bool,
    rng: &mut impl Rng,
) -> Option<usize> {
    let len = candidates.len();
    if len == 0 {
        return None;
    }
    // In rotation: the endpoints not ejected, or every ready one when all are.
    let any_ejected = candidates.any_ejected();
    let in_rotation_count = if any_ejected {
        (0..len).filter(|&i| !candidates.ejected(i)).count()
    } else {
        len
    };
    let every_one = in_rotation_count == 0 || in_rotation_count == len;
    let in_rotation = |index: usize| every_one || !candidates.ejected(index);
    let rotation = if every_one { len } else { in_rotation_count };

    let untried = |index: usize| !tried.contains(&candidates.id(index));
    let fresh = if tried.is_empty() {
        rotation
    } else {
        (0..len).filter(|&i| in_rotation(i) && untried(i)).count()
    };
    // A hedge runs beside its call's earlier attempts: a backend it tried is one they hold,
    // where a second attempt buys nothing. So when the call tried every endpoint in rotation,
    // a hedge goes to an ejected one it has not tried. A retry follows failures: the backends
    // in rotation it tried are still better bets than one ejected for failing.
    let ejected_fresh = if hedge && fresh == 0 && !every_one {
        (0..len).filter(|&i| !in_rotation(i) && untried(i)).count()
    } else {
        0
    };
    // The pool: the untried endpoints in rotation if some but not all are; else, for a hedge,
    // the untried ejected ones if any; else every one in rotation.
    let only_untried = fresh != rotation && fresh != 0;
    let pool = if only_untried {
        fresh
    } else if ejected_fresh > 0 {
        ejected_fresh
    } else {
        rotation
    };
    let in_pool = |index: usize| {
        if ejected_fresh > 0 {
            !in_rotation(index) && untried(index)
        } else {
            in_rotation(index) && (!only_untried || untried(index))
        }
    };
    let nth = |n: usize| {
        if pool == len {
            n
        } else {
            (0..len)
                .filter(|&i| in_pool(i))
                .nth(n)
                .expect("n is below the count of the pool")
        }
    };
    if pool == 1 {
        return Some(nth(0));
    }
    // Two distinct ranks, uniformly.
    let a = rng.random_range(0..pool);
    let mut b = rng.random_range(0..pool - 1);
    if b >= a {
        b += 1;
    }
    let (a, b) = (nth(a), nth(b));
    let (winner, other) = if candidates.load(a) <= candidates.load(b) {
        (a, b)
    } else {
        (b, a)
    };
    let (kept, other_weight) = (candidates.weight(winner), candidates.weight(other));
    if kept < other_weight && rng.random::<f64>() * other_weight >= kept {
        Some(other)
    } else {
        Some(winner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    /// Endpoints with these loads; endpoint `i` has the id of key `i`.
    struct Loads(Vec<u32>);

    impl Candidates for Loads {
        type Load = u32;

        fn len(&self) -> usize {
            self.0.len()
        }

        fn id(&self, index: usize) -> BackendId {
            BackendId::of(&index)
        }

        fn load(&self, index: usize) -> u32 {
            self.0[index]
        }
    }

    /// Endpoints with loads, ejected flags and weights.
    struct Known {
        loads: Vec<u32>,
        ejected: Vec<bool>,
        weights: Vec<f64>,
    }

    impl Known {
        fn new(loads: &[u32]) -> Known {
            Known {
                loads: loads.to_vec(),
                ejected: vec![false; loads.len()],
                weights: vec![1.0; loads.len()],
            }
        }

        fn ejected(mut self, indices: &[usize]) -> Known {
            for &i in indices {
                self.ejected[i] = true;
            }
            self
        }

        fn weight(mut self, index: usize, weight: f64) -> Known {
            self.weights[index] = weight;
            self
        }

        fn counts(&self, tried: &[BackendId], draws: usize, seed: u64) -> Vec<usize> {
            self.counts_of(tried, false, draws, seed)
        }

        fn hedge_counts(&self, tried: &[BackendId], draws: usize, seed: u64) -> Vec<usize> {
            self.counts_of(tried, true, draws, seed)
        }

        fn counts_of(
            &self,
            tried: &[BackendId],
            hedge: bool,
            draws: usize,
            seed: u64,
        ) -> Vec<usize> {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut counts = vec![0; self.loads.len()];
            for _ in 0..draws {
                counts[pick(self, tried, hedge, &mut rng).expect("a ready endpoint")] += 1;
            }
            counts
        }
    }

    impl Candidates for Known {
        type Load = u32;

        fn len(&self) -> usize {
            self.loads.len()
        }

        fn id(&self, index: usize) -> BackendId {
            BackendId::of(&index)
        }

        fn load(&self, index: usize) -> u32 {
            self.loads[index]
        }

        fn any_ejected(&self) -> bool {
            self.ejected.contains(&true)
        }

        fn ejected(&self, index: usize) -> bool {
            self.ejected[index]
        }

        fn weight(&self, index: usize) -> f64 {
            self.weights[index]
        }
    }

    fn ids(indices: impl IntoIterator<Item = usize>) -> Vec<BackendId> {
        indices.into_iter().map(|i| BackendId::of(&i)).collect()
    }

    /// How often each endpoint is picked in `draws` picks.
    fn counts(candidates: &Loads, tried: &[BackendId], draws: usize, seed: u64) -> Vec<usize> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut counts = vec![0; candidates.len()];
        for _ in 0..draws {
            let index = pick(candidates, tried, false, &mut rng).expect("a ready endpoint");
            counts[index] += 1;
        }
        counts
    }

    #[test]
    fn nothing_ready_picks_nothing() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(pick(&Loads(vec![]), &[], false, &mut rng), None);
        assert_eq!(pick(&Loads(vec![]), &ids([0]), true, &mut rng), None);
    }

    #[test]
    fn tried_endpoints_are_never_picked_while_another_is_ready() {
        // Every subset of 5 endpoints, but the full one, as the tried set; the tried ones
        // carry the lowest loads, so that power of two choices would favour them.
        let loads = Loads(vec![0, 1, 2, 3, 4]);
        for mask in 0u32..(1 << 5) - 1 {
            let tried = ids((0..5).filter(|i| mask & (1 << i) != 0));
            let counts = counts(&loads, &tried, 2_000, u64::from(mask));
            for (index, count) in counts.iter().enumerate() {
                let was_tried = mask & (1 << index) != 0;
                if was_tried {
                    assert_eq!(*count, 0, "tried endpoint {index} picked, mask {mask:05b}");
                }
            }
            // Each untried endpoint but the most loaded one of them can win a draw.
            let untried: Vec<usize> = (0..5).filter(|i| mask & (1 << i) == 0).collect();
            for &index in &untried[..untried.len().saturating_sub(1).max(1)] {
                assert!(
                    counts[index] > 0,
                    "endpoint {index} never picked, mask {mask:05b}"
                );
            }
        }
    }

    #[test]
    fn when_every_endpoint_was_tried_all_are_drawn() {
        let loads = Loads(vec![0, 0, 0, 0]);
        let counts = counts(&loads, &ids(0..4), 4_000, 7);
        for (index, count) in counts.iter().enumerate() {
            // Equal loads: a uniform pick, 1000 each on average.
            assert!((800..1200).contains(count), "endpoint {index}: {count}");
        }
    }

    #[test]
    fn when_every_endpoint_was_tried_the_load_still_counts() {
        // Distinct loads: the most loaded endpoint never wins a draw of two.
        let loads = Loads(vec![3, 1, 2]);
        let counts = counts(&loads, &ids([0, 1, 2]), 3_000, 3);
        assert_eq!(counts[0], 0);
        assert!(counts[1] > counts[2] && counts[2] > 0, "{counts:?}");
    }

    #[test]
    fn the_less_loaded_of_two_untried_endpoints_wins() {
        // Two untried endpoints are always the two drawn: the lighter one wins every time,
        // although the tried endpoint is lighter still.
        let loads = Loads(vec![0, 5, 2]);
        let counts = counts(&loads, &ids([0]), 1_000, 5);
        assert_eq!(counts, vec![0, 0, 1_000]);
    }

    #[test]
    fn the_only_untried_endpoint_is_picked_whatever_its_load() {
        let loads = Loads(vec![0, 0, 100]);
        let counts = counts(&loads, &ids([1, 0]), 500, 9);
        assert_eq!(counts, vec![0, 0, 500]);
    }

    #[test]
    fn tried_ids_of_endpoints_no_longer_ready_are_ignored() {
        // Keys 7 and 8 were tried but are not among the ready endpoints.
        let loads = Loads(vec![0, 0]);
        let counts_7_8 = counts(&loads, &ids([7, 8]), 2_000, 11);
        assert!(counts_7_8.iter().all(|&c| c > 800), "{counts_7_8:?}");
        let counts_7_0_8 = counts(&loads, &ids([7, 0, 8]), 2_000, 13);
        assert_eq!(counts_7_0_8, vec![0, 2_000]);
    }

    #[test]
    fn without_a_record_the_pick_is_power_of_two_choices() {
        // Each draw is of two distinct endpoints: the heaviest never wins, the lightest wins
        // every draw it is in (2 of the 3 pairs), the middle one the remaining third.
        let loads = Loads(vec![1, 2, 3]);
        let counts = counts(&loads, &[], 3_000, 17);
        assert_eq!(counts[2], 0);
        assert!((1_800..2_200).contains(&counts[0]), "{counts:?}");
        assert!((800..1_200).contains(&counts[1]), "{counts:?}");
    }

    #[test]
    fn ejected_endpoints_are_not_drawn_while_another_is_ready() {
        // The ejected endpoint is the lightest: it would win every draw it is in.
        let known = Known::new(&[0, 5, 5]).ejected(&[0]);
        let counts = known.counts(&[], 2_000, 21);
        assert_eq!(counts[0], 0);
        assert!(counts[1] > 800 && counts[2] > 800, "{counts:?}");
        // A retry that tried 1 goes to 2, never back to the ejected 0.
        assert_eq!(known.counts(&ids([1]), 500, 22), vec![0, 0, 500]);
        // Every endpoint in rotation tried: among those in rotation, still not the ejected.
        let counts = known.counts(&ids([1, 2]), 1_000, 23);
        assert_eq!(counts[0], 0, "{counts:?}");
        // Every ready endpoint ejected: all of them are drawn rather than none.
        let all = Known::new(&[0, 0]).ejected(&[0, 1]);
        let counts = all.counts(&[], 1_000, 24);
        assert!(counts.iter().all(|&c| c > 300), "{counts:?}");
    }

    #[test]
    fn a_hedge_goes_to_an_ejected_endpoint_rather_than_to_one_its_call_tried() {
        // Issue 30: the call tried 1 and 2, every endpoint in rotation; 0 is ejected (the
        // lightest, so load alone would not explain the picks).
        let known = Known::new(&[0, 5, 5]).ejected(&[0]);
        assert_eq!(known.hedge_counts(&ids([1, 2]), 500, 51), vec![500, 0, 0]);
        // A retry still goes back to those in rotation.
        assert_eq!(known.counts(&ids([1, 2]), 500, 52)[0], 0);
        // An untried endpoint in rotation comes first.
        assert_eq!(known.hedge_counts(&ids([1]), 500, 53), vec![0, 0, 500]);
        // Every endpoint tried, the ejected one too: among those in rotation, as before.
        let counts = known.hedge_counts(&ids([0, 1, 2]), 1_000, 54);
        assert_eq!(counts[0], 0, "{counts:?}");
        // Several untried ejected endpoints: drawn among them.
        let two = Known::new(&[0, 0, 5, 5]).ejected(&[0, 1]);
        let counts = two.hedge_counts(&ids([2, 3]), 1_000, 55);
        assert!(counts[0] > 300 && counts[1] > 300, "{counts:?}");
        assert_eq!(counts[2] + counts[3], 0, "{counts:?}");
    }

    #[test]
    fn recent_failures_cost_a_backend_the_draws_it_wins_on_load() {
        // Endpoint 0 fails fast, so it is the least loaded: unweighted, it wins every draw it
        // is in (two of three). At weight 1/36 (five failures, no success), it keeps 1/36 of
        // them: about 37 of 2 000 draws.
        let weighed = Known::new(&[0, 3, 3]).weight(0, 1.0 / 36.0);
        let counts = weighed.counts(&[], 2_000, 31);
        assert!((15..70).contains(&counts[0]), "{counts:?}");
        let unweighed = Known::new(&[0, 3, 3]).counts(&[], 3_000, 31);
        assert!((1_850..2_150).contains(&unweighed[0]), "{unweighed:?}");
        // Weight 1/4 against 1: a quarter of the draws it wins.
        let quarter = Known::new(&[0, 3, 3])
            .weight(0, 0.25)
            .counts(&[], 4_000, 32);
        let expected = 4_000.0 * 2.0 / 3.0 / 4.0;
        assert!(
            (quarter[0] as f64 - expected).abs() < expected * 0.15,
            "{quarter:?}"
        );
        // Weight 1/2 against 1, the lighter of two: half the draws.
        let lighter = Known::new(&[3, 0]).weight(0, 1.0).weight(1, 0.5);
        let counts = lighter.counts(&[], 2_000, 33);
        assert!((850..1_150).contains(&counts[1]), "{counts:?}");
        // Equal weights draw no extra number: the same picks as without weights.
        let plain = Loads(vec![1, 2, 3]);
        let equal = Known::new(&[1, 2, 3])
            .weight(0, 0.5)
            .weight(1, 0.5)
            .weight(2, 0.5);
        assert_eq!(counts_of(&plain, 300, 41), equal.counts(&[], 300, 41));
    }

    fn counts_of(candidates: &Loads, draws: usize, seed: u64) -> Vec<usize> {
        counts(candidates, &[], draws, seed)
    }
}
