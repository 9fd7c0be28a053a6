//! The seams the engine owns: the commit, the winner, the end, and what a result carries.

use super::*;

#[test]
fn a_body_committed_to_the_attempt_that_fails_in_the_same_poll_returns_that_failure() {
    let mut engine = recorded(rules(Mode::Retry(retry_policy(|b| b)), 5, None), None);
    // The body's source failed while attempt 1 read it; attempt 1 answered 503.
    engine.on_commit(1);
    fails_at_once_with_its_first_attempt(&mut engine);
}

#[test]
fn a_hedged_call_committed_to_one_attempt_ends_when_it_and_another_fail_together() {
    let mut engine = recorded(hedge_rules(3, ms(0)), None);
    let Action::Send(send) = poll(&mut engine, t0()) else {
        panic!("the hedge goes at once")
    };
    let second = sent(&mut engine, send, t0());
    engine.on_commit(u64::from(second.send));
    // Both fail in the same poll, before the driver has dropped the cut-off attempt.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0()),
        Verdict::Drop
    );
    assert_eq!(answer(&mut engine, second, RETRYABLE, t0()), Verdict::Keep);
    // The attempt committed to has answered: every other one goes.
    assert_eq!(poll(&mut engine, t0()), Action::Cancel(None));
    assert_eq!(ended(poll(&mut engine, t0())), Some(End::Last(second)));
}

#[test]
fn an_answer_loses_to_the_attempt_the_body_committed_to_first() {
    let mut engine = recorded(hedge_rules(3, ms(0)), None);
    let Action::Send(send) = poll(&mut engine, t0()) else {
        panic!()
    };
    let second = sent(&mut engine, send, t0());
    // The body committed to attempt 1's reader in the transport's task; attempt 2's
    // headers arrive before the call hears of it.
    assert_eq!(
        answer_with(&mut engine, second, Outcome::Success, &CommittedTo(1)),
        Verdict::Drop
    );
    assert!(engine.is_live(AttemptId::FIRST.send));
    assert_eq!(
        answer_with(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Success,
            &CommittedTo(1)
        ),
        Verdict::Return
    );
}

#[test]
fn a_body_sent_once_is_never_hedged_and_its_attempt_goes_on() {
    let mut engine = Engine::new(hedge_rules(3, ms(20)), None, BodyKind::Once, 0, None);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(None));
    assert_eq!(poll(&mut engine, t0() + ms(20)), Action::Wait(None));
    assert!(engine.is_live(AttemptId::FIRST.send));
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Success,
            t0() + ms(100)
        ),
        Verdict::Return
    );
}

#[test]
fn a_body_sent_once_fails_at_once_without_asking_the_hook_or_the_throttle() {
    let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let hook_asked = Arc::clone(&asked);
    let policy = retry_policy(move |b| {
        b.on_retry(move |_| {
            hook_asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            RetryDecision::Proceed
        })
    });
    let throttle = Counting::default();
    let handle = Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut engine = Engine::new(
        rules(Mode::Retry(policy), 5, handle),
        None,
        BodyKind::Once,
        0,
        None,
    );
    fails_at_once_with_its_first_attempt(&mut engine);
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(throttle.asked(), 0);
}

#[test]
fn the_result_carries_its_own_attempts_count_transparent_resends_excluded() {
    let mut engine = engine_of(
        waiting(rules(Mode::Retry(retry_policy(|b| b)), 5, None)),
        None,
    );
    answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0());
    let Action::Send(resend) = poll(&mut engine, t0() + ms(100)) else {
        panic!()
    };
    let second = sent(&mut engine, resend, t0() + ms(100));
    let marks = returned(&mut engine, second);
    assert_eq!((marks.attempts, marks.previous), (Attempts::new(2, 1), 0));
    // A hedged call's result counts every attempt made (A6), though the second of three
    // counted attempts won.
    let mut engine = engine_of(hedge_rules(3, ms(0)), None);
    let mut ids = vec![AttemptId::FIRST];
    for _ in 0..2 {
        let Action::Send(send) = poll(&mut engine, t0()) else {
            panic!()
        };
        ids.push(sent(&mut engine, send, t0()));
    }
    assert_eq!(returned(&mut engine, ids[1]).previous, 2);
}

