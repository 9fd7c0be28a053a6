//! Tests of the `backoff` module: bounds (property tests), means, determinism, validation,
//! saturation, seed 002's table, and the caller-owned loop on tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tower_retry_hedge::backoff::{
    Backoff, BackoffError, Constant, Decorrelated, Exponential, Jitter, Step, Table,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn nanos(d: Duration) -> f64 {
    d.as_nanos() as f64
}

/// Asserts that `sample` lies where `jitter` may put `v`, by the formulas of the module docs.
/// Float bounds get a relative slack of 1e-12 (plus 2 ns) for rounding; saturation at
/// `Duration::MAX` is allowed.
fn assert_within_jitter(sample: Duration, v: Duration, jitter: Jitter) {
    let (s, vn) = (sample.as_nanos(), v.as_nanos());
    match jitter {
        Jitter::None => assert_eq!(sample, v),
        Jitter::Full => assert!(s <= vn, "full: {sample:?} > {v:?}"),
        Jitter::Equal => assert!(
            s <= vn && 2 * s + 1 >= vn,
            "equal: {sample:?} outside [{v:?}/2, {v:?}]"
        ),
        Jitter::Proportional(f) => {
            let slack = nanos(v) * 1e-12 + 2.0;
            let lo = nanos(v) * (1.0 - f) - slack;
            let hi = nanos(v) * (1.0 + f) + slack;
            let x = nanos(sample);
            assert!(
                x >= lo && (x <= hi || sample == Duration::MAX),
                "proportional({f}): {sample:?} outside {v:?} * [1 - f, 1 + f]"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// strategies

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=10_000).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::MAX),
    ]
}

fn nonzero_duration() -> impl Strategy<Value = Duration> {
    any_duration().prop_map(|d| d.max(Duration::from_nanos(1)))
}

/// `(low, high)` with `0 < low <= high`.
fn ordered_pair() -> impl Strategy<Value = (Duration, Duration)> {
    (nonzero_duration(), nonzero_duration()).prop_map(|(a, b)| (a.min(b), a.max(b)))
}

fn any_multiplier() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.01f64..1.0,
        1.0f64..=10.0,
        10.0f64..1e6,
        Just(1.0),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
    ]
}

fn any_attempt() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..70, any::<u32>(), Just(u32::MAX)]
}

fn any_jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::Full),
        Just(Jitter::Equal),
        (0.0f64..=1.0).prop_map(Jitter::Proportional),
        Just(Jitter::Proportional(1.0)),
        Just(Jitter::None),
    ]
}

// ---------------------------------------------------------------------------------------
// bounds

