//! gRFC A6's rules: backoff, pushback, the throttle, transparent retries, hedging, the
//! deadline and the per-attempt timeout.

use super::*;

#[test]
fn a_success_returns_at_once_and_credits_the_throttle() {
    let throttle = Throttle::new(10, 0.5).unwrap();
    for _ in 0..4 {
        throttle.on_failure();
    }
    let before = throttle.tokens_milli();
    let mut engine = engine_of(
        rules(
            Mode::Retry(retry_policy(|b| b)),
            5,
            Some(Arc::new(throttle.clone())),
        ),
        None,
    );
    let t = Clock(Instant::now());
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::Success, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(throttle.tokens_milli(), before + 500);
}

#[test]
fn backoff_is_min_of_initial_times_multiplier_and_max() {
    // 100, 200, 400, 800 ms: the fifth attempt's wait would be 1600, capped at 1000.
    let mut engine = retry_engine(retry_policy(|b| b.max_attempts(5)), None);
    let t = Clock(Instant::now());
    let mut now = t.at(ms(0));
    let mut id = AttemptId::FIRST;
    for expected in [100, 200, 400, 800] {
        assert_eq!(answer(&mut engine, id, RETRYABLE, now), Verdict::Keep);
        assert_eq!(
            poll(&mut engine, now),
            Action::Wait(Some(now + ms(expected)))
        );
        now += ms(expected);
        let Action::Send(send) = poll(&mut engine, now) else {
            panic!("a retry is due");
        };
        id = sent(&mut engine, send, now);
    }
    assert_eq!(id.number, 5);
    assert_eq!(answer(&mut engine, id, RETRYABLE, now), Verdict::Keep);
    assert!(ends_with_last(poll(&mut engine, now)));
}

#[test]
fn backoff_with_max_below_initial_and_a_shrinking_multiplier() {
    let schedule = Exponential::a6(
        Duration::from_secs(2),
        Duration::from_secs(1),
        0.5,
        Jitter::None,
    )
    .unwrap();
    let delays: Vec<_> = (0..3).map(|n| schedule.base_delay(n)).collect();
    assert_eq!(
        delays,
        [Duration::from_secs(1), Duration::from_secs(1), ms(500)]
    );
}

#[test]
fn pushback_is_waited_exactly_and_restarts_the_backoff() {
    let mut engine = retry_engine(retry_policy(|b| b), None);
    let t = Clock(Instant::now());
    // A backoff step first (100 ms), then a pushback of 250 ms, then backoff from 100 again.
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    let Action::Send(send) = poll(&mut engine, t.at(ms(100))) else {
        panic!()
    };
    let second = sent(&mut engine, send, t.at(ms(100)));
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(250))));
    answer(&mut engine, second, pushback, t.at(ms(110)));
    assert_eq!(
        poll(&mut engine, t.at(ms(110))),
        Action::Wait(Some(t.at(ms(360))))
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(360))) else {
        panic!()
    };
    let third = sent(&mut engine, send, t.at(ms(360)));
    answer(&mut engine, third, RETRYABLE, t.at(ms(370)));
    assert_eq!(
        poll(&mut engine, t.at(ms(370))),
        Action::Wait(Some(t.at(ms(470))))
    );
}

#[test]
fn pushback_stop_and_pushback_over_the_cap_stop_retries() {
    for pushback in [Pushback::Stop, Pushback::After(Duration::from_secs(3600))] {
        let mut engine = retry_engine(retry_policy(|b| b), None);
        let t = Clock(Instant::now());
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Retryable(Some(pushback)),
            t.at(ms(0)),
        );
        assert!(ends_with_last(poll(&mut engine, t.at(ms(0)))));
    }
}

#[test]
fn a_fatal_pushback_over_the_cap_does_not_debit_the_throttle() {
    let throttle = Throttle::new(10, 0.1).unwrap();
    let handle = || Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, handle()), None);
    let t = Clock(Instant::now());
    let long = Outcome::Fatal(Some(Pushback::After(Duration::from_secs(3600))));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, long, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(throttle.tokens_milli(), 10_000);
    // The server's own "do not retry" on a fatal code does count (A6).
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, handle()), None);
    let stop = Outcome::Fatal(Some(Pushback::Stop));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, stop, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(throttle.tokens_milli(), 9_000);
}