/// The marks the answer of `id`, a success, is returned with.
fn returned(engine: &mut Engine, id: AttemptId) -> AttemptMarks {
    let headers = HeaderMap::new();
    let result = AttemptResult::Response {
        status: StatusCode::OK,
        headers: &headers,
    };
    let verdict = at(t0() + ms(100), |inputs| {
        engine.on_outcome(id, Outcome::Success, result, &Unrecorded, inputs)
    });
    let crate::engine::Verdict::Return(marks) = verdict else {
        panic!("{verdict:?} is not a return")
    };
    marks
}

#[test]
fn a_hedge_that_cannot_start_before_the_deadline_fails_the_call_at_once() {
    let mut engine = engine_of(hedge_rules(3, ms(100)), Some(t0() + ms(50)));
    poll(&mut engine, t0());
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(80))));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, pushback, t0() + ms(10)),
        Verdict::Keep
    );
    // The next hedge would go at 90 ms, past the 50 ms deadline: nothing in flight, so the
    // failure is returned now rather than at the deadline.
    assert_eq!(
        ended(poll(&mut engine, t0() + ms(10))),
        Some(End::Last(AttemptId::FIRST))
    );
}

#[test]
fn a_service_error_with_an_attempt_in_flight_waits_for_that_attempt() {
    let mut engine = engine_of(hedge_rules(3, ms(10)), Some(t0() + ms(500)));
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    let failed = at(t0() + ms(10), |i| engine.admit(send, Readiness::Failed, i));
    assert_eq!(failed, Admission::Refused, "the first attempt is in flight");
    assert_eq!(
        poll(&mut engine, t0() + ms(10)),
        Action::Wait(Some(t0() + ms(500)))
    );
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Success,
            t0() + ms(20)
        ),
        Verdict::Return
    );
    // With nothing in flight, the service's error is the call's, marked with its attempts.
    let mut engine = engine_of(hedge_rules(3, ms(10)), None);
    poll(&mut engine, t0());
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0());
    let Action::Send(send) = poll(&mut engine, t0()) else {
        panic!("the next hedge goes at once")
    };
    let failed = at(t0(), |i| engine.admit(send, Readiness::Failed, i));
    let Admission::Failed(marks) = failed else {
        panic!("{failed:?}: the call ends with the service's error")
    };
    assert_eq!((marks.attempts.sent(), marks.previous), (1, 0));
}

#[test]
fn a_send_whose_service_is_not_ready_wakes_the_call_only_for_what_comes_later() {
    let mut engine = engine_of(hedge_rules(3, ms(10)), Some(t0() + ms(500)));
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    // The due hedge is not a reason to wake: the service wakes the call when it is ready.
    let pending = at(t0() + ms(15), |i| engine.admit(send, Readiness::Pending, i));
    assert_eq!(pending, Admission::Wait(Some(t0() + ms(500))));
    // Still due, and sent once the service is ready.
    assert_eq!(poll(&mut engine, t0() + ms(15)), Action::Send(send));
    assert_eq!(admit(&mut engine, send), Admission::Send);
}

#[test]
fn a_call_s_books_close_once_with_what_was_not_posted() {
    let policies = crate::Policies::builder().build();
    let books = || Books {
        policies: &policies,
        route: None,
        path: "/svc.S/M",
        #[cfg(feature = "opentelemetry")]
        authority: None,
        #[cfg(feature = "opentelemetry")]
        extensions: None,
    };
    let retries = |policies: &crate::Policies| {
        let snapshot = policies.stats().snapshot();
        snapshot
            .methods
            .get("/svc.S/M")
            .map(|m| (m.retry_attempts, m.retry_failures))
    };
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, None), None);
    // A call of one attempt has nothing to post, and makes no entry in the statistics.
    engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, None), None).close(books);
    assert_eq!(retries(&policies), None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0()),
        Verdict::Keep
    );
    let Action::Wait(Some(due)) = poll(&mut engine, t0()) else {
        panic!("a backoff")
    };
    let Action::Send(send) = poll(&mut engine, due) else {
        panic!("the retry is due")
    };
    let second = sent(&mut engine, send, due);
    // The retry's failure ends the call before any poll posts what was recorded.
    let fatal = Outcome::Fatal(None);
    assert_eq!(answer(&mut engine, second, fatal, due), Verdict::Return);
    engine.close(books);
    assert_eq!(retries(&policies), Some((1, 1)));
    engine.close(books);
    assert_eq!(retries(&policies), Some((1, 1)), "nothing posted twice");
}

