//! The gRFC A6 retry throttle: the sequences gRPC C-core produces, thread safety, and the
//! per-authority registry.

use std::sync::{Arc, Barrier};
use std::thread;

use tower_retry_hedge::throttle::{RetryThrottle, Throttle, ThrottleRegistry};

/// Plays one call with `max_attempts` whose every attempt fails, as the retry layer does:
/// the first attempt is always sent; after each failed attempt the throttle is debited, and
/// a retry follows only if the throttle allows one and attempts remain. Returns how many
/// attempts the call made.
fn failing_call(throttle: &dyn RetryThrottle, max_attempts: u32) -> u32 {
    throttle.on_call();
    let mut attempts = 1;
    loop {
        throttle.on_failure();
        if attempts < max_attempts && throttle.allows_retry() {
            attempts += 1;
        } else {
            return attempts;
        }
    }
}

/// A plain sequential model of the A6 bucket in thousandths, for the concurrency tests.
struct Model {
    tokens: u32,
    max: u32,
    ratio: u32,
}

impl Model {
    fn of(throttle: &Throttle) -> Model {
        Model {
            tokens: throttle.tokens_milli(),
            max: throttle.max_tokens() * 1000,
            ratio: throttle.token_ratio_milli(),
        }
    }

    fn success(&mut self) {
        self.tokens = (self.tokens + self.ratio).min(self.max);
    }

    fn failure(&mut self) {
        self.tokens = self.tokens.saturating_sub(1000);
    }
}

#[test]
fn failing_calls_make_3_2_1_1_1_attempts() {
    // Measured on gRPC C-core with retryThrottling {maxTokens: 10, tokenRatio: 0.1} and
    // maxAttempts 3.
    let throttle = Throttle::new(10, 0.1).unwrap();
    let attempts: Vec<u32> = (0..10).map(|_| failing_call(&throttle, 3)).collect();
    assert_eq!(attempts, [3, 2, 1, 1, 1, 1, 1, 1, 1, 1]);
    assert_eq!(throttle.tokens_milli(), 0);

    let throttle = Throttle::new(10, 0.1).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..8 {
        failing_call(&throttle, 3);
        tokens.push(throttle.tokens());
    }
    assert_eq!(tokens, [7.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0, 0.0]);
}

#[test]
fn a_drained_bucket_needs_61_successes_before_a_retry() {
    for (successes, attempts) in [(60, 1), (61, 2)] {
        let throttle = Throttle::new(10, 0.1).unwrap();
        while throttle.tokens_milli() > 0 {
            failing_call(&throttle, 3);
        }
        for _ in 0..successes {
            throttle.on_success();
        }
        assert_eq!(
            failing_call(&throttle, 3),
            attempts,
            "after {successes} successes"
        );
    }
}

#[test]
fn first_attempts_are_never_throttled() {
    let throttle = Throttle::new(2, 0.001).unwrap();
    for _ in 0..100 {
        assert_eq!(failing_call(&throttle, 5), 1);
    }
    assert!(!throttle.allows_retry());
}

#[test]
fn ratio_past_three_decimals_is_dropped() {
    let throttle = Throttle::new(10, 0.5009).unwrap();
    assert_eq!(throttle.token_ratio(), 0.5);
    assert_eq!(throttle.token_ratio_milli(), 500);
    for _ in 0..10 {
        throttle.on_failure();
    }
    for _ in 0..11 {
        throttle.on_success();
    }
    // With 0.5009 applied exactly this would be 5.5099.
    assert_eq!(throttle.tokens_milli(), 5_500);
    assert!(throttle.allows_retry());
}

#[test]
fn max_tokens_bounds() {
    for max in [1, 2, 10, 999, 1000] {
        let throttle = Throttle::new(max, 0.1).unwrap();
        assert_eq!(throttle.max_tokens(), max);
        assert_eq!(throttle.tokens_milli(), max * 1000);
    }
    for max in [0, 1001, 10_000, u32::MAX] {
        let err = Throttle::new(max, 0.1).unwrap_err();
        assert_eq!(
            (err.field(), err.rule()),
            ("max_tokens", "must be an integer in (0, 1000]")
        );
    }
}