proptest! {
    // Regressions go next to this file: the default would be `tests/proptest-regressions/
    // main.txt`, shared by every `tests/*/main.rs`.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(
            FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn exponential_base_delay_follows_the_formula(
        (initial, max) in ordered_pair(),
        multiplier in any_multiplier(),
        attempt in any_attempt(),
    ) {
        let schedule = Exponential::new(initial, max, multiplier, Jitter::None).unwrap();
        let v = schedule.base_delay(attempt);
        prop_assert!(v <= max);
        // Reference by repeated multiplication, stopping where the outcome is settled (past
        // the cap while growing, near zero while shrinking); attempts it cannot settle in
        // 10 000 steps are only checked against the cap.
        let mut expected = nanos(initial);
        let mut steps = 0;
        let settled = |x: f64| {
            (multiplier >= 1.0 && x >= nanos(max)) || (multiplier <= 1.0 && x <= 1e-3)
        };
        while steps < attempt && !settled(expected) && steps < 10_000 {
            expected *= multiplier;
            steps += 1;
        }
        if steps < attempt && !settled(expected) {
            return Ok(());
        }
        if expected <= 1e-3 {
            prop_assert!(v <= Duration::from_nanos(1), "{v:?} should have shrunk to zero");
        } else if expected >= nanos(max) {
            // At or past the cap; 1e-9 slack for where pow and the cap nearly meet.
            prop_assert!(nanos(v) >= nanos(max) * (1.0 - 1e-9), "{v:?} below cap {max:?}");
        } else {
            let error = (nanos(v) - expected).abs();
            prop_assert!(error <= expected * 1e-9 + 1.0, "{v:?} != {expected} ns");
        }
    }

    #[test]
    fn exponential_samples_lie_within_their_jitter(
        (initial, max) in ordered_pair(),
        multiplier in any_multiplier(),
        jitter in any_jitter(),
        attempt in any_attempt(),
        seed in any::<u64>(),
    ) {
        let schedule = Exponential::new(initial, max, multiplier, jitter).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let v = schedule.base_delay(attempt);
        for _ in 0..8 {
            assert_within_jitter(schedule.sample(Step::new(attempt), &mut rng), v, jitter);
        }
    }

    #[test]
    fn decorrelated_samples_lie_between_base_and_three_times_previous(
        (base, cap) in ordered_pair(),
        previous in proptest::option::of(any_duration()),
        attempt in any_attempt(),
        seed in any::<u64>(),
    ) {
        let schedule = Decorrelated::new(base, cap).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let effective = previous.unwrap_or(base).max(base);
        let hi = effective.saturating_mul(3).min(cap);
        for _ in 0..8 {
            let step = Step { attempt, previous };
            let d = schedule.sample(step, &mut rng);
            prop_assert!(d >= base && d <= hi, "{d:?} outside [{base:?}, {hi:?}]");
        }
    }

    #[test]
    fn table_samples_lie_within_half_and_one_and_a_half_of_their_entry(
        delays in proptest::collection::vec(
            prop_oneof![Just(Duration::ZERO), any_duration()], 1..16),
        attempt in any_attempt(),
        seed in any::<u64>(),
    ) {
        let schedule = Table::new(delays.clone()).unwrap();
        let index = usize::try_from(attempt).unwrap_or(usize::MAX).min(delays.len() - 1);
        let d = delays[index];
        prop_assert_eq!(schedule.base_delay(attempt), d);
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..8 {
            let s = schedule.sample(Step::new(attempt), &mut rng);
            assert_within_jitter(s, d, Jitter::Proportional(0.5));
            if d.is_zero() {
                prop_assert_eq!(s, Duration::ZERO);
            }
        }
    }

    #[test]
    fn constant_samples_lie_within_their_jitter(
        duration in any_duration(),
        jitter in any_jitter(),
        attempt in any_attempt(),
        seed in any::<u64>(),
    ) {
        let schedule = Constant::new(duration).with_jitter(jitter).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..8 {
            assert_within_jitter(schedule.sample(Step::new(attempt), &mut rng), duration, jitter);
        }
    }

    #[test]
    fn previous_delay_is_ignored_by_attempt_based_schedules(
        previous in any_duration(),
        attempt in any_attempt(),
        seed in any::<u64>(),
    ) {
        let schedules: [Box<dyn Backoff>; 3] = [
            Box::new(Exponential::google()),
            Box::new(Table::seed_default()),
            Box::new(Constant::new(ms(5)).with_jitter(Jitter::Full).unwrap()),
        ];
        for schedule in &schedules {
            let rng = || StdRng::seed_from_u64(seed);
            let a = schedule.sample(Step::new(attempt), &mut rng());
            let b = schedule.sample(Step::after(attempt, previous), &mut rng());
            prop_assert_eq!(a, b);
        }
    }
}

// ---------------------------------------------------------------------------------------
// means over many seeded samples

const SAMPLES: u32 = 200_000;

/// The mean of `SAMPLES` samples of `step`, in nanoseconds.
fn mean_nanos(schedule: &dyn Backoff, step: Step, seed: u64) -> f64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let total: f64 = (0..SAMPLES)
        .map(|_| nanos(schedule.sample(step, &mut rng)))
        .sum();
    total / f64::from(SAMPLES)
}