#[test]
fn a_hedge_asks_the_throttle_only_once_its_service_is_ready() {
    let throttle = Counting::default();
    let mut rules = hedge_rules(3, ms(10));
    rules.throttle = Some(Arc::new(throttle.clone()));
    let mut engine = engine_of(rules, None);
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(10)) else {
        panic!()
    };
    // The service is not ready: the driver waits, and asks the engine again later.
    assert!(matches!(poll(&mut engine, t0() + ms(11)), Action::Send(_)));
    assert_eq!(throttle.asked(), 0);
    assert_eq!(admit(&mut engine, send), Admission::Send);
    assert_eq!(
        admit(&mut engine, send),
        Admission::Send,
        "asked once per attempt"
    );
    assert_eq!(throttle.asked(), 1);
}

#[test]
fn the_deadline_wins_over_an_answer_ready_in_the_same_poll() {
    let mut engine = retry_engine(retry_policy(|b| b), Some(t0() + ms(50)));
    poll(&mut engine, t0());
    // The timer fired and the attempt answered in the same poll: the driver tells the
    // engine's inputs of the timer before it reports the answer.
    let headers = HeaderMap::new();
    let result = AttemptResult::Response {
        status: StatusCode::OK,
        headers: &headers,
    };
    let verdict = at(t0() + ms(50), |inputs| {
        inputs.timer_fired();
        Verdict::from(engine.on_outcome(
            AttemptId::FIRST,
            Outcome::Success,
            result,
            &Unrecorded,
            inputs,
        ))
    });
    assert_eq!(verdict, Verdict::Drop);
    assert_eq!(
        ended(poll(&mut engine, t0() + ms(50))),
        Some(End::DeadlineExceeded)
    );
}

#[test]
fn a_call_waiting_on_its_attempts_with_nothing_timed_reads_no_clock() {
    let t0 = Instant::now();
    let reads = std::cell::Cell::new(0);
    let read = || {
        reads.set(reads.get() + 1);
        t0
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let mut poll_counting = |engine: &mut Engine| engine.poll(&mut Inputs::new(&read, &mut rng));

    let plain = || rules(Mode::Retry(retry_policy(|b| b)), 5, None);
    let mut engine = engine_of(plain(), None);
    assert_eq!(poll_counting(&mut engine), Action::Wait(None));
    assert_eq!(poll_counting(&mut engine), Action::Wait(None));
    assert_eq!(reads.get(), 0, "nothing timed: no clock read");

    // Each of the timed cases still reads the time: a deadline, a per-attempt timeout (set
    // at the start, and waited for after it), a hedge.
    let mut engine = engine_of(plain(), Some(t0 + ms(1000)));
    assert_eq!(
        poll_counting(&mut engine),
        Action::Wait(Some(t0 + ms(1000)))
    );
    assert_eq!(reads.get(), 1);
    let timed = retry_policy(|b| b.per_attempt_timeout(ms(300)));
    let mut engine = engine_of(rules(Mode::Retry(timed), 5, None), None);
    assert_eq!(poll_counting(&mut engine), Action::Wait(Some(t0 + ms(300))));
    assert_eq!(poll_counting(&mut engine), Action::Wait(Some(t0 + ms(300))));
    assert_eq!(reads.get(), 3);
    let mut engine = engine_of(hedge_rules(3, ms(50)), None);
    assert_eq!(poll_counting(&mut engine), Action::Wait(Some(t0 + ms(50))));
    assert_eq!(reads.get(), 4);
}

#[test]
fn the_engine_records_what_the_statistics_count_retries_sent_and_failed() {
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, None), None);
    assert_eq!(
        engine.take_records(),
        None,
        "a first attempt is not a retry"
    );
    let stats = crate::stats::MethodStats::default();
    let mut now = t0();
    let mut id = AttemptId::FIRST;
    for _ in 0..2 {
        assert_eq!(answer(&mut engine, id, RETRYABLE, now), Verdict::Keep);
        let Action::Wait(Some(at)) = poll_posting(&mut engine, now, &stats) else {
            panic!("a backoff")
        };
        now = at;
        let Action::Send(send) = poll_posting(&mut engine, now, &stats) else {
            panic!("the retry is due")
        };
        id = sent(&mut engine, send, now);
        // The engine posts the retry it sent before it says what to do next.
        assert_eq!(poll_posting(&mut engine, now, &stats), Action::Wait(None));
    }
    assert_eq!(
        answer(&mut engine, id, Outcome::Success, now),
        Verdict::Return
    );
    assert_eq!(engine.take_records(), None);
    let snapshot = stats.snapshot();
    // Two retries sent (the 1st and 2nd), one failed: the first attempt is not a retry.
    assert_eq!(snapshot.retry_attempts, 2);
    assert_eq!(snapshot.retry_failures, 1);
    assert_eq!(snapshot.histogram[..2], [1, 1]);
}

