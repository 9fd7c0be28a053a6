//! Attempts that could not connect (with and without wait-for-ready), and the hedge budget.

use super::*;

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
        poll(&mut engine, t0() + ms(300)),
        Action::End(End::Last(third))
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
    let budget = crate::throttle::HedgeBudget::new(Duration::from_secs(10), 0, 0.5).unwrap();
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
    assert_eq!(first.admit(send), Admission::Send);
    let Action::Send(send) = poll(&mut second, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    assert_eq!(second.admit(send), Admission::OverBudget);
    // No more hedges for this call: it waits on its first attempt.
    assert_eq!(poll(&mut second, t0() + ms(10)), Action::Wait(None));
    assert_eq!(second.extra().map(|e| e.hedges_over_budget), Some(1));
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