fn assert_mean(schedule: &dyn Backoff, step: Step, expected: Duration) {
    let mean = mean_nanos(schedule, step, 0x5EED);
    let error = (mean - nanos(expected)).abs() / nanos(expected);
    assert!(
        error < 0.02,
        "{schedule:?} at {step:?}: mean {mean} ns, expected {expected:?} (off by {:.2} %)",
        error * 100.0
    );
}

/// A6's example schedule: 100 ms, x2, at most 1 s; attempt 2 is 400 ms, attempt 9 the cap.
fn a6(jitter: Jitter) -> Exponential {
    Exponential::new(ms(100), ms(1000), 2.0, jitter).unwrap()
}

#[test]
fn full_jitter_mean_is_half_the_delay() {
    assert_mean(&a6(Jitter::Full), Step::new(2), ms(200));
    assert_mean(&a6(Jitter::Full), Step::new(9), ms(500));
}

#[test]
fn equal_jitter_mean_is_three_quarters_of_the_delay() {
    assert_mean(&a6(Jitter::Equal), Step::new(2), ms(300));
    assert_mean(&a6(Jitter::Equal), Step::new(9), ms(750));
}

#[test]
fn proportional_jitter_mean_is_the_delay() {
    assert_mean(&a6(Jitter::GRPC), Step::new(2), ms(400));
    assert_mean(&a6(Jitter::Proportional(1.0)), Step::new(9), ms(1000));
}

#[test]
fn no_jitter_is_exactly_the_delay() {
    let mut rng = StdRng::seed_from_u64(1);
    for attempt in 0..12 {
        let expected = ms(100 * 2u64.pow(attempt)).min(ms(1000));
        assert_eq!(
            a6(Jitter::None).sample(Step::new(attempt), &mut rng),
            expected
        );
    }
}

#[test]
fn full_jitter_is_uniform_over_its_range() {
    let schedule = a6(Jitter::Full);
    let mut rng = StdRng::seed_from_u64(3);
    let mut quartiles = [0u32; 4];
    for _ in 0..SAMPLES {
        let d = schedule.sample(Step::new(2), &mut rng);
        let bucket = (d.as_nanos() * 4 / ms(400).as_nanos()).min(3);
        quartiles[bucket as usize] += 1;
    }
    for count in quartiles {
        let share = f64::from(count) / f64::from(SAMPLES);
        assert!((share - 0.25).abs() < 0.01, "quartiles {quartiles:?}");
    }
}

/// `E[min(cap, U(lo, hi))]` for `lo < hi`, in nanoseconds.
fn clamped_uniform_mean(lo: Duration, hi: Duration, cap: Duration) -> f64 {
    let (a, b, c) = (nanos(lo), nanos(hi), nanos(cap));
    if b <= c {
        (a + b) / 2.0
    } else if a >= c {
        c
    } else {
        ((c - a) * (a + c) / 2.0 + (b - c) * c) / (b - a)
    }
}

#[test]
fn decorrelated_mean_without_a_previous_delay_is_twice_the_base() {
    let schedule = Decorrelated::new(ms(100), ms(10_000)).unwrap();
    let expected = clamped_uniform_mean(ms(100), ms(300), ms(10_000));
    assert_eq!(expected, nanos(ms(200)));
    assert_mean(&schedule, Step::new(0), ms(200));
}

#[test]
fn decorrelated_mean_is_clamped_at_the_cap() {
    // U(100 ms, 1500 ms) capped at 1 s: 0.9 * 0.55 + 0.5 * 1 over 1.4, about 710.7 ms.
    let schedule = Decorrelated::new(ms(100), ms(1000)).unwrap();
    let step = Step::after(4, ms(500));
    let expected = clamped_uniform_mean(ms(100), ms(1500), ms(1000));
    assert!((expected - 710_714_285.7).abs() < 1.0);
    let mean = mean_nanos(&schedule, step, 0x5EED);
    assert!(
        (mean - expected).abs() / expected < 0.02,
        "mean {mean}, expected {expected}"
    );
}

