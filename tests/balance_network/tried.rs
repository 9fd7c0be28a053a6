//! Issue 30: no hedge goes to a backend its call tried while one it has not tried is ready,
//! over `BalancedChannel` with one slow backend of three and bursts of hedged calls.
//!
//! Each call brings its own `TriedBackends` record, which the layers keep for all of its
//! attempts and the balancer fills, one backend id per attempt in the order it picked them:
//! after the call, the record says where every attempt went, including those cancelled
//! before they reached a server. Beside it, a layer under the hedge layer notes each attempt's
//! `AttemptInfo` as it is sent, in the same order. tonic channels are always ready, so a hedge
//! whose backend is already in the record, while the record does not hold all three yet, went
//! to a tried backend while an untried one was ready. (An attempt that is no hedge, a
//! transparent retry sent after every attempt in flight failed, goes back to a tried backend
//! in rotation rather than to an ejected one: see the balancer's docs.)
//!
//! Two things made such hedges before the fix (in 19 runs of 100, 1 to 59 calls of the 900).
//! The burst's cancelled hedges make a server close its connection (h2's guard against rapid
//! resets: GOAWAY `too_many_resets`), the failures of the attempts in flight on it eject a
//! fast backend, and a hedge whose call had tried the two others went back to one of them.
//! Rarer: the balancer's worker had spent its tokio budget when it polled ready again the
//! backend it had just used, which then said Pending and stayed out of the picks until tokio
//! woke it, and the picks went among the two others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinSet;
use tower::Layer;
use tower::util::MapRequestLayer;
use tower_retry_hedge::HedgeLayer;
use tower_retry_hedge::balance::BalancedChannel;
use tower_retry_hedge::metadata::{AttemptInfo, BackendId, TriedBackends};

use super::common::pb::EchoRequest;
use super::common::pb::echo_client::EchoClient;
use super::{Behaviour, EchoPeer, guard, hedged_and_tracked, ms};

/// The calls of a burst, all sent at once.
const CALLS: u32 = 300;
/// Bursts per run, each on a channel of its own: a backend ejected in one stays out of the
/// next.
const BURSTS: u32 = 3;

/// Whether each attempt of a call was a hedge, in the order they were sent: a request
/// extension that every attempt carries a clone of.
#[derive(Debug, Clone, Default)]
struct Kinds(Arc<Mutex<Vec<bool>>>);

impl Kinds {
    fn note(request: http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> {
        if let Some(kinds) = request.extensions().get::<Kinds>() {
            let hedge = request
                .extensions()
                .get::<AttemptInfo>()
                .is_some_and(|attempt| attempt.hedge);
            kinds
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(hedge);
        }
        request
    }
}

/// One call's attempts, in order: the server each went to (`None`: no server known by the
/// id the balancer recorded) and whether it was a hedge.
type Attempts = Vec<(Option<usize>, bool)>;

/// Sends `CALLS` hedged calls at once, numbered from `first`, through a fresh channel over
/// `servers`; gives each call's attempts and how many calls failed.
async fn burst(servers: &[EchoPeer; 3], first: u32) -> (Vec<Attempts>, usize) {
    let policies = hedged_and_tracked(ms(5), false);
    let channel = BalancedChannel::balance_list(servers.each_ref().map(EchoPeer::endpoint));
    let noted = MapRequestLayer::new(Kinds::note).layer(channel);
    let client = EchoClient::new(HedgeLayer::new(policies).layer(noted));
    let servers: HashMap<BackendId, usize> = servers
        .iter()
        .enumerate()
        .map(|(index, server)| (BackendId::of(server.endpoint().uri()), index))
        .collect();

    let mut calls = JoinSet::new();
    for call in first..first + CALLS {
        let mut client = client.clone();
        calls.spawn(async move {
            let (tried, kinds) = (TriedBackends::default(), Kinds::default());
            let mut request = tonic::Request::new(EchoRequest {
                message: "hello".into(),
                payload: Vec::new(),
                call,
            });
            request.extensions_mut().insert(tried.clone());
            request.extensions_mut().insert(kinds.clone());
            let failed = client.unary(request).await.is_err();
            let kinds = kinds
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            (tried.ids(), kinds, failed)
        });
    }
    let mut attempts = Vec::new();
    let mut failed = 0;
    while let Some(joined) = calls.join_next().await {
        let (tried, kinds, call_failed) = joined.expect("a call panicked");
        // An attempt cancelled before the balancer took it has a kind and no record: only
        // the last ones of a call can be, as a call cancels its attempts when it ends.
        let servers = tried.iter().map(|id| servers.get(id).copied());
        attempts.push(servers.zip(kinds).collect());
        failed += usize::from(call_failed);
    }
    (attempts, failed)
}

/// The attempts of `call` that went to a backend an earlier one had gone to while the call
/// had not tried every backend yet: `(hedges, others)`.
fn back_to_a_tried_one(call: &Attempts) -> (usize, usize) {
    let mut back = (0, 0);
    for (i, &(server, hedge)) in call.iter().enumerate() {
        let before = || call[..i].iter().map(|&(server, _)| server);
        let untried_left = (0..3).any(|s| !before().any(|b| b == Some(s)));
        if untried_left && before().any(|b| b == server) {
            if hedge {
                back.0 += 1;
            } else {
                back.1 += 1;
            }
        }
    }
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hedge_goes_to_a_tried_backend_while_an_untried_one_is_ready() {
    let servers = [
        EchoPeer::spawn(Behaviour::OkAfter(ms(200))).await,
        EchoPeer::spawn(Behaviour::Ok).await,
        EchoPeer::spawn(Behaviour::Ok).await,
    ];
    let mut calls = Vec::new();
    let mut failed = 0;
    for round in 0..BURSTS {
        let (burst_calls, burst_failed) = guard(burst(&servers, round * CALLS)).await;
        calls.extend(burst_calls);
        failed += burst_failed;
    }

    let hedged = calls.iter().filter(|call| call.len() > 1).count();
    let fourth = calls.iter().filter(|call| call.len() > 3).count();
    let back: Vec<(usize, usize)> = calls.iter().map(back_to_a_tried_one).collect();
    let bad: Vec<&Attempts> = calls
        .iter()
        .zip(&back)
        .filter(|(_, back)| back.0 > 0)
        .map(|(call, _)| call)
        .collect();
    let retries_back = back.iter().filter(|back| back.1 > 0).count();
    println!(
        "{BURSTS} bursts of {CALLS} hedged calls at once, 3 servers, one answering after \
         200 ms, hedging delay 5 ms: {hedged} calls hedged; {} sent a hedge to a tried backend \
         while an untried one was ready; {retries_back} a transparent retry after every \
         attempt in flight failed; {fourth} a fourth attempt (a transparent retry) after \
         trying all three; {failed} failed",
        bad.len(),
    );
    assert!(
        calls
            .iter()
            .all(|call| call.iter().all(|(server, _)| server.is_some())),
        "an attempt went to a backend of no server"
    );
    assert!(bad.is_empty(), "(server, hedge) of each attempt: {bad:?}");
    assert!(hedged > 0, "no call was hedged");

    for server in servers {
        server.shutdown().await;
    }
}
