//! The hedge budget that policies made from service-config JSON carry: A6's hedging for a
//! client that sends few calls, and a cap on what sustained slowness adds.

use super::*;

use tower_retry_hedge::ServiceConfig;
use tower_retry_hedge::throttle::HedgeBudget;

/// Service config for `test.Echo`: hedging, `max_attempts` attempts `delay` apart,
/// UNAVAILABLE non-fatal, and no throttle.
fn json_hedging(max_attempts: u32, delay: &str) -> Policies {
    let json = format!(
        r#"{{"methodConfig": [{{
            "name": [{{"service": "{SERVICE}"}}],
            "hedgingPolicy": {{
                "maxAttempts": {max_attempts},
                "hedgingDelay": "{delay}",
                "nonFatalStatusCodes": ["UNAVAILABLE"]
            }}
        }}]}}"#
    );
    ServiceConfig::from_json(&json).expect("valid").policies()
}

/// A service whose every attempt answers as `answer` says for the attempt's number (1 for
/// the first), after `after`; it counts the attempts it got.
fn scripted(
    after: Duration,
    answer: fn(u32) -> Res,
) -> (
    impl tower::Service<Req, Response = Res, Error = BoxError, Future: Send> + Clone,
    Arc<AtomicUsize>,
) {
    let answer = move |number| (after, answer(number));
    scripted_by_attempt(answer)
}

/// A service whose every attempt answers what `answer` gives for the attempt's number (1
/// for the first), after the delay it gives; it counts the attempts it got.
fn scripted_by_attempt(
    answer: impl Fn(u32) -> (Duration, Res) + Clone + Send + 'static,
) -> (
    impl tower::Service<Req, Response = Res, Error = BoxError, Future: Send> + Clone,
    Arc<AtomicUsize>,
) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&attempts);
    let service = tower::service_fn(move |request: Req| {
        counted.fetch_add(1, Ordering::SeqCst);
        let number = request
            .extensions()
            .get::<AttemptInfo>()
            .map_or(1, |i| i.number);
        let (after, response) = answer(number);
        async move {
            tokio::time::sleep(after).await;
            Ok::<_, BoxError>(response)
        }
    });
    (service, attempts)
}

/// The first attempt fails UNAVAILABLE after 300 ms; every later one answers OK after 10 ms.
fn first_fails_slowly(number: u32) -> (Duration, Res) {
    match number {
        1 => (ms(300), trailers_only(Code::Unavailable, None)),
        _ => (ms(10), grpc_ok()),
    }
}

#[tokio::test(start_paused = true)]
async fn a_backup_the_budget_refuses_leaves_the_hedge_a_failure_owes() {
    // 3 attempts 150 ms apart, a budget with no hedges, no throttle: the backup due at
    // 150 ms is refused, and the first attempt's UNAVAILABLE at 300 ms still sends the
    // second at once, which answers OK.
    let budget = HedgeBudget::new(Duration::from_secs(10), 0, 0.0).unwrap();
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(150))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(budget)
        .build()
        .unwrap();
    let policies = Policies::builder().service(SERVICE, policy).build();
    let (service, sent) = scripted_by_attempt(|number| match number {
        1 => (ms(300), trailers_only(Code::Unavailable, None)),
        _ => (Duration::ZERO, grpc_ok()),
    });
    let svc = HedgeLayer::new(policies.clone()).layer(service);
    let start = Instant::now();
    let response = svc.oneshot(grpc_request()).await.unwrap();
    assert_eq!(grpc_status(&response), Some("0"));
    assert_eq!(Instant::now() - start, ms(300));
    assert_eq!(attempts(&response).sent(), 2);
    assert_eq!(attempts(&response).counted(), 2);
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    let snapshot = policies.stats().snapshot();
    assert_eq!(snapshot.methods[METHOD].hedges_over_budget, 1);
}