#[test]
fn decorrelated_mean_with_a_small_previous_delay_uses_the_base() {
    let schedule = Decorrelated::new(ms(100), ms(10_000)).unwrap();
    assert_mean(&schedule, Step::after(3, ms(1)), ms(200));
}

#[test]
fn table_mean_is_the_entry() {
    let schedule = Table::seed_default();
    assert_mean(&schedule, Step::new(3), ms(100));
    assert_mean(&schedule, Step::new(7), ms(3000));
    assert_mean(&schedule, Step::new(1_000), ms(5000));
}

#[test]
fn jittered_constant_mean_follows_its_jitter() {
    let schedule = Constant::new(ms(80)).with_jitter(Jitter::Full).unwrap();
    assert_mean(&schedule, Step::new(0), ms(40));
    let schedule = Constant::new(ms(80)).with_jitter(Jitter::Equal).unwrap();
    assert_mean(&schedule, Step::new(5), ms(60));
}

// ---------------------------------------------------------------------------------------
// determinism

fn jittered_schedules() -> Vec<Box<dyn Backoff>> {
    vec![
        Box::new(a6(Jitter::Full)),
        Box::new(a6(Jitter::Equal)),
        Box::new(a6(Jitter::GRPC)),
        Box::new(Exponential::google()),
        Box::new(Decorrelated::new(ms(10), ms(5000)).unwrap()),
        Box::new(Table::seed_default()),
        Box::new(Constant::new(ms(50)).with_jitter(Jitter::Full).unwrap()),
    ]
}

/// 32 delays of a retry loop that keeps the previous delay, as the retry layer does.
fn run(schedule: &dyn Backoff, seed: u64) -> Vec<Duration> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut previous = None;
    (0..32)
        .map(|attempt| {
            let d = schedule.sample(Step { attempt, previous }, &mut rng);
            previous = Some(d);
            d
        })
        .collect()
}

#[test]
fn same_seed_gives_the_same_sequence() {
    for schedule in jittered_schedules() {
        assert_eq!(run(&*schedule, 42), run(&*schedule, 42), "{schedule:?}");
    }
}

#[test]
fn different_seeds_give_different_sequences() {
    for schedule in jittered_schedules() {
        assert_ne!(run(&*schedule, 42), run(&*schedule, 43), "{schedule:?}");
    }
}

#[test]
fn decorrelated_grows_from_the_previous_delay() {
    let schedule = Decorrelated::new(ms(10), ms(60_000)).unwrap();
    let delays = run(&schedule, 9);
    // Each step draws from U(10 ms, 3 * previous): never more than three times the last.
    for pair in delays.windows(2) {
        assert!(pair[1] <= pair[0] * 3, "{pair:?}");
    }
    assert!(
        delays.iter().any(|d| *d > ms(1000)),
        "never grew: {delays:?}"
    );
}

// ---------------------------------------------------------------------------------------
// validation

fn assert_error(result: Result<impl std::fmt::Debug, BackoffError>, expected: BackoffError) {
    let err = result.expect_err("constructor accepted an invalid parameter");
    assert_eq!(err, expected);
    let text = err.to_string();
    assert!(
        text.contains(err.parameter()),
        "{text:?} does not name {}",
        err.parameter()
    );
    assert!(text.starts_with(|c: char| c.is_lowercase()), "{text:?}");
}

#[test]
fn exponential_rejects_nan_multiplier() {
    let result = Exponential::new(ms(1), ms(2), f64::NAN, Jitter::None);
    let err = result.unwrap_err();
    assert!(matches!(err, BackoffError::MultiplierNotFinite { multiplier } if multiplier.is_nan()));
    assert_eq!(err.parameter(), "multiplier");
    assert_eq!(
        err.to_string(),
        "backoff multiplier must be finite, got NaN"
    );
}

