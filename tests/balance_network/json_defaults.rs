//! The balancer's promise as a user of service-config JSON sees it: over
//! `BalancedChannel::balance_list` of three real tonic servers, with policies from JSON and
//! nothing else, each hedge of a call goes to a backend the call has not tried (hedging
//! policies carry the record of tried backends by default); a retry policy does so when the
//! table asks for the record (`track_backends(true)`), and without it the count of calls
//! whose retries went back to a tried backend is printed, not asserted.
//!
//! What each attempt reached is seen by the servers: a layer between the hedge layer and the
//! channel copies each attempt's `AttemptInfo` (its number, whether it is a hedge) into two
//! request headers, and every server records, per arrival, the call (the request's `call`),
//! that number and itself. The layer only observes: it adds no `TriedBackends`, so the calls
//! carry a record only when the policies give them one.
//!
//! A call whose attempts share a backend is counted, except
//! (a) a call with more attempts than backends (after trying each, it goes round again), and
//! (b) an attempt that is no hedge and whose previous attempt reached no server: the
//!     transparent retry of an attempt that was never sent (or was refused before the
//!     application saw it), which the balancer sends back in rotation.
//! The exempted calls are counted and printed beside.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tonic::{Request, Status};
use tower::Layer;
use tower::util::MapRequestLayer;
use tower_retry_hedge::backoff::Jitter;
use tower_retry_hedge::balance::{BalancedChannel, OutlierDetection};
use tower_retry_hedge::metadata::AttemptInfo;
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies, RetryLayer, ServiceConfig};

use super::common::pb::EchoRequest;
use super::common::pb::echo_client::EchoClient;
use super::{Behaviour, EchoPeer, SERVICE, failures, guard, ms, quantile, run};

const BACKENDS: usize = 3;
const NUMBER_HEADER: &str = "x-test-attempt-number";
const HEDGE_HEADER: &str = "x-test-attempt-hedge";

/// One attempt as a server's application saw it.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    call: u32,
    /// The attempt's number (`AttemptInfo::number`, 1 for the first), counting every attempt
    /// sent, transparent retries included.
    number: u32,
    hedge: bool,
    backend: usize,
}

type Arrivals = Arc<Mutex<Vec<Arrival>>>;

/// Notes every arrival at one server (`backend`, its place among the three) in a list the
/// three servers share.
#[derive(Debug, Clone)]
pub(super) struct Witness {
    backend: usize,
    arrivals: Arrivals,
}

fn header<T: std::str::FromStr>(request: &Request<EchoRequest>, name: &str) -> Option<T> {
    request.metadata().get(name)?.to_str().ok()?.parse().ok()
}

impl Witness {
    pub(super) fn record(&self, request: &Request<EchoRequest>) {
        let arrival = Arrival {
            call: request.get_ref().call,
            number: header(request, NUMBER_HEADER).unwrap_or(0),
            hedge: header(request, HEDGE_HEADER).unwrap_or(false),
            backend: self.backend,
        };
        self.arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(arrival);
    }
}

/// Three servers answering as `behaviours` say, and the list of what reached them.
async fn servers(behaviours: [Behaviour; BACKENDS]) -> ([EchoPeer; BACKENDS], Arrivals) {
    let arrivals = Arrivals::default();
    let mut peers = Vec::new();
    for (backend, behaviour) in behaviours.into_iter().enumerate() {
        let witness = Witness {
            backend,
            arrivals: Arc::clone(&arrivals),
        };
        peers.push(EchoPeer::spawn_witnessed(behaviour, Some(witness)).await);
    }
    let peers = peers.try_into().ok().expect("three servers");
    (peers, arrivals)
}