#[tokio::test(start_paused = true)]
async fn with_json_defaults_a_hundred_slow_failures_all_succeed() {
    // `hedgingDelay` 100 ms, 3 attempts, the JSON default budget, 100 calls at once whose
    // first attempts fail UNAVAILABLE at 300 ms. The budget lets a share of the backups at
    // 100 ms through; every other call sends its second attempt when the first fails, and
    // all 100 succeed, as A6 says.
    let policies = json_hedging(3, "0.1s");
    let (service, sent) = scripted_by_attempt(first_fails_slowly);
    let svc = HedgeLayer::new(policies.clone()).layer(service);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..100 {
        calls.spawn(svc.clone().oneshot(grpc_request()));
    }
    let mut ok = 0;
    while let Some(done) = calls.join_next().await {
        let response = done.unwrap().unwrap();
        if grpc_status(&response) == Some("0") {
            ok += 1;
        }
    }
    assert_eq!(ok, 100, "calls that succeeded");
    let snapshot = policies.stats().snapshot();
    let over = snapshot.methods[METHOD].hedges_over_budget;
    assert!(over > 0, "the budget refused some backups");
    // Each call sent its backup or its replacement, not both for a refused one.
    assert_eq!(sent.load(Ordering::SeqCst), 200);
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempts_next_hedge_is_sent_at_once_whatever_the_budget() {
    // A6: a non-fatal failure sends the next hedge at once. The JSON policy's budget (a
    // share of 100 calls and its floor) is far below 100 hedges, and it is not asked.
    let policies = json_hedging(3, "1s");
    let (service, attempts) = scripted(ms(1), |number| match number {
        1 => trailers_only(Code::Unavailable, None),
        _ => grpc_ok(),
    });
    let svc = HedgeLayer::new(policies.clone()).layer(service);
    for call in 0..100 {
        let response = svc.clone().oneshot(grpc_request()).await.unwrap();
        assert_eq!(grpc_status(&response), Some("0"), "call {call}");
        assert_eq!(
            response.extensions().get::<Attempts>().map(|a| a.sent()),
            Some(2)
        );
    }
    assert_eq!(attempts.load(Ordering::SeqCst), 200);
    let snapshot = policies.stats().snapshot();
    assert_eq!(snapshot.methods[METHOD].hedges_over_budget, 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_with_few_calls_hedges_as_a6_says() {
    // Three calls one after the other, every attempt slower than 4 × the hedging delay;
    // `maxAttempts` 7 is clamped to 5: each call sends all 5 (the A6 conformance step).
    let policies = json_hedging(7, "0.01s");
    let (service, attempts) = scripted(ms(60), |_| grpc_ok());
    let svc = HedgeLayer::new(policies).layer(service);
    let mut sent = Vec::new();
    for _ in 0..3 {
        let before = attempts.load(Ordering::SeqCst);
        let response = svc.clone().oneshot(grpc_request()).await.unwrap();
        assert_eq!(grpc_status(&response), Some("0"));
        // The losers are cancelled as the first answer returns; count what was sent.
        sent.push(attempts.load(Ordering::SeqCst) - before);
    }
    assert_eq!(sent, [5, 5, 5]);
}

#[tokio::test(start_paused = true)]
async fn sustained_slowness_adds_at_most_a_quarter_with_the_json_default() {
    // 400 calls, 16 at a time, against a backend that answers every call after 100 ms;
    // hedging 2 ms × 3 would send 800 hedges. The JSON default keeps them to its share.
    let policies = json_hedging(3, "0.002s");
    let (service, attempts) = scripted(ms(100), |_| grpc_ok());
    let svc = HedgeLayer::new(policies.clone()).layer(service);
    let calls = 400;
    let mut set = tokio::task::JoinSet::new();
    let next = Arc::new(AtomicUsize::new(0));
    for _ in 0..16 {
        let svc = svc.clone();
        let next = Arc::clone(&next);
        set.spawn(async move {
            while next.fetch_add(1, Ordering::SeqCst) < calls {
                let response = svc.clone().oneshot(grpc_request()).await.unwrap();
                assert_eq!(grpc_status(&response), Some("0"));
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap();
    }
    let extra = attempts.load(Ordering::SeqCst) - calls;
    eprintln!("sustained slowness: {extra} extra attempts over {calls} calls");
    let share = extra as f64 / calls as f64;
    // 5 % of the calls and 20 hedges of floor: 40, 10 %; the issue's bound is 25 %.
    assert!(
        share <= 0.25,
        "{extra} extra attempts ({:.1} %)",
        share * 100.0
    );
    assert!(extra >= 20, "the budget lets its share through: {extra}");
    let snapshot = policies.stats().snapshot();
    assert!(snapshot.methods[METHOD].hedges_over_budget > 0);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_the_throttle_refuses_costs_the_budget_nothing() {
    // The A6 bucket at half refuses every hedge, and every attempt fails: ten calls send
    // no hedge (neither the backup due at 10 ms nor the failed attempt's replacement), and
    // the budget keeps all it holds.
    let budget = HedgeBudget::default();
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(10))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(budget.clone())
        .build()
        .unwrap();
    let throttle = throttle_at(5);
    let policies = throttled(policy, &throttle);
    let (service, attempts) = scripted(ms(50), |_| trailers_only(Code::Unavailable, None));
    let svc = HedgeLayer::new(policies.clone()).layer(service);
    let floor = budget.remaining();
    for _ in 0..10 {
        let response = svc.clone().oneshot(grpc_request()).await.unwrap();
        assert_eq!(grpc_status(&response), Some("14"));
    }
    assert_eq!(attempts.load(Ordering::SeqCst), 10, "no hedge was sent");
    // What ten calls earned (5 % of 10, rounded down) and nothing taken.
    assert_eq!(budget.remaining(), floor);
    let snapshot = policies.stats().snapshot();
    let over = snapshot
        .methods
        .get(METHOD)
        .map_or(0, |m| m.hedges_over_budget);
    assert_eq!(over, 0);
}