#[test]
fn exponential_rejects_infinite_multiplier() {
    for multiplier in [f64::INFINITY, f64::NEG_INFINITY] {
        assert_error(
            Exponential::new(ms(1), ms(2), multiplier, Jitter::None),
            BackoffError::MultiplierNotFinite { multiplier },
        );
    }
}

#[test]
fn exponential_rejects_zero_multiplier() {
    assert_error(
        Exponential::grpc(ms(1), ms(2), 0.0),
        BackoffError::MultiplierNotPositive { multiplier: 0.0 },
    );
}

#[test]
fn exponential_rejects_negative_multiplier() {
    assert_error(
        Exponential::grpc_full_jitter(ms(1), ms(2), -1.5),
        BackoffError::MultiplierNotPositive { multiplier: -1.5 },
    );
}

#[test]
fn exponential_rejects_zero_max() {
    assert_error(
        Exponential::new(Duration::ZERO, Duration::ZERO, 2.0, Jitter::Full),
        BackoffError::ZeroMax,
    );
}

#[test]
fn exponential_rejects_zero_initial() {
    assert_error(
        Exponential::new(Duration::ZERO, ms(1), 2.0, Jitter::Full),
        BackoffError::ZeroInitial,
    );
}

#[test]
fn exponential_rejects_initial_above_max() {
    assert_error(
        Exponential::grpc(ms(2000), ms(1000), 2.0),
        BackoffError::InitialAboveMax {
            initial: ms(2000),
            max: ms(1000),
        },
    );
    let err = Exponential::grpc(ms(2000), ms(1000), 2.0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "backoff initial (2s) must not exceed max (1s)"
    );
}

#[test]
fn exponential_rejects_jitter_fraction_above_one() {
    assert_error(
        Exponential::new(ms(1), ms(2), 2.0, Jitter::Proportional(1.01)),
        BackoffError::JitterFractionOutOfRange { fraction: 1.01 },
    );
}

#[test]
fn exponential_rejects_negative_jitter_fraction() {
    assert_error(
        Exponential::google().with_jitter(Jitter::Proportional(-0.2)),
        BackoffError::JitterFractionOutOfRange { fraction: -0.2 },
    );
}

#[test]
fn exponential_rejects_nan_jitter_fraction() {
    let err = Exponential::google()
        .with_jitter(Jitter::Proportional(f64::NAN))
        .unwrap_err();
    assert!(
        matches!(err, BackoffError::JitterFractionOutOfRange { fraction } if fraction.is_nan())
    );
    assert_eq!(err.parameter(), "jitter");
    assert!(err.to_string().contains("jitter"));
}

#[test]
fn jitter_proportional_rejects_fraction_out_of_range() {
    assert_error(
        Jitter::proportional(2.0),
        BackoffError::JitterFractionOutOfRange { fraction: 2.0 },
    );
    assert_eq!(Jitter::proportional(0.3), Ok(Jitter::Proportional(0.3)));
}

#[test]
fn decorrelated_rejects_zero_base() {
    assert_error(
        Decorrelated::new(Duration::ZERO, ms(1)),
        BackoffError::ZeroBase,
    );
}

#[test]
fn decorrelated_rejects_zero_cap() {
    assert_error(
        Decorrelated::new(Duration::ZERO, Duration::ZERO),
        BackoffError::ZeroCap,
    );
}

#[test]
fn decorrelated_rejects_base_above_cap() {
    assert_error(
        Decorrelated::new(ms(5), ms(4)),
        BackoffError::BaseAboveCap {
            base: ms(5),
            cap: ms(4),
        },
    );
}

#[test]
fn table_rejects_empty() {
    assert_error(Table::new(Vec::new()), BackoffError::EmptyTable);
    assert_error(Table::from_static(&[]), BackoffError::EmptyTable);
}

#[test]
fn table_rejects_jitter_fraction_out_of_range() {
    assert_error(
        Table::seed_default().with_jitter(Jitter::Proportional(1.5)),
        BackoffError::JitterFractionOutOfRange { fraction: 1.5 },
    );
}