#[test]
fn a_hook_may_lengthen_a_delay_but_never_shorten_a_pushback() {
    let policy = retry_policy(|b| b.on_retry(|_| RetryDecision::Delay(ms(10))));
    let mut engine = retry_engine(policy, None);
    let t = Clock(Instant::now());
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(250))));
    answer(&mut engine, AttemptId::FIRST, pushback, t.at(ms(0)));
    assert_eq!(
        poll(&mut engine, t.at(ms(0))),
        Action::Wait(Some(t.at(ms(250))))
    );
    // Without a pushback, the hook's delay stands (here shorter than the backoff).
    let policy = retry_policy(|b| b.on_retry(|_| RetryDecision::Delay(ms(10))));
    let mut engine = retry_engine(policy, None);
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    assert_eq!(
        poll(&mut engine, t.at(ms(0))),
        Action::Wait(Some(t.at(ms(10))))
    );
}

#[test]
fn fail_fast_when_the_next_attempt_cannot_start_before_the_deadline() {
    let t = Clock(Instant::now());
    let mut engine = retry_engine(retry_policy(|b| b), Some(t.at(ms(50))));
    // The backoff (100 ms) ends after the deadline: the failure is returned now.
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    assert!(ends_with_last(poll(&mut engine, t.at(ms(0)))));
}

#[test]
fn the_deadline_ends_the_call() {
    let t = Clock(Instant::now());
    let mut engine = retry_engine(retry_policy(|b| b), Some(t.at(ms(50))));
    assert_eq!(
        poll(&mut engine, t.at(ms(0))),
        Action::Wait(Some(t.at(ms(50))))
    );
    assert_eq!(
        ended(poll(&mut engine, t.at(ms(50)))),
        Some(End::DeadlineExceeded)
    );
}

#[test]
fn never_sent_attempts_back_off_until_the_deadline_and_do_not_count() {
    let t = Clock(Instant::now());
    let policy = retry_policy(|b| b.max_attempts(2));
    let rules = waiting(rules(Mode::Retry(policy), 2, None));
    let mut engine = engine_of(rules, Some(t.at(ms(1000))));
    let mut id = AttemptId::FIRST;
    let mut now = t.at(ms(0));
    // Backoff 100, 200, 400 ms; the fourth (800 ms) would end past the deadline.
    for expected in [100, 200, 400] {
        answer(&mut engine, id, Outcome::NotSent, now);
        assert_eq!(
            poll(&mut engine, now),
            Action::Wait(Some(now + ms(expected)))
        );
        now += ms(expected);
        let Action::Send(send) = poll(&mut engine, now) else {
            panic!()
        };
        assert!(send.transparent);
        assert_eq!(send.number, 1, "a resend repeats the attempt it replaces");
        id = sent(&mut engine, send, now);
    }
    answer(&mut engine, id, Outcome::NotSent, now);
    assert!(ends_with_last(poll(&mut engine, now)));
    assert_eq!(engine.attempts(), Attempts::new(4, 3));
}

#[test]
fn never_sent_then_unavailable_then_ok_numbers_the_third_send_1() {
    let t = Clock(Instant::now());
    let mut engine = engine_of(
        waiting(rules(Mode::Retry(retry_policy(|b| b)), 5, None)),
        None,
    );
    answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(100))) else {
        panic!()
    };
    let second = sent(&mut engine, resend, t.at(ms(100)));
    // `grpc-previous-rpc-attempts` is `number - 1`: absent on the transparent resend.
    assert_eq!(second.number, 1);
    answer(&mut engine, second, RETRYABLE, t.at(ms(100)));
    let Action::Send(retry) = poll(&mut engine, t.at(ms(200))) else {
        panic!()
    };
    let third = sent(&mut engine, retry, t.at(ms(200)));
    assert_eq!(third.number - 1, 1);
    assert_eq!(
        answer(&mut engine, third, Outcome::Success, t.at(ms(200))),
        Verdict::Return
    );
    assert_eq!(engine.attempts(), Attempts::new(3, 1));
}