#[test]
fn an_attempt_tells_a_grpc_server_the_attempts_before_it_and_the_time_left() {
    let mut engine = engine_of(hedge_rules(3, ms(100)), Some(t0() + ms(700)));
    let first = engine.attempt_headers(1, t0());
    assert_eq!(first.previous, None);
    assert_eq!(
        first.timeout.as_ref().map(|t| t.to_str().unwrap()),
        Some("700m")
    );
    let third = engine.attempt_headers(3, t0() + ms(500));
    assert_eq!(
        third.previous.as_ref().map(|p| p.to_str().unwrap()),
        Some("2")
    );
    assert_eq!(
        third.timeout.as_ref().map(|t| t.to_str().unwrap()),
        Some("200m")
    );
    // Past the deadline: nothing left, never a negative time.
    let late = engine.attempt_headers(2, t0() + ms(900));
    assert_eq!(
        late.timeout.as_ref().map(|t| t.to_str().unwrap()),
        Some("0n")
    );
    // Not gRPC: nothing to tell.
    let mut rules = hedge_rules(3, ms(100));
    rules.grpc = false;
    engine = engine_of(rules, Some(t0() + ms(700)));
    let headers = engine.attempt_headers(2, t0());
    assert!(headers.previous.is_none() && headers.timeout.is_none());
}

#[test]
fn the_engine_classifies_an_answer_by_the_call_s_policy() {
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, None), None);
    let answer = |engine: &mut Engine, id, code: &'static str, now| {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", http::HeaderValue::from_static(code));
        let result = AttemptResult::Response {
            status: StatusCode::OK,
            headers: &headers,
        };
        at(now, |inputs| {
            let (verdict, outcome) = engine.on_answer(id, result, &Unrecorded, inputs);
            (Verdict::from(verdict), outcome)
        })
    };
    // UNAVAILABLE is in the policy's retryable codes: kept, and retried.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, "14", t0()),
        (Verdict::Keep, Outcome::Retryable(None))
    );
    let Action::Wait(Some(at)) = poll(&mut engine, t0()) else {
        panic!("a backoff")
    };
    let Action::Send(send) = poll(&mut engine, at) else {
        panic!("the retry is due")
    };
    let second = sent(&mut engine, send, at);
    // INVALID_ARGUMENT is not: the call ends with it.
    assert_eq!(
        answer(&mut engine, second, "3", at),
        (Verdict::Return, Outcome::Fatal(None))
    );
}