#[test]
fn constant_rejects_jitter_fraction_out_of_range() {
    assert_error(
        Constant::new(ms(1)).with_jitter(Jitter::Proportional(-1.0)),
        BackoffError::JitterFractionOutOfRange { fraction: -1.0 },
    );
}

#[test]
fn boundary_parameters_are_accepted() {
    let equal = Exponential::new(ms(7), ms(7), 1.0, Jitter::Proportional(0.0)).unwrap();
    assert_eq!(equal.delay(u32::MAX), ms(7));
    let shrinking = Exponential::new(ms(800), ms(800), 0.5, Jitter::None).unwrap();
    assert_eq!(shrinking.delay(1), ms(400));
    assert!(Exponential::new(ms(1), ms(2), 2.0, Jitter::Proportional(1.0)).is_ok());
    assert_eq!(
        Decorrelated::new(ms(3), ms(3))
            .unwrap()
            .delay_after(5, ms(100)),
        ms(3)
    );
    assert_eq!(Constant::new(Duration::ZERO).delay(3), Duration::ZERO);
}

// ---------------------------------------------------------------------------------------
// saturation

#[test]
fn attempt_u32_max_without_jitter_is_exactly_the_cap() {
    for (initial, max, multiplier) in [
        (ms(100), ms(1000), 2.0),
        (ms(500), ms(32_000), 1.5),
        (Duration::from_nanos(1), Duration::MAX, 1.000_001),
        (Duration::from_nanos(1), Duration::from_nanos(1), 10.0),
        (ms(1), Duration::new(u64::MAX, 999_999_999), f64::MAX),
    ] {
        let schedule = Exponential::new(initial, max, multiplier, Jitter::None).unwrap();
        assert_eq!(schedule.base_delay(u32::MAX), max);
        assert_eq!(schedule.delay(u32::MAX), max);
        assert_eq!(schedule.delay(u32::MAX - 1), max);
    }
}

#[test]
fn attempt_u32_max_is_finite_for_every_jitter() {
    let mut rng = StdRng::seed_from_u64(11);
    for jitter in [
        Jitter::Full,
        Jitter::Equal,
        Jitter::GRPC,
        Jitter::Proportional(1.0),
    ] {
        let schedule = a6(jitter);
        for _ in 0..1_000 {
            let d = schedule.sample(Step::new(u32::MAX), &mut rng);
            assert_within_jitter(d, ms(1000), jitter);
            assert!(d <= ms(2000));
        }
    }
}

#[test]
fn extreme_durations_saturate_without_panicking() {
    let mut rng = StdRng::seed_from_u64(12);
    let schedules: Vec<Box<dyn Backoff>> = vec![
        Box::new(
            Exponential::new(Duration::MAX, Duration::MAX, 2.0, Jitter::Proportional(1.0)).unwrap(),
        ),
        Box::new(
            Exponential::new(
                Duration::from_nanos(1),
                Duration::MAX,
                f64::MAX,
                Jitter::Full,
            )
            .unwrap(),
        ),
        Box::new(Table::new([Duration::MAX]).unwrap()),
        Box::new(Decorrelated::new(Duration::MAX, Duration::MAX).unwrap()),
        Box::new(Decorrelated::new(Duration::from_nanos(1), Duration::MAX).unwrap()),
        Box::new(
            Constant::new(Duration::MAX)
                .with_jitter(Jitter::Proportional(1.0))
                .unwrap(),
        ),
    ];
    for schedule in &schedules {
        for attempt in [0, 1, 2, 64, 1 << 20, u32::MAX] {
            for previous in [None, Some(Duration::ZERO), Some(Duration::MAX)] {
                let _ = schedule.sample(Step { attempt, previous }, &mut rng);
            }
        }
    }
    let d = Decorrelated::new(Duration::MAX, Duration::MAX)
        .unwrap()
        .delay_after(u32::MAX, Duration::MAX);
    assert_eq!(d, Duration::MAX);
}