#[test]
fn invalid_ratios() {
    for ratio in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = Throttle::new(10, ratio).unwrap_err();
        assert_eq!(err.field(), "token_ratio");
        assert_eq!(err.rule(), "must be a finite number greater than 0");
    }
    for ratio in [0.0, -0.0, -0.5, -1000.0] {
        let err = Throttle::new(10, ratio).unwrap_err();
        assert_eq!(err.to_string(), "token_ratio: must be greater than 0");
    }
    for ratio in [0.0009, 0.000_999_999, 1e-9, f64::MIN_POSITIVE] {
        let err = Throttle::new(10, ratio).unwrap_err();
        assert_eq!(err.field(), "token_ratio");
        assert!(err.to_string().contains("rounds to zero"), "{err}");
    }
    let err: Box<dyn std::error::Error> = Box::new(Throttle::new(0, 0.1).unwrap_err());
    assert!(err.to_string().contains("max_tokens"));
}

#[test]
fn clones_share_tokens() {
    let throttle = Throttle::new(10, 0.1).unwrap();
    let clone = throttle.clone();
    clone.on_failure();
    assert_eq!(throttle.tokens_milli(), 9_000);
    throttle.on_success();
    assert_eq!(clone.tokens_milli(), 9_100);
}

#[test]
fn the_seam_is_object_safe_and_on_call_defaults_to_nothing() {
    #[derive(Debug)]
    struct Never;
    impl RetryThrottle for Never {
        fn on_success(&self) {}
        fn on_failure(&self) {}
        fn allows_retry(&self) -> bool {
            false
        }
    }

    let throttles: Vec<Arc<dyn RetryThrottle>> =
        vec![Arc::new(Never), Arc::new(Throttle::new(10, 0.1).unwrap())];
    let attempts: Vec<u32> = throttles.iter().map(|t| failing_call(t, 3)).collect();
    assert_eq!(attempts, [1, 3]);

    fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
    assert_shareable::<Throttle>();
    assert_shareable::<ThrottleRegistry>();
}

/// Runs `per_thread` on `threads` threads released together, so their updates interleave.
fn race(threads: usize, per_thread: impl Fn(usize) + Sync) {
    let barrier = Barrier::new(threads);
    thread::scope(|scope| {
        for id in 0..threads {
            let (barrier, per_thread) = (&barrier, &per_thread);
            scope.spawn(move || {
                barrier.wait();
                per_thread(id);
            });
        }
    });
}

#[test]
fn concurrent_failures_from_a_full_bucket() {
    // Failures only: each takes exactly 1 token until the floor, in any order. A bucket holds
    // at most 1000, so the race is run in rounds to give lost updates many chances to show.
    let throttle = Throttle::new(1000, 1.0).unwrap();
    for round in 0..50 {
        while throttle.tokens_milli() < 1_000_000 {
            throttle.on_success();
        }
        let mut model = Model::of(&throttle);
        race(8, |_| {
            for _ in 0..100 {
                throttle.on_failure();
                throttle.allows_retry();
            }
        });
        (0..800).for_each(|_| model.failure());
        assert_eq!(throttle.tokens_milli(), model.tokens, "round {round}");
        assert_eq!(throttle.tokens_milli(), 200_000, "round {round}");
    }

    // Past the floor: 0 whatever the order.
    race(8, |_| (0..100).for_each(|_| throttle.on_failure()));
    assert_eq!(throttle.tokens_milli(), 0);
}

#[test]
fn concurrent_successes_from_an_empty_bucket() {
    // Successes only: each adds exactly the ratio until the cap, in any order. The smallest
    // ratio allows many updates, so the threads really contend.
    let throttle = Throttle::new(1000, 0.001).unwrap();
    (0..1000).for_each(|_| throttle.on_failure());
    let mut model = Model::of(&throttle);
    race(8, |_| (0..100_000).for_each(|_| throttle.on_success()));
    (0..800_000).for_each(|_| model.success());
    assert_eq!(throttle.tokens_milli(), model.tokens);
    assert_eq!(throttle.tokens_milli(), 800_000);

    // Past the cap: full whatever the order.
    race(8, |_| (0..100_000).for_each(|_| throttle.on_success()));
    assert_eq!(throttle.tokens_milli(), 1_000_000);
}