#[test]
fn a_refusal_is_resent_once_at_once_and_a_second_is_judged_by_the_policy() {
    let t = Clock(Instant::now());
    // Retryable codes [ABORTED]: the second refusal maps to UNAVAILABLE, which is final.
    let policy = retry_policy(|b| b.retryable(GrpcCodes::from([Code::Aborted])));
    let mut engine = retry_engine(policy, None);
    answer(&mut engine, AttemptId::FIRST, Outcome::Refused, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(0))) else {
        panic!("resent at once")
    };
    assert!(resend.transparent);
    let second = sent(&mut engine, resend, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, second, Outcome::Refused, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(engine.attempts().sent(), 2);
    // With UNAVAILABLE retryable, the second refusal is retried as a counted attempt.
    let mut engine = retry_engine(retry_policy(|b| b), None);
    answer(&mut engine, AttemptId::FIRST, Outcome::Refused, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(0))) else {
        panic!()
    };
    let second = sent(&mut engine, resend, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, second, Outcome::Refused, t.at(ms(0))),
        Verdict::Keep
    );
    let Action::Send(retry) = poll(&mut engine, t.at(ms(100))) else {
        panic!()
    };
    assert!(!retry.transparent);
}

#[test]
fn transparent_retries_apply_without_a_policy() {
    let t = Clock(Instant::now());
    let mut engine = engine_of(rules(Mode::Single, 1, None), None);
    answer(&mut engine, AttemptId::FIRST, Outcome::Refused, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(0))) else {
        panic!()
    };
    assert!(resend.transparent);
    let second = sent(&mut engine, resend, t.at(ms(0)));
    // Any other failure is final.
    assert_eq!(
        answer(&mut engine, second, Outcome::Fatal(None), t.at(ms(0))),
        Verdict::Return
    );
}

#[test]
fn a_non_idempotent_request_is_not_repeated() {
    let t = Clock(Instant::now());
    let mut rules = rules(Mode::Retry(retry_policy(|b| b)), 5, None);
    rules.may_repeat = false;
    let mut engine = engine_of(rules, None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0))),
        Verdict::Return
    );
}

#[test]
fn throttled_retries_stop() {
    let throttle = Throttle::new(2, 0.1).unwrap();
    let handle = Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, handle), None);
    let t = Clock(Instant::now());
    // 2 tokens: one failure leaves 1, not above half: no retry.
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    assert!(ends_with_last(poll(&mut engine, t.at(ms(0)))));
}

#[test]
fn hedges_go_every_delay_from_the_first_poll() {
    let t = Clock(Instant::now());
    let mut engine = hedge_engine(3, ms(500), None);
    assert_eq!(
        poll(&mut engine, t.at(ms(1))),
        Action::Wait(Some(t.at(ms(501))))
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(501))) else {
        panic!()
    };
    assert!(send.hedge && send.number == 2);
    sent(&mut engine, send, t.at(ms(501)));
    assert_eq!(
        poll(&mut engine, t.at(ms(501))),
        Action::Wait(Some(t.at(ms(1001))))
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(1001))) else {
        panic!()
    };
    sent(&mut engine, send, t.at(ms(1001)));
    // maxAttempts reached: nothing more is scheduled.
    assert_eq!(poll(&mut engine, t.at(ms(1001))), Action::Wait(None));
}

#[test]
fn a_non_fatal_hedge_failure_sends_the_next_at_once_and_pushback_delays_it() {
    let t = Clock(Instant::now());
    let mut engine = hedge_engine(3, ms(500), None);
    poll(&mut engine, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(10))),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(10))) else {
        panic!("at once")
    };
    let second = sent(&mut engine, send, t.at(ms(10)));
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(100))));
    answer(&mut engine, second, pushback, t.at(ms(20)));
    assert_eq!(
        poll(&mut engine, t.at(ms(20))),
        Action::Wait(Some(t.at(ms(120))))
    );
}

#[test]
fn a_fatal_hedge_answer_is_returned_and_pushback_stop_ends_hedging() {
    let t = Clock(Instant::now());
    let mut engine = hedge_engine(3, ms(0), None);
    let Action::Send(send) = poll(&mut engine, t.at(ms(0))) else {
        panic!()
    };
    let second = sent(&mut engine, send, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, second, Outcome::Fatal(None), t.at(ms(1))),
        Verdict::Return
    );

    let mut engine = hedge_engine(3, ms(100), None);
    poll(&mut engine, t.at(ms(0)));
    let stop = Outcome::Retryable(Some(Pushback::Stop));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, stop, t.at(ms(1))),
        Verdict::Keep
    );
    // No more hedges, nothing in flight: the failure is returned.
    assert!(ends_with_last(poll(&mut engine, t.at(ms(1)))));
}

