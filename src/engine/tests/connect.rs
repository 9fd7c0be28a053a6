//! Attempts that could not connect (with and without wait-for-ready), and the hedge budget.

use super::*;
use crate::throttle::HedgeBudget;

#[test]
fn without_wait_for_ready_a_never_sent_attempt_is_an_unavailable_failure_for_the_policy() {
    // Retried as a counted attempt, after the backoff, even for a POST, and it counts
    // against the throttle.
    let throttle = Throttle::new(10, 0.1).unwrap();
    let handle = Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut rules = rules(Mode::Retry(retry_policy(|b| b.max_attempts(3))), 3, handle);
    rules.may_repeat = false;
    let mut engine = engine_of(rules, None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0()),
        Verdict::Keep
    );
    assert_eq!(throttle.tokens_milli(), 9_000);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(Some(t0() + ms(100))));
    let Action::Send(send) = poll(&mut engine, t0() + ms(100)) else {
        panic!("retried after the backoff")
    };
    assert!(!send.transparent);
    let second = sent(&mut engine, send, t0() + ms(100));
    assert_eq!(second.number, 2);
    assert_eq!(
        answer(&mut engine, second, Outcome::NotSent, t0() + ms(100)),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(300)) else {
        panic!("retried again")
    };
    let third = sent(&mut engine, send, t0() + ms(300));
    assert_eq!(
        answer(&mut engine, third, Outcome::NotSent, t0() + ms(300)),
        Verdict::Keep
    );
    // maxAttempts reached.
    assert_eq!(
        ended(poll(&mut engine, t0() + ms(300))),
        Some(End::Last(third))
    );
    assert_eq!(engine.attempts(), Attempts::new(3, 0));
}

#[test]
fn without_a_policy_a_never_sent_attempt_fails_the_call_at_once() {
    let mut engine = engine_of(rules(Mode::Single, 1, None), None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0()),
        Verdict::Return
    );
    // With wait-for-ready (a method config with only `"waitForReady": true`), it is resent.
    let mut engine = engine_of(waiting(rules(Mode::Single, 1, None)), None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0()),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(1000)) else {
        panic!("resent")
    };
    assert!(send.transparent);
}

#[test]
fn a_never_sent_hedge_sends_the_next_at_once_when_unavailable_is_non_fatal() {
    let mut engine = engine_of(hedge_rules(3, ms(500)), None);
    poll(&mut engine, t0());
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::NotSent,
            t0() + ms(1)
        ),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(1)) else {
        panic!("the next hedge goes at once")
    };
    assert!(send.hedge && !send.transparent);
}