/// Copies the attempt's `AttemptInfo` (none: the first attempt) into the request headers
/// the servers read; changes nothing else.
fn note(mut request: http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> {
    let (number, hedge) = request
        .extensions()
        .get::<AttemptInfo>()
        .map_or((1, false), |info| (info.number, info.hedge));
    let headers = request.headers_mut();
    headers.insert(NUMBER_HEADER, number.into());
    headers.insert(
        HEDGE_HEADER,
        http::HeaderValue::from_static(if hedge { "true" } else { "false" }),
    );
    request
}

/// The attempts of one call that reached a server, as `(number, hedge, backend)`.
type CallArrivals = Vec<(u32, bool, usize)>;

/// What the servers saw of the calls in `calls`.
#[derive(Debug, Default)]
struct Tally {
    /// Calls more than one of whose attempts reached a server (hedged or retried).
    repeated: usize,
    /// Calls whose attempts share a backend, past the exemptions, with their arrivals.
    shared: Vec<(u32, CallArrivals)>,
    /// Calls that share one only after more attempts than backends (exemption a).
    rotation: usize,
    /// Calls that share one only through the transparent retry of an attempt that reached no
    /// server (exemption b).
    transparent: usize,
}

fn tally(arrivals: &Arrivals, calls: Range<u32>) -> Tally {
    let mut by_call: BTreeMap<u32, CallArrivals> = BTreeMap::new();
    for arrival in arrivals
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|arrival| calls.contains(&arrival.call))
    {
        by_call.entry(arrival.call).or_default().push((
            arrival.number,
            arrival.hedge,
            arrival.backend,
        ));
    }
    let mut tally = Tally::default();
    for (call, mut attempts) in by_call {
        attempts.sort_unstable();
        if attempts.len() > 1 {
            tally.repeated += 1;
        }
        let mut shares = false;
        let mut unexempted = false;
        let mut transparent = false;
        for (i, &(number, hedge, backend)) in attempts.iter().enumerate() {
            if !attempts[..i]
                .iter()
                .any(|&(.., earlier)| earlier == backend)
            {
                continue;
            }
            shares = true;
            let previous_arrived = attempts[..i].iter().any(|&(n, ..)| n + 1 == number);
            if !hedge && number > 1 && !previous_arrived {
                transparent = true;
            } else {
                unexempted = true;
            }
        }
        let rotation = attempts
            .iter()
            .any(|&(number, ..)| number as usize > BACKENDS);
        match (shares, unexempted) {
            (false, _) => {}
            (true, _) if rotation => tally.rotation += 1,
            (true, true) => tally.shared.push((call, attempts)),
            (true, false) => {
                debug_assert!(transparent);
                tally.transparent += 1;
            }
        }
    }
    tally
}

const HEDGE_CALLS: u32 = 300;

/// Runs calls `first..first + HEDGE_CALLS`, 8 at a time, under `policies` over a fresh
/// `BalancedChannel::balance_list` (its defaults, outlier detection included); gives the
/// tally and the outcomes.
async fn hedged(
    servers: &[EchoPeer; BACKENDS],
    arrivals: &Arrivals,
    policies: Policies,
    first: u32,
) -> (Tally, Vec<(Result<(), Status>, Duration)>) {
    let channel = BalancedChannel::balance_list(servers.each_ref().map(EchoPeer::endpoint));
    let observed = MapRequestLayer::new(note).layer(channel);
    let client = EchoClient::new(HedgeLayer::new(policies).layer(observed));
    let outcomes = guard(run(client, first, HEDGE_CALLS, 8)).await;
    (tally(arrivals, first..first + HEDGE_CALLS), outcomes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_hedging_policy_sends_no_hedge_to_a_tried_backend() {
    let (servers, arrivals) =
        servers([Behaviour::OkAfter(ms(200)), Behaviour::Ok, Behaviour::Ok]).await;
    // Policies from service-config JSON alone: no `track_backends` anywhere.
    let policies = ServiceConfig::from_json(
        r#"{"methodConfig": [{
            "name": [{"service": "test.echo.Echo"}],
            "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s"}
        }]}"#,
    )
    .expect("valid service config")
    .policies();
    let (tally, outcomes) = hedged(&servers, &arrivals, policies, 0).await;
    let slow = arrivals
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|arrival| arrival.backend == 0 && arrival.call < HEDGE_CALLS)
        .count();
    println!(
        "{HEDGE_CALLS} calls of a JSON hedging policy (maxAttempts 3, hedgingDelay 0.05s), 8 at \
         a time, over BalancedChannel::balance_list of 3 servers, one answering after 200 ms: \
         {} reached the servers more than once; {} sent two attempts to one backend; exempted: \
         {} after trying all three, {} by a transparent retry; {slow} attempts reached the slow \
         server; {} failed; latency p50 {:?}, p99 {:?}",
        tally.repeated,
        tally.shared.len(),
        tally.rotation,
        tally.transparent,
        failures(&outcomes),
        quantile(&outcomes, 0.5),
        quantile(&outcomes, 0.99),
    );

    // The control: the same policy built in code with the record turned off, so that the
    // count above is seen to be the record's doing. Reported, not asserted.
    let untracked = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(50))
        .track_backends(false)
        .build()
        .expect("valid policy");
    let untracked = Policies::builder().service(SERVICE, untracked).build();
    let (control, control_outcomes) = hedged(&servers, &arrivals, untracked, HEDGE_CALLS).await;
    println!(
        "the same with track_backends(false): {} reached the servers more than once; {} sent \
         two attempts to one backend; exempted: {} after trying all three, {} by a transparent \
         retry; {} failed",
        control.repeated,
        control.shared.len(),
        control.rotation,
        control.transparent,
        failures(&control_outcomes),
    );

    assert_eq!(
        tally.shared.len(),
        0,
        "calls whose attempts share a backend, as (number, hedge, backend): {:?}",
        tally.shared
    );
    assert_eq!(failures(&outcomes), 0);
    assert!(slow > 0, "the slow server took no attempt");
    assert!(tally.repeated > 0, "no call was hedged");

    for server in servers {
        server.shutdown().await;
    }
}