#[test]
fn hedges_need_the_throttle_above_half() {
    let throttle = Throttle::new(2, 0.1).unwrap();
    throttle.on_failure();
    let mut engine = hedge_engine(3, ms(10), Some(Arc::new(throttle)));
    poll(&mut engine, t0());
    // The hedge comes due; once its service is ready, the throttle refuses it: none is sent,
    // and the first goes on.
    let Action::Send(send) = poll(&mut engine, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    assert_eq!(admit(&mut engine, send), Admission::Refused);
    assert_eq!(poll(&mut engine, t0() + ms(10)), Action::Wait(None));
}

#[test]
fn a_commit_cancels_every_other_attempt_and_stops_new_ones() {
    let mut engine = hedge_engine(3, ms(0), None);
    let Action::Send(send) = poll(&mut engine, t0()) else {
        panic!()
    };
    let second = sent(&mut engine, send, t0());
    engine.on_commit(u64::from(second.send));
    assert_eq!(poll(&mut engine, t0()), Action::Cancel(Some(second)));
    assert!(!engine.is_live(AttemptId::FIRST.send) && engine.is_live(second.send));
    // The first attempt, cut off, answers with a body error: it means nothing.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0()),
        Verdict::Drop
    );
    assert_eq!(poll(&mut engine, t0()), Action::Wait(None));
    assert_eq!(answer(&mut engine, second, RETRYABLE, t0()), Verdict::Keep);
    assert!(ends_with_last(poll(&mut engine, t0())));
}

/// Plays a call whose first attempt, sent at `t0`, outlives its 50 ms per-attempt timeout:
/// the timer, the timeout, the 100 ms backoff (not a retry at once), and the retry, sent at
/// `t0 + 150 ms`.
fn first_attempt_times_out(engine: &mut Engine) -> AttemptId {
    assert_eq!(poll(engine, t0()), Action::Wait(Some(t0() + ms(50))));
    assert_eq!(
        poll(engine, t0() + ms(50)),
        Action::TimedOut(AttemptId::FIRST)
    );
    assert_eq!(
        poll(engine, t0() + ms(50)),
        Action::Wait(Some(t0() + ms(150)))
    );
    let Action::Send(send) = poll(engine, t0() + ms(150)) else {
        panic!("the retry is due")
    };
    assert!(!send.transparent && !send.hedge && send.number == 2);
    sent(engine, send, t0() + ms(150))
}

#[test]
fn a_per_attempt_timeout_cancels_the_attempt_and_retries() {
    let policy = retry_policy(|b| b.per_attempt_timeout(ms(50)));
    let mut engine = retry_engine(policy, None);
    first_attempt_times_out(&mut engine);
}

#[test]
fn hedging_on_the_per_attempt_timeout_keeps_the_slow_attempt() {
    let policy = retry_policy(|b| {
        b.per_attempt_timeout(ms(50))
            .hedge_on_per_attempt_timeout(true)
    });
    let mut engine = retry_engine(policy, None);
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(50)) else {
        panic!("hedged at once")
    };
    assert!(send.hedge);
    let second = sent(&mut engine, send, t0() + ms(50));
    // The slow first attempt's retryable answer was counted when it timed out: it is only
    // kept, to be returned if nothing better comes.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0() + ms(60)),
        Verdict::Keep
    );
    assert_eq!(
        answer(&mut engine, second, Outcome::Success, t0() + ms(70)),
        Verdict::Return
    );
}

#[test]
fn hedging_on_the_per_attempt_timeout_ends_with_the_last_slow_failure() {
    let policy = retry_policy(|b| {
        b.max_attempts(2)
            .per_attempt_timeout(ms(50))
            .hedge_on_per_attempt_timeout(true)
    });
    let mut engine = retry_engine(policy, None);
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(50)) else {
        panic!("hedged at once")
    };
    let second = sent(&mut engine, send, t0() + ms(50));
    poll(&mut engine, t0() + ms(100));
    // Both attempts timed out, and then failed: the call ends with the last failure, which
    // the driver kept, not with none at all.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0() + ms(110)),
        Verdict::Keep
    );
    assert_eq!(
        answer(&mut engine, second, RETRYABLE, t0() + ms(120)),
        Verdict::Keep
    );
    let Action::End(End::Last(last), _) = poll(&mut engine, t0() + ms(120)) else {
        panic!("the call ends")
    };
    assert_eq!(last, second);
}