/// The engine feeds an adaptive hedging delay the latency of the answer it returns, from
/// the attempt's send to the answer, read from the inputs: a server's answer is a sample, a
/// transport error is not, nor an answer that does not end the call.
#[test]
fn the_engine_feeds_an_adaptive_delay_the_latency_of_the_answer_it_returns() {
    use crate::latency::AdaptiveDelay;

    let adaptive = || {
        AdaptiveDelay::builder()
            .min_samples(1)
            .bounds(ms(1), ms(10_000))
            .fallback(ms(5))
            .build()
            .unwrap()
    };
    let hedged = |delay: &AdaptiveDelay| {
        let policy = HedgePolicy::builder()
            .max_attempts(3)
            .adaptive_delay(delay.clone())
            .non_fatal(GrpcCodes::from([Code::Unavailable]))
            .build()
            .unwrap();
        rules(Mode::Hedge(Arc::new(policy), ms(5)), 3, None)
    };
    let error = std::io::Error::other("reset");
    let headers = HeaderMap::new();
    let response = AttemptResult::Response {
        status: StatusCode::OK,
        headers: &headers,
    };
    let start = t0();
    // The delay's histogram keeps 8 buckets per power of two: 40 ms is counted in the
    // bucket that ends at 40.96 ms, 30 ms in the one that ends at 30.72 ms.
    let sample_of = |delay: &AdaptiveDelay| delay.current_at((start + ms(100)).into());

    // A server's answer, 40 ms after the first attempt went: one sample of 40 ms.
    let delay = adaptive();
    let mut engine = Engine::new(hedged(&delay), None, BodyKind::Clones, 1, Some(start));
    let verdict = at(start + ms(40), |inputs| {
        Verdict::from(engine.on_outcome(
            AttemptId::FIRST,
            Outcome::Success,
            response,
            &Unrecorded,
            inputs,
        ))
    });
    assert_eq!(verdict, Verdict::Return);
    assert_eq!(sample_of(&delay), Duration::from_micros(40_960));

    // A later attempt's latency runs from its own send.
    let delay = adaptive();
    let mut engine = Engine::new(hedged(&delay), None, BodyKind::Clones, 1, Some(start));
    let Action::Wait(Some(due)) = poll(&mut engine, start) else {
        panic!("waits for the hedging delay");
    };
    let Action::Send(send) = poll(&mut engine, due) else {
        panic!("sends the hedge when its delay has passed");
    };
    let second = sent(&mut engine, send, due);
    let verdict = at(due + ms(30), |inputs| {
        Verdict::from(engine.on_outcome(second, Outcome::Success, response, &Unrecorded, inputs))
    });
    assert_eq!(verdict, Verdict::Return);
    assert_eq!(sample_of(&delay), Duration::from_micros(30_720));

    // A gRPC status given without headers is the server's answer too.
    let delay = adaptive();
    let mut engine = Engine::new(hedged(&delay), None, BodyKind::Clones, 1, Some(start));
    let verdict = at(start + ms(40), |inputs| {
        let result = AttemptResult::Status {
            code: Code::Internal,
            pushback: None,
        };
        let fatal = Outcome::Fatal(None);
        Verdict::from(engine.on_outcome(AttemptId::FIRST, fatal, result, &Unrecorded, inputs))
    });
    assert_eq!(verdict, Verdict::Return);
    assert_eq!(sample_of(&delay), Duration::from_micros(40_960));

    // A transport error that ends the call is no sample (the fallback stays), and neither is
    // a failure the call keeps.
    let delay = adaptive();
    let mut engine = Engine::new(hedged(&delay), None, BodyKind::Clones, 1, Some(start));
    let verdict = at(start + ms(40), |inputs| {
        let result = AttemptResult::Error(&error);
        Verdict::from(engine.on_outcome(
            AttemptId::FIRST,
            Outcome::Fatal(None),
            result,
            &Unrecorded,
            inputs,
        ))
    });
    assert_eq!(verdict, Verdict::Return);
    assert_eq!(sample_of(&delay), ms(5));
    let mut engine = Engine::new(hedged(&delay), None, BodyKind::Clones, 1, Some(start));
    let verdict = at(start + ms(40), |inputs| {
        Verdict::from(engine.on_outcome(AttemptId::FIRST, RETRYABLE, response, &Unrecorded, inputs))
    });
    assert_eq!(verdict, Verdict::Keep);
    assert_eq!(sample_of(&delay), ms(5));
}
