//! Attempts a call no longer needs, past the table's limit of stream resets: let finish on a
//! task of their own, their answers dropped, instead of being reset (see
//! `PoliciesBuilder::resets_per_second`).

use super::*;

/// A hedging policy of 2 attempts 10 ms apart for `test.Echo`, with `limit` resets a second.
fn limited(limit: Option<u32>) -> Policies {
    Policies::builder()
        .service(SERVICE, hedge(2, 10))
        .resets_per_second(limit)
        .build()
}

/// A call whose first attempt loses to its hedge: gives the first attempt, still held by the
/// test, once the call has returned the hedge's answer.
async fn first_loses(svc: &Hedge<Probe>, arrivals: &mut mpsc::UnboundedReceiver<Probed>) -> Probed {
    let call = tokio::spawn(svc.clone().oneshot(grpc_request()));
    let first = next_probe(arrivals).await;
    let hedge = next_probe(arrivals).await;
    assert_eq!(hedge.number(), 2);
    hedge.answer(grpc_ok());
    let response = call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some("2"));
    // Let a task the loser was handed to run.
    tokio::task::yield_now().await;
    first
}

fn method_stats(policies: &Policies) -> tower_retry_hedge::stats::MethodSnapshot {
    policies.stats().snapshot().methods[METHOD]
}

#[tokio::test(start_paused = true)]
async fn past_the_limit_a_loser_is_let_finish_and_its_answer_dropped() {
    // Eight resets a second, in bursts of two.
    let policies = limited(Some(8));
    let (probe, mut arrivals) = Probe::new();
    let svc = HedgeLayer::new(policies.clone()).layer(probe);

    // The first two losers are cancelled at once, as A6 says.
    for _ in 0..2 {
        let first = first_loses(&svc, &mut arrivals).await;
        assert!(first.cancelled(), "a loser within the limit is reset");
    }
    // The next two are let finish: still running, until their server answers.
    let third = first_loses(&svc, &mut arrivals).await;
    let fourth = first_loses(&svc, &mut arrivals).await;
    assert!(!third.cancelled() && !fourth.cancelled());
    assert_eq!(method_stats(&policies).attempts_let_finish, 2);
    let (third_cancelled, fourth_cancelled) = (third.cancelled.clone(), fourth.cancelled.clone());
    third.answer(grpc_ok());
    fourth.answer(trailers_only(Code::Unavailable, None));
    tokio::task::yield_now().await;
    assert!(
        !third_cancelled.load(Ordering::SeqCst) && !fourth_cancelled.load(Ordering::SeqCst),
        "they ended with their answers, unreset"
    );

    // A second later the limit has room again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fifth = first_loses(&svc, &mut arrivals).await;
    assert!(fifth.cancelled());
    let stats = method_stats(&policies);
    assert_eq!((stats.attempts_let_finish, stats.resets_over_limit), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn a_loser_let_finish_is_reset_after_ten_seconds_or_a_second_past_the_deadline() {
    // No resets at all: every loser is let finish.
    let policies = limited(Some(0));
    let (probe, mut arrivals) = Probe::new();
    let svc = HedgeLayer::new(policies.clone()).layer(probe);
    let start = Instant::now();
    let first = first_loses(&svc, &mut arrivals).await;
    assert!(!first.cancelled());
    sleep_until(start + ms(10) + Duration::from_secs(10) - ms(1)).await;
    assert!(!first.cancelled(), "still let finish");
    sleep_until(start + ms(10) + Duration::from_secs(10)).await;
    tokio::task::yield_now().await;
    assert!(
        first.cancelled(),
        "reset after all, 10 s after it was stopped"
    );

    // With a deadline (200 ms), a second past it.
    let start = Instant::now();
    let mut request = grpc_request();
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("200m"));
    let call = tokio::spawn(svc.clone().oneshot(request));
    let first = next_probe(&mut arrivals).await;
    next_probe(&mut arrivals).await.answer(grpc_ok());
    call.await.unwrap().unwrap();
    sleep_until(start + ms(1199)).await;
    assert!(!first.cancelled());
    sleep_until(start + ms(1200)).await;
    tokio::task::yield_now().await;
    assert!(first.cancelled());
    let stats = method_stats(&policies);
    assert_eq!(
        (
            stats.attempts_let_finish,
            stats.let_finish_cut_short,
            stats.resets_over_limit
        ),
        (2, 2, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_by_its_caller_cancels_every_attempt_whatever_the_limit() {
    let policies = limited(Some(0));
    let (probe, mut arrivals) = Probe::new();
    let svc = HedgeLayer::new(policies).layer(probe);
    let call = tokio::spawn(svc.oneshot(grpc_request()));
    let first = next_probe(&mut arrivals).await;
    let second = next_probe(&mut arrivals).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert!(first.cancelled() && second.cancelled());
}

#[tokio::test(start_paused = true)]
async fn without_a_limit_every_loser_is_cancelled_at_once() {
    let policies = limited(None);
    let (probe, mut arrivals) = Probe::new();
    let svc = HedgeLayer::new(policies.clone()).layer(probe);
    for call in 0..100 {
        let first = first_loses(&svc, &mut arrivals).await;
        assert!(first.cancelled(), "call {call}");
    }
    let stats = method_stats(&policies);
    assert_eq!((stats.attempts_let_finish, stats.resets_over_limit), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ending_a_call_lets_its_attempts_finish_past_the_limit() {
    // A call that ends with DEADLINE_EXCEEDED stops every attempt in flight; past the limit,
    // they are let finish (their servers enforce the same deadline).
    let policies = limited(Some(0));
    let (probe, mut arrivals) = Probe::new();
    let svc = HedgeLayer::new(policies.clone()).layer(probe);
    let mut request = grpc_request();
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("50m"));
    let start = Instant::now();
    let call = tokio::spawn(svc.oneshot(request));
    let first = next_probe(&mut arrivals).await;
    let second = next_probe(&mut arrivals).await;
    let error = call.await.unwrap().unwrap_err();
    assert!(is_deadline_exceeded(&error), "{error}");
    assert_eq!(Instant::now() - start, ms(50));
    tokio::task::yield_now().await;
    assert!(!first.cancelled() && !second.cancelled());
    assert_eq!(method_stats(&policies).attempts_let_finish, 2);
    first.answer(grpc_ok());
    second.answer(grpc_ok());
}