/// The retry policy of `p.S` from a service config with a `perAttemptRecvTimeout` of
/// 50 ms, `maxAttempts` `max`, the backoff 100 ms × 2 without jitter, and these
/// `retryableStatusCodes`.
fn recv_timeout_policy(max: u32, codes: &str) -> Arc<RetryPolicy> {
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "p.S"}}],
            "retryPolicy": {{"maxAttempts": {max}, "initialBackoff": "0.1s",
                "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": {codes}, "perAttemptRecvTimeout": "0.05s"}}}}]}}"#
    );
    let config = crate::config::ServiceConfig::from_json(&json).unwrap();
    let policies = config.policies_builder_with(Jitter::None).build();
    match policies.lookup(&http::Method::POST, "/p.S/M") {
        Some(MethodPolicy::Retry(policy)) => policy.clone(),
        other => panic!("a retry policy, not {other:?}"),
    }
}

#[test]
fn per_attempt_recv_timeout_retries_after_the_backoff_whatever_the_codes() {
    // No retryable code at all: only the timeout is retried (C-core).
    let policy = recv_timeout_policy(5, "[]");
    let unavailable = policy.classifier().classify(AttemptResult::Status {
        code: Code::Unavailable,
        pushback: None,
    });
    let mut engine = retry_engine(policy, None);
    // Cancelled, then retried after the backoff, not at once.
    let second = first_attempt_times_out(&mut engine);
    // The next attempt's own status decides as usual: UNAVAILABLE is not retryable here.
    assert!(matches!(unavailable, Outcome::Fatal(_)), "{unavailable:?}");
    assert_eq!(
        answer(&mut engine, second, unavailable, t0() + ms(160)),
        Verdict::Return
    );
    assert_eq!(engine.attempts().sent(), 2);
}

#[test]
fn per_attempt_recv_timeout_stops_when_the_attempt_answers_in_time() {
    let mut engine = retry_engine(recv_timeout_policy(5, r#"["UNAVAILABLE"]"#), None);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(Some(t0() + ms(50))));
    // Response headers at 40 ms: the call is answered, whatever its body then takes.
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Success,
            t0() + ms(40)
        ),
        Verdict::Return
    );
    // Its timer is gone: nothing times out later.
    assert_eq!(poll(&mut engine, t0() + ms(1000)), Action::Wait(None));
    assert_eq!(engine.attempts().sent(), 1);
}

#[test]
fn per_attempt_recv_timeout_on_the_last_attempt_ends_the_call_with_it() {
    let mut engine = retry_engine(recv_timeout_policy(2, r#"["UNAVAILABLE"]"#), None);
    let second = first_attempt_times_out(&mut engine);
    assert_eq!(
        poll(&mut engine, t0() + ms(150)),
        Action::Wait(Some(t0() + ms(200)))
    );
    assert_eq!(poll(&mut engine, t0() + ms(200)), Action::TimedOut(second));
    // The timed-out attempt is the call's result (the drivers end a gRPC call CANCELLED).
    assert_eq!(
        ended(poll(&mut engine, t0() + ms(200))),
        Some(End::Last(second))
    );
}

#[test]
fn each_per_attempt_recv_timeout_is_a_failure_for_the_throttle() {
    // maxTokens 4: the first timeout leaves 3 (> 2, retried), the second 2 (not above half).
    let throttle = Throttle::new(4, 0.1).unwrap();
    let policy = recv_timeout_policy(5, r#"["UNAVAILABLE"]"#);
    let mut engine = engine_of(
        rules(Mode::Retry(policy), 5, Some(Arc::new(throttle.clone()))),
        None,
    );
    let second = first_attempt_times_out(&mut engine);
    poll(&mut engine, t0() + ms(150));
    assert_eq!(poll(&mut engine, t0() + ms(200)), Action::TimedOut(second));
    assert_eq!(
        ended(poll(&mut engine, t0() + ms(200))),
        Some(End::Last(second))
    );
    assert_eq!(engine.attempts().sent(), 2);
    assert_eq!(throttle.tokens_milli(), 2_000);
}