#[test]
fn a_hedge_over_its_policy_budget_is_not_sent_and_the_call_waits_on_the_first() {
    // 50 % of calls, no floor: of two calls, one hedge.
    let budget = HedgeBudget::new(Duration::from_secs(10), 0, 0.5).unwrap();
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(10))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(budget.clone())
        .build()
        .unwrap();
    let rules = || rules(Mode::Hedge(Arc::new(policy.clone()), ms(10)), 3, None);
    let mut first = engine_of(rules(), None);
    let mut second = engine_of(rules(), None);
    for engine in [&mut first, &mut second] {
        poll(engine, t0());
    }
    let Action::Send(send) = poll(&mut first, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    assert_eq!(admit(&mut first, send), Admission::Send);
    let Action::Send(send) = poll(&mut second, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    assert_eq!(admit(&mut second, send), Admission::OverBudget);
    // No more hedges for this call: it waits on its first attempt. The statistics count the
    // hedge over budget once, when the engine posts its records.
    let stats = crate::stats::MethodStats::default();
    assert_eq!(
        poll_posting(&mut second, t0() + ms(10), &stats),
        Action::Wait(None)
    );
    assert_eq!(second.extra().map(|e| e.hedges_over_budget), Some(1));
    assert_eq!(stats.snapshot().hedges_over_budget, 1);
    assert_eq!(second.take_records(), None);
    assert_eq!(
        answer(
            &mut second,
            AttemptId::FIRST,
            Outcome::Success,
            t0() + ms(50)
        ),
        Verdict::Return
    );
}

/// A hedging policy of `max` attempts, `delay` apart, that may hedge at most `ratio` of its
/// calls, with no floor.
fn budgeted(max: u32, delay: Duration, ratio: f64) -> (Arc<HedgePolicy>, HedgeBudget) {
    let budget = HedgeBudget::new(Duration::from_secs(10), 0, ratio).unwrap();
    let policy = HedgePolicy::builder()
        .max_attempts(max)
        .delay(delay)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(budget.clone())
        .build()
        .unwrap();
    (Arc::new(policy), budget)
}

#[test]
fn the_next_hedge_after_a_non_fatal_failure_does_not_ask_the_budget() {
    // A budget that allows no hedge at all: A6's next hedge at once still goes, for every
    // failure, and takes nothing from it.
    let (policy, budget) = budgeted(4, ms(10), 0.0);
    let counting = Counting::default();
    let throttle = Some(Arc::new(counting.clone()) as ThrottleHandle);
    let mut engine = engine_of(rules(Mode::Hedge(policy, ms(10)), 4, throttle), None);
    poll(&mut engine, t0());
    let mut attempt = AttemptId::FIRST;
    for n in 2..=4 {
        assert_eq!(answer(&mut engine, attempt, RETRYABLE, t0()), Verdict::Keep);
        let Action::Send(send) = poll(&mut engine, t0()) else {
            panic!("hedge {n} goes at once")
        };
        attempt = sent(&mut engine, send, t0());
        assert_eq!(attempt.number, n);
    }
    assert_eq!(budget.remaining(), 0);
    assert_eq!(engine.extra().map(|e| e.hedges_over_budget), Some(0));
    // The throttle alone governed them, as it governs a retry.
    assert_eq!(counting.asked(), 3);
}

#[test]
fn a_backup_due_on_the_delay_becomes_a_replacement_when_the_attempt_fails_first() {
    // The second attempt was planned as a backup at 10 ms; the first fails at 5 ms, so it
    // goes at once, as the failed attempt's replacement: the budget is not asked. The third,
    // due on the delay beside the second, is a backup again and asks it.
    let (policy, budget) = budgeted(3, ms(10), 0.0);
    let mut engine = engine_of(rules(Mode::Hedge(policy, ms(10)), 3, None), None);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(Some(t0() + ms(10))));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0() + ms(5)),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(5)) else {
        panic!("the second goes at once")
    };
    let second = sent(&mut engine, send, t0() + ms(5));
    let Action::Send(send) = poll(&mut engine, t0() + ms(15)) else {
        panic!("the third is due on the delay")
    };
    assert_eq!(admit(&mut engine, send), Admission::OverBudget);
    assert_eq!(engine.extra().map(|e| e.hedges_over_budget), Some(1));
    assert_eq!(budget.remaining(), 0);
    assert_eq!(poll(&mut engine, t0() + ms(15)), Action::Wait(None));
    assert_eq!(
        answer(&mut engine, second, Outcome::Success, t0() + ms(20)),
        Verdict::Return
    );
}

#[test]
fn a_backup_over_budget_does_not_stop_the_hedge_a_non_fatal_failure_owes() {
    // The case: 3 attempts 150 ms apart, a budget with no hedges, no throttle. The
    // backup at 150 ms is refused; the first attempt fails UNAVAILABLE at 300 ms, and the
    // second goes at once, as A6 says, and answers OK: 2 attempts.
    let (policy, budget) = budgeted(3, ms(150), 0.0);
    let mut engine = engine_of(rules(Mode::Hedge(policy, ms(150)), 3, None), None);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(Some(t0() + ms(150))));
    let Action::Send(send) = poll(&mut engine, t0() + ms(150)) else {
        panic!("the backup is due")
    };
    assert_eq!(admit(&mut engine, send), Admission::OverBudget);
    assert_eq!(poll(&mut engine, t0() + ms(150)), Action::Wait(None));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0() + ms(300)),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(300)) else {
        panic!("the hedge owed to the failure goes at once")
    };
    assert!(send.hedge && !send.transparent);
    assert_eq!(admit(&mut engine, send), Admission::Send);
    let second = sent(&mut engine, send, t0() + ms(300));
    assert_eq!(second.number, 2);
    // The refusal still holds for backups: nothing is due on the delay beside the second.
    assert_eq!(poll(&mut engine, t0() + ms(450)), Action::Wait(None));
    assert_eq!(
        answer(&mut engine, second, Outcome::Success, t0() + ms(320)),
        Verdict::Return
    );
    assert_eq!(engine.attempts(), Attempts::new(2, 0));
    assert_eq!(budget.remaining(), 0);
    assert_eq!(engine.extra().map(|e| e.hedges_over_budget), Some(1));
}

