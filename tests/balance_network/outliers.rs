//! Outlier detection in `BalancedChannel` over real tonic servers: a dead backend stops
//! drawing attempts, comes back when it recovers, and a set where every backend fails keeps
//! failing as it would without the balancer.
//!
//! The channel is wired as the README shows (`track_backends(true)`, the retry layer over
//! `BalancedChannel::balance_list`), with its default outlier detection unless a test says
//! otherwise. A first attempt is a request without `grpc-previous-rpc-attempts`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Code as TonicCode;
use tower::Layer;
use tower_retry_hedge::backoff::Exponential;
use tower_retry_hedge::balance::{BalancedChannel, EjectionReason, OutlierDetection};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy, Throttle};

use super::common::pb::EchoRequest;
use super::common::pb::echo_client::EchoClient;
use super::{Behaviour, EchoPeer, SERVICE, failures, guard, ms, run};

/// The README's quick-start retry policy with `maxAttempts` 3 (0.1 s, ×2, at most 1 s,
/// ±20 %), under `throttle`, with the calls' record of tried backends.
fn policies(throttle: Option<Throttle>) -> Policies {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Exponential::grpc(ms(100), Duration::from_secs(1), 2.0).expect("valid backoff"))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("valid policy");
    let mut builder = Policies::builder()
        .service(SERVICE, policy)
        .track_backends(true);
    if let Some(throttle) = throttle {
        builder = builder.throttle(throttle);
    }
    builder.build()
}

/// The failed calls among `outcomes` (by call number) in `calls`.
fn failed_in(
    outcomes: &[(Result<(), tonic::Status>, Duration)],
    calls: std::ops::Range<usize>,
) -> usize {
    failures(&outcomes[calls])
}