const RETRY_CALLS: u32 = 2_000;

/// A retry policy for the echo service: `maxAttempts` 3, `UNAVAILABLE` retryable, 1 ms backoff.
const RETRY_JSON: &str = r#"{"methodConfig": [{
    "name": [{"service": "test.echo.Echo"}],
    "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.002s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
    }
}]}"#;

/// Runs calls `first..first + RETRY_CALLS`, 16 at a time, under `policies` over a fresh
/// `BalancedChannel` without outlier detection (so that the dead backend keeps its share of
/// first attempts and only the record keeps retries off it); gives the tally and how many
/// calls failed.
async fn retried(
    servers: &[EchoPeer; BACKENDS],
    arrivals: &Arrivals,
    policies: Policies,
    first: u32,
) -> (Tally, usize) {
    let channel = BalancedChannel::builder()
        .outlier_detection(OutlierDetection::disabled())
        .balance_list(servers.each_ref().map(EchoPeer::endpoint));
    let observed = MapRequestLayer::new(note).layer(channel);
    let client = EchoClient::new(RetryLayer::new(policies).layer(observed));
    let outcomes = guard(run(client, first, RETRY_CALLS, 16)).await;
    (
        tally(arrivals, first..first + RETRY_CALLS),
        failures(&outcomes),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_retry_policy_with_track_backends_retries_on_untried_backends() {
    let (servers, arrivals) = servers([Behaviour::Unavailable, Behaviour::Ok, Behaviour::Ok]).await;
    let config = ServiceConfig::from_json(RETRY_JSON).expect("valid service config");

    let tracked = config
        .policies_builder_with(Jitter::GRPC)
        .track_backends(true)
        .build();
    let (tally, failed) = retried(&servers, &arrivals, tracked, 0).await;
    println!(
        "{RETRY_CALLS} calls of a JSON retry policy (maxAttempts 3) with track_backends(true), 16 \
         at a time, over BalancedChannel (no outlier detection) of 3 servers, one always \
         UNAVAILABLE: {} reached the servers more than once; {} sent two attempts to one \
         backend; exempted: {} after trying all three, {} by a transparent retry; {failed} \
         failed",
        tally.repeated,
        tally.shared.len(),
        tally.rotation,
        tally.transparent,
    );

    // The same without the record, which retry policies do not carry by default: reported,
    // not asserted.
    let (untracked, untracked_failed) =
        retried(&servers, &arrivals, config.policies(), RETRY_CALLS).await;
    println!(
        "the same with ServiceConfig::policies() (no record of tried backends): {} reached the \
         servers more than once; {} sent two attempts to one backend; exempted: {} after trying \
         all three, {} by a transparent retry; {untracked_failed} failed",
        untracked.repeated,
        untracked.shared.len(),
        untracked.rotation,
        untracked.transparent,
    );

    assert_eq!(
        tally.shared.len(),
        0,
        "calls whose attempts share a backend, as (number, hedge, backend): {:?}",
        tally.shared
    );
    assert_eq!(
        failed, 0,
        "with the record no call meets the dead backend twice"
    );
    assert!(
        tally.repeated > 100,
        "only {} calls were retried",
        tally.repeated
    );

    for server in servers {
        server.shutdown().await;
    }
}