#[test]
fn after_a_refused_backup_every_non_fatal_failure_still_sends_the_next_hedge() {
    // Up to maxAttempts, one replacement per failure; then the last failure is the answer.
    let (policy, _budget) = budgeted(3, ms(10), 0.0);
    let mut engine = engine_of(rules(Mode::Hedge(policy, ms(10)), 3, None), None);
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(10)) else {
        panic!("the backup is due")
    };
    assert_eq!(admit(&mut engine, send), Admission::OverBudget);
    let mut attempt = AttemptId::FIRST;
    for n in 2..=3 {
        assert_eq!(
            answer(&mut engine, attempt, RETRYABLE, t0() + ms(20)),
            Verdict::Keep
        );
        let Action::Send(send) = poll(&mut engine, t0() + ms(20)) else {
            panic!("hedge {n} goes at once")
        };
        assert_eq!(admit(&mut engine, send), Admission::Send);
        attempt = sent(&mut engine, send, t0() + ms(20));
        assert_eq!(attempt.number, n);
    }
    assert_eq!(
        answer(&mut engine, attempt, RETRYABLE, t0() + ms(30)),
        Verdict::Keep
    );
    assert_eq!(
        ended(poll(&mut engine, t0() + ms(30))),
        Some(End::Last(attempt))
    );
}

#[test]
fn a_refused_backup_leaves_the_fatal_and_pushback_rules_as_they_were() {
    // A fatal code still ends the call, and a pushback "stop" still stops the hedges.
    let (policy, _budget) = budgeted(3, ms(10), 0.0);
    let refused = |engine: &mut Engine| {
        poll(engine, t0());
        let Action::Send(send) = poll(engine, t0() + ms(10)) else {
            panic!("the backup is due")
        };
        assert_eq!(admit(engine, send), Admission::OverBudget);
    };
    let mut engine = engine_of(rules(Mode::Hedge(policy.clone(), ms(10)), 3, None), None);
    refused(&mut engine);
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Fatal(None),
            t0() + ms(20)
        ),
        Verdict::Return
    );
    let mut engine = engine_of(rules(Mode::Hedge(policy, ms(10)), 3, None), None);
    refused(&mut engine);
    let stop = Outcome::Retryable(Some(Pushback::Stop));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, stop, t0() + ms(20)),
        Verdict::Keep
    );
    assert_eq!(
        ended(poll(&mut engine, t0() + ms(20))),
        Some(End::Last(AttemptId::FIRST))
    );
}

#[test]
fn a_backup_the_throttle_refuses_costs_the_budget_nothing() {
    // Four calls at 50 %: two hedges in the budget. The A6 bucket is at half, so it refuses
    // every hedge; none is sent, and the budget keeps both.
    let (policy, budget) = budgeted(3, ms(10), 0.5);
    let throttle = Throttle::new(10, 0.1).unwrap();
    for _ in 0..5 {
        throttle.on_failure();
    }
    let handle = Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let rules = || rules(Mode::Hedge(policy.clone(), ms(10)), 3, handle.clone());
    let mut engines: Vec<Engine> = (0..4).map(|_| engine_of(rules(), None)).collect();
    for engine in &mut engines {
        poll(engine, t0());
        let Action::Send(send) = poll(engine, t0() + ms(10)) else {
            panic!("the hedge is due")
        };
        assert_eq!(admit(engine, send), Admission::Refused);
        assert_eq!(engine.extra().map(|e| e.hedges_over_budget), None);
    }
    assert_eq!(budget.remaining(), 2);
    // Once the bucket is above half again, the backups take their hedges from the budget.
    throttle.on_success();
    let mut engines: Vec<Engine> = (0..3).map(|_| engine_of(rules(), None)).collect();
    let mut sends = 0;
    for engine in &mut engines {
        poll(engine, t0());
        let Action::Send(send) = poll(engine, t0() + ms(10)) else {
            panic!("the hedge is due")
        };
        sends += usize::from(admit(engine, send) == Admission::Send);
    }
    // Three more calls earned 1.5: 3.5 in all, rounded down to 3.
    assert_eq!((sends, budget.remaining()), (3, 0));
}