const CALLS: u32 = 2_000;
const CONCURRENCY: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_quick_start_throttle_a_dead_backend_stops_drawing_first_attempts() {
    let servers = [
        EchoPeer::spawn(Behaviour::Unavailable).await,
        EchoPeer::spawn(Behaviour::Ok).await,
        EchoPeer::spawn(Behaviour::Ok).await,
    ];
    let channel = BalancedChannel::balance_list(servers.each_ref().map(EchoPeer::endpoint));
    let outliers = channel.outliers();
    let throttle = Throttle::new(10, 0.1).expect("valid throttle");
    let client = EchoClient::new(RetryLayer::new(policies(Some(throttle))).layer(channel));
    let outcomes = guard(run(client, 0, CALLS, CONCURRENCY)).await;

    let dead = &servers[0];
    let early_failures = failed_in(&outcomes, 0..100);
    let late_failures = failed_in(&outcomes, 100..CALLS as usize);
    let dead_first = dead.first_attempts(0..CALLS);
    let dead_first_late = dead.first_attempts(200..CALLS);
    println!(
        "{CALLS} calls, {CONCURRENCY} at a time, throttle {{10, 0.1}}, one dead backend of \
         three: {early_failures} failed among the first 100, {late_failures} after; first \
         attempts on the dead backend: {dead_first} in all, {dead_first_late} of calls \
         200..{CALLS}; ejections {:?}",
        outliers.ejected()
    );
    assert!(
        early_failures <= 5,
        "{early_failures} of the first 100 calls failed"
    );
    assert_eq!(late_failures, 0, "calls failed after the first 100");
    // At most 2 % of the first attempts of calls 200.. reached the dead backend.
    let late_calls = (CALLS - 200) as usize;
    assert!(
        dead_first_late * 50 <= late_calls,
        "{dead_first_late} of {late_calls} first attempts on the dead backend"
    );
    // It is out, for a run of failures, and nobody else is.
    let ejected = outliers.ejected();
    assert_eq!(ejected.len(), 1, "{ejected:?}");
    assert_eq!(ejected[0].key, format!("http://{}/", dead.addr));
    assert_eq!(ejected[0].reason, EjectionReason::ConsecutiveFailures);

    for server in servers {
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_backend_dying_while_the_first_is_out_fails_no_call() {
    let second_down = Arc::new(AtomicBool::new(false));
    let servers = [
        EchoPeer::spawn(Behaviour::Unavailable).await,
        EchoPeer::spawn(Behaviour::UnavailableWhile(Arc::clone(&second_down))).await,
        EchoPeer::spawn(Behaviour::Ok).await,
    ];
    let channel = BalancedChannel::balance_list(servers.each_ref().map(EchoPeer::endpoint));
    let outliers = channel.outliers();
    let throttle = Throttle::new(20, 1.0).expect("valid throttle");
    let client = EchoClient::new(RetryLayer::new(policies(Some(throttle))).layer(channel));

    let before = guard(run(client.clone(), 0, 300, CONCURRENCY)).await;
    let first_out = outliers.ejected();
    assert_eq!(
        first_out.len(),
        1,
        "the first dead backend is out: {first_out:?}"
    );
    assert_eq!(first_out[0].key, format!("http://{}/", servers[0].addr));
    second_down.store(true, Ordering::Relaxed);
    let after = guard(run(client, 300, CALLS - 300, CONCURRENCY)).await;

    let second_first = servers[1].first_attempts(300..CALLS);
    println!(
        "a second backend dies while the first is out: {} + {} failed calls; first attempts \
         of calls 300..{CALLS} on it: {second_first}; ejected {:?}",
        failures(&before),
        failures(&after),
        outliers.ejected(),
    );
    assert_eq!(failures(&before) + failures(&after), 0);
    // One of three may be out at once: the second dead backend stays in rotation, weighed
    // down by its failures, and each call it fails goes on to the healthy one.
    assert_eq!(outliers.ejected().len(), 1);
    assert!(
        second_first * 10 < (CALLS - 300) as usize,
        "the second dead backend took {second_first} first attempts"
    );

    for server in servers {
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_backend_fails_calls_fail_as_without_the_balancer() {
    const FAILING_CALLS: u32 = 300;
    let servers = [
        EchoPeer::spawn(Behaviour::Unavailable).await,
        EchoPeer::spawn(Behaviour::Unavailable).await,
        EchoPeer::spawn(Behaviour::Unavailable).await,
    ];
    let endpoints = || servers.each_ref().map(EchoPeer::endpoint);
    // A 1 ms backoff and no throttle: every call makes its three attempts.
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(
            Exponential::new(ms(1), ms(1), 2.0, tower_retry_hedge::backoff::Jitter::None)
                .expect("valid backoff"),
        )
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("valid policy");
    let policies = Policies::builder()
        .service(SERVICE, policy)
        .track_backends(true)
        .build();

    let channel = BalancedChannel::balance_list(endpoints());
    let outliers = channel.outliers();
    let client = EchoClient::new(RetryLayer::new(policies.clone()).layer(channel));
    let ours = guard(run(client, 0, FAILING_CALLS, CONCURRENCY)).await;
    let our_attempts: u32 = servers.iter().map(|s| s.attempts(0..FAILING_CALLS)).sum();

    let channel = tonic::transport::Channel::balance_list(endpoints().into_iter());
    let client = EchoClient::new(RetryLayer::new(policies).layer(channel));
    let tonic = guard(run(client, FAILING_CALLS, FAILING_CALLS, CONCURRENCY)).await;
    let tonic_attempts: u32 = servers
        .iter()
        .map(|s| s.attempts(FAILING_CALLS..2 * FAILING_CALLS))
        .sum();

    println!(
        "every backend UNAVAILABLE, {FAILING_CALLS} calls: BalancedChannel {} failed, {} \
         attempts; tonic's balancer {} failed, {} attempts; ejected {:?}",
        failures(&ours),
        our_attempts,
        failures(&tonic),
        tonic_attempts,
        outliers.ejected(),
    );
    // Every call fails, with the backends' status, after its three attempts, as through
    // tonic's balancer: no call is refused for want of a backend.
    for (outcome, _) in ours.iter().chain(&tonic) {
        let status = outcome.as_ref().expect_err("every backend fails");
        assert_eq!(status.code(), TonicCode::Unavailable, "{status:?}");
    }
    assert_eq!(our_attempts, 3 * FAILING_CALLS);
    assert_eq!(tonic_attempts, 3 * FAILING_CALLS);
    // A run of failures everywhere is no outlier; an interval's failure percentage may eject
    // one backend of three, never more, and never for good.
    let ejected = outliers.ejected();
    assert!(ejected.len() <= 1, "{ejected:?}");
    for ejection in &ejected {
        assert_eq!(ejection.reason, EjectionReason::FailurePercentage);
        assert!(ejection.until - ejection.at <= Duration::from_secs(300));
    }
    // Each backend took attempts all along.
    for server in &servers {
        assert!(server.attempts(0..FAILING_CALLS) > 0, "{}", server.addr);
    }

    for server in servers {
        server.shutdown().await;
    }
}

/// Starts one call every `every` from `0..calls` on tokio's clock, each in its own task, and
/// waits for them all; the failed ones.
async fn paced<S>(client: EchoClient<S>, calls: u32, every: Duration) -> usize
where
    EchoClient<S>: Clone + Send + 'static,
    S: tonic::client::GrpcService<tonic::body::Body> + Send + 'static,
    S::Future: Send,
    S::Error: Into<tower_retry_hedge::BoxError>,
    S::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower_retry_hedge::BoxError> + Send,
{
    let failed = Arc::new(AtomicU32::new(0));
    let mut ticks = tokio::time::interval(every);
    let mut tasks = Vec::new();
    for call in 0..calls {
        ticks.tick().await;
        let (mut client, failed) = (client.clone(), Arc::clone(&failed));
        tasks.push(tokio::spawn(async move {
            let request = EchoRequest {
                message: "hello".into(),
                payload: Vec::new(),
                call,
            };
            if client.unary(request).await.is_err() {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a call panicked");
    }
    failed.load(Ordering::Relaxed) as usize
}

#[tokio::test(start_paused = true)]
async fn a_dead_backend_that_recovers_gets_its_share_back() {
    // On the paused clock: it jumps to the next timer whenever the runtime waits, also on the
    // sockets, so every span below is tokio's time, not the machine's.
    const EJECTION: Duration = Duration::from_secs(3);
    const EVERY: Duration = Duration::from_millis(5);
    const RUN: Duration = Duration::from_secs(10);
    let start = Instant::now();
    let servers = [
        // Dead for the first 2 s: ejected within them, it has recovered when it comes back.
        EchoPeer::spawn(Behaviour::UnavailableUntil(start + Duration::from_secs(2))).await,
        EchoPeer::spawn(Behaviour::Ok).await,
        EchoPeer::spawn(Behaviour::Ok).await,
    ];
    let detection = OutlierDetection::builder()
        .base_ejection_time(EJECTION)
        .build()
        .expect("valid settings");
    let channel = BalancedChannel::builder()
        .outlier_detection(detection)
        .balance_list(servers.each_ref().map(EchoPeer::endpoint));
    let outliers = channel.outliers();
    let throttle = Throttle::new(20, 1.0).expect("valid throttle");
    let client = EchoClient::new(RetryLayer::new(policies(Some(throttle))).layer(channel));
    // 10 s of calls, one every 5 ms.
    let calls = (RUN.as_millis() / EVERY.as_millis()) as u32;
    let failed = guard(paced(client, calls, EVERY)).await;

    assert_eq!(outliers.ejections(), 1, "ejected once");
    assert_eq!(outliers.returns(), 1, "and back");
    assert!(outliers.ejected().is_empty());
    // From twice its ejection time after the start (it was ejected after it) to the end.
    let window = (start + 2 * EJECTION, start + RUN);
    let per_server: Vec<usize> = servers
        .iter()
        .map(|s| s.first_attempts_between(window.0, window.1))
        .collect();
    let total: usize = per_server.iter().sum();
    let share = per_server[0] as f64 / total as f64;
    println!(
        "dead for 2 s, ejected for {EJECTION:?}: {failed} failed calls; first attempts from \
         {:?} to {:?} after the start: {per_server:?} ({:.1} % on the recovered backend)",
        window.0 - start,
        window.1 - start,
        share * 100.0
    );
    assert_eq!(failed, 0);
    assert!(
        (0.25..=0.42).contains(&share),
        "share {share:.3}: {per_server:?}"
    );

    for server in servers {
        server.shutdown().await;
    }
}