#[test]
fn shrinking_schedule_saturates_at_zero() {
    let schedule = Exponential::new(ms(1000), ms(1000), 0.5, Jitter::Full).unwrap();
    assert_eq!(schedule.base_delay(u32::MAX), Duration::ZERO);
    assert_eq!(schedule.delay(u32::MAX), Duration::ZERO);
}

// ---------------------------------------------------------------------------------------
// constructors and seed 002

#[test]
fn seed_002_default_table_values() {
    let schedule = Table::seed_default();
    let expected: Vec<Duration> = [0, 10, 10, 100, 100, 500, 500, 3000, 3000, 5000]
        .into_iter()
        .map(ms)
        .collect();
    assert_eq!(schedule.delays(), expected.as_slice());
    assert_eq!(schedule.jitter(), Jitter::Proportional(0.5));
    assert_eq!(Table::default(), schedule);
    assert_eq!(Table::new(expected).unwrap(), schedule);
}

#[test]
fn seed_002_default_table_delays() {
    let schedule = Table::seed_default();
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..1_000 {
        assert_eq!(schedule.sample(Step::new(0), &mut rng), Duration::ZERO);
        for (attempt, entry) in [
            (1, 10),
            (4, 100),
            (6, 500),
            (8, 3000),
            (9, 5000),
            (10, 5000),
        ] {
            let d = schedule.sample(Step::new(attempt), &mut rng);
            assert!(
                d >= ms(entry) / 2 && d <= ms(entry) * 3 / 2,
                "attempt {attempt}: {d:?}"
            );
        }
        let d = schedule.sample(Step::new(u32::MAX), &mut rng);
        assert!(d >= ms(2500) && d <= ms(7500));
    }
}

#[test]
fn named_constructors_pick_their_jitter() {
    let grpc = Exponential::grpc(ms(100), ms(1000), 2.0).unwrap();
    assert_eq!(grpc.jitter(), Jitter::Proportional(0.2));
    let full = Exponential::grpc_full_jitter(ms(100), ms(1000), 2.0).unwrap();
    assert_eq!(full.jitter(), Jitter::Full);
    assert_eq!(
        (full.initial(), full.max(), full.multiplier()),
        (ms(100), ms(1000), 2.0)
    );
    assert_eq!(grpc.with_jitter(Jitter::Full).unwrap(), full);

    let google = Exponential::google();
    assert_eq!(
        (
            google.initial(),
            google.max(),
            google.multiplier(),
            google.jitter()
        ),
        (ms(500), ms(32_000), 1.5, Jitter::Proportional(0.5))
    );
    assert_eq!(google.base_delay(1), ms(750));
    assert_eq!(google.base_delay(2), Duration::from_micros(1_125_000));

    let constant = Constant::new(ms(9));
    assert_eq!(
        (constant.duration(), constant.jitter()),
        (ms(9), Jitter::None)
    );
    let decorrelated = Decorrelated::new(ms(1), ms(9)).unwrap();
    assert_eq!((decorrelated.base(), decorrelated.cap()), (ms(1), ms(9)));
}

#[test]
fn step_constructors() {
    assert_eq!(
        Step::new(4),
        Step {
            attempt: 4,
            previous: None
        }
    );
    assert_eq!(
        Step::after(4, ms(3)),
        Step {
            attempt: 4,
            previous: Some(ms(3))
        }
    );
    assert_eq!(Step::default(), Step::new(0));
}

// ---------------------------------------------------------------------------------------
// the trait: object safety, forwarding, auto traits