#[test]
fn concurrent_mixed_updates_that_cannot_clamp() {
    // Start at 500 of 1000. All successes together add 8 * 60_000 * 0.001 = 480 tokens and
    // all failures together take 8 * 55 = 440, so no ordering can reach 0 or 1000: the
    // bucket never clamps and the result, 540, is independent of how the threads interleave.
    let throttle = Throttle::new(1000, 0.001).unwrap();
    (0..500).for_each(|_| throttle.on_failure());
    let mut model = Model::of(&throttle);
    race(8, |id| {
        for i in 0..60_000 {
            throttle.on_success();
            // Threads fail at different moments: every 1000th update, shifted per thread.
            if (i + id * 125) % 1000 == 0 && i < 55_000 {
                throttle.on_failure();
            }
            throttle.allows_retry();
        }
    });
    (0..480_000).for_each(|_| model.success());
    (0..440).for_each(|_| model.failure());
    assert_eq!(throttle.tokens_milli(), model.tokens);
    assert_eq!(throttle.tokens_milli(), 540_000);
}

#[test]
fn concurrent_clamped_updates_stay_in_bounds() {
    // Order matters here, so only the invariant is checked: tokens never leave [0, max].
    let throttle = Throttle::new(5, 0.7).unwrap();
    race(8, |id| {
        for i in 0..5000 {
            if (i + id) % 3 == 0 {
                throttle.on_failure();
            } else {
                throttle.on_success();
            }
            assert!(throttle.tokens_milli() <= 5_000);
        }
    });
    assert!(throttle.tokens_milli() <= 5_000);
    assert_eq!(throttle.tokens_milli() % 100, 0, "only whole 0.1 steps");
}

#[test]
fn registry_shares_a_bucket_per_authority() {
    let registry = ThrottleRegistry::new(10, 0.1).unwrap();
    let a = registry.get("a.example:443");
    let a_again = registry.get("A.EXAMPLE:443");
    let b = registry.get("b.example:443");
    assert_eq!(failing_call(&a, 3), 3);
    assert_eq!(a_again.tokens_milli(), 7_000);
    assert_eq!(b.tokens_milli(), 10_000);
    assert_eq!(failing_call(&a_again, 3), 2);
    assert_eq!(failing_call(&b, 3), 3);
    assert_eq!(registry.len(), 2);
    // Clones of the registry share its buckets.
    assert_eq!(registry.clone().get("a.example:443").tokens_milli(), 5_000);
}

#[test]
fn registry_shares_across_threads() {
    let registry = ThrottleRegistry::new(1000, 0.1).unwrap();
    race(8, |_| {
        for _ in 0..50 {
            registry.get("shared:1").on_failure();
        }
    });
    assert_eq!(registry.len(), 1);
    assert_eq!(registry.get("shared:1").tokens_milli(), 600_000);
}

#[test]
fn registry_default_cap_holds() {
    let registry = ThrottleRegistry::new(10, 0.1).unwrap();
    // The cap `ThrottleRegistry` documents.
    const DEFAULT_MAX_AUTHORITIES: usize = 4096;
    assert_eq!(registry.max_authorities(), DEFAULT_MAX_AUTHORITIES);
    let first = registry.get("host-0:1");
    for i in 1..DEFAULT_MAX_AUTHORITIES + 1000 {
        registry.get(&format!("host-{i}:1"));
    }
    assert_eq!(registry.len(), DEFAULT_MAX_AUTHORITIES);

    // Past the cap, new authorities share one overflow bucket...
    let late = registry.get("late-1:1");
    let later = registry.get("late-2:1");
    late.on_failure();
    assert_eq!(later.tokens_milli(), 9_000);
    // ...and the hosts admitted before it keep their own.
    assert_eq!(first.tokens_milli(), 10_000);
    first.on_failure();
    assert_eq!(registry.get("host-0:1").tokens_milli(), 9_000);
    assert_eq!(later.tokens_milli(), 9_000);
    assert_eq!(registry.len(), DEFAULT_MAX_AUTHORITIES);
}

#[test]
fn registry_cap_holds_under_a_concurrent_flood() {
    let registry = ThrottleRegistry::new(10, 0.1)
        .unwrap()
        .with_max_authorities(100);
    race(8, |id| {
        for i in 0..1000 {
            registry.get(&format!("flood-{id}-{i}.example:443"));
        }
    });
    assert_eq!(registry.len(), 100);

    let huge = "x".repeat(100_000);
    let fresh = ThrottleRegistry::new(10, 0.1).unwrap();
    fresh.get(&huge).on_failure();
    assert!(fresh.is_empty(), "an oversized authority takes no entry");
    assert_eq!(fresh.get(&"y".repeat(100_000)).tokens_milli(), 9_000);
}