#[test]
fn backoff_is_object_safe() {
    let boxed: Box<dyn Backoff> = Box::new(Exponential::google());
    let shared: Arc<dyn Backoff> = Arc::new(Table::seed_default());
    let borrowed: &dyn Backoff = &Constant::new(ms(1));
    let nested: Box<dyn Backoff> = Box::new(Arc::clone(&shared));
    let all: [&dyn Backoff; 4] = [&boxed, &shared, &borrowed, &nested];
    for schedule in all {
        let d = schedule.delay(0);
        assert!(d <= ms(750), "{schedule:?}: {d:?}");
    }
}

#[test]
fn pointers_forward_to_the_schedule() {
    let inner = Decorrelated::new(ms(10), ms(1000)).unwrap();
    let wrapped: [Box<dyn Backoff>; 3] = [
        Box::new(Arc::new(inner)),
        Box::new(Box::new(inner)),
        Box::new(Arc::new(Box::new(inner)) as Arc<dyn Backoff>),
    ];
    for schedule in &wrapped {
        assert_eq!(run(&**schedule, 21), run(&inner, 21));
        let d = schedule.delay_after(3, ms(20));
        assert!(d >= ms(10) && d <= ms(60));
    }
    let by_ref: &Decorrelated = &inner;
    assert_eq!(
        <&Decorrelated as Backoff>::sample(&by_ref, Step::new(0), &mut StdRng::seed_from_u64(1)),
        inner.sample(Step::new(0), &mut StdRng::seed_from_u64(1))
    );
}

#[test]
fn schedules_are_plain_data() {
    fn plain<T: Clone + Send + Sync + PartialEq + std::fmt::Debug + 'static>() {}
    fn copy<T: Copy>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    plain::<Exponential>();
    plain::<Decorrelated>();
    plain::<Table>();
    plain::<Constant>();
    plain::<Jitter>();
    plain::<Step>();
    copy::<Exponential>();
    copy::<Decorrelated>();
    copy::<Constant>();
    copy::<Step>();
    error::<BackoffError>();
}

// ---------------------------------------------------------------------------------------
// seed 002's loop, on tokio's paused clock

#[tokio::test(start_paused = true)]
async fn caller_owned_loop_waits_each_scheduled_delay() {
    use tokio::time::{Instant, sleep};

    let schedule = a6(Jitter::None);
    let start = Instant::now();
    let mut tries = Vec::new();
    let mut attempt: u32 = 0;
    loop {
        sleep(schedule.delay(attempt)).await;
        tries.push((start.elapsed(), attempt));
        if tries.len() < 4 {
            attempt = attempt.saturating_add(1);
            continue;
        }
        break;
    }
    assert_eq!(
        tries,
        [(ms(100), 0), (ms(300), 1), (ms(700), 2), (ms(1500), 3)]
    );
}

#[tokio::test(start_paused = true)]
async fn reset_signal_restarts_the_schedule_mid_wait() {
    use tokio::sync::Notify;
    use tokio::time::{Instant, sleep};

    let schedule = Exponential::new(ms(10), ms(1000), 2.0, Jitter::None).unwrap();
    let reset = Arc::new(Notify::new());
    let done = Arc::new(Notify::new());
    let signals = tokio::spawn({
        let (reset, done) = (Arc::clone(&reset), Arc::clone(&done));
        async move {
            sleep(ms(35)).await;
            reset.notify_one();
            sleep(ms(15)).await;
            done.notify_one();
        }
    });

    let start = Instant::now();
    let mut tries = Vec::new();
    let mut attempt: u32 = 0;
    loop {
        tokio::select! {
            biased;
            _ = done.notified() => break,
            _ = reset.notified() => { attempt = 0; continue; }
            _ = sleep(schedule.delay(attempt)) => {}
        }
        tries.push((start.elapsed(), attempt));
        attempt = attempt.saturating_add(1); // every try fails
    }
    signals.await.unwrap();
    // 10 ms, then 20 ms; the 40 ms wait is cut at 35 ms by the reset; 10 ms again; done at 50.
    assert_eq!(tries, [(ms(10), 0), (ms(30), 1), (ms(45), 0)]);
    assert_eq!(start.elapsed(), ms(50));
}
