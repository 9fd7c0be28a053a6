//! Hedged streaming calls over a real tonic channel whose request stream outgrows its
//! per-call limit in the channel's own task: the body then commits the call to the attempt
//! whose transport task pulled the overflowing chunk. The commit is made while the attempts'
//! answers are crossing it on the wire:
//!
//! - every attempt fails UNAVAILABLE just as the body commits: the call must end, with
//!   UNAVAILABLE;
//! - the second attempt's response headers arrive (its peer answers it as soon as its first
//!   chunk is in, the others later) just as the body commits to another attempt: the call
//!   must return the response of the attempt the body committed to, which alone receives the
//!   whole stream (A6: the attempt that has sent the most continues).
//!
//! Each request stream is one small chunk that the replay body records for every attempt,
//! then (once the peer has seen what the call waits for) chunks past the per-call limit. The
//! hedging delay is 0, so the three attempts start together.
//!
//! The interleaving is made likely, not certain, so each test makes [`CALLS`] calls and
//! checks every one. What makes it likely: the overflowing chunk is sent just as the peer
//! answers, and the caller comes back to its call [`PAUSE`] after each wake (see
//! [`late`](super::late)), as a busy runtime's task would, so that the commit and the answers
//! are all there at the call's next poll.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::Code;
use tonic::transport::Channel;
use tower::ServiceBuilder;
use tower_retry_hedge::classify::{self, GrpcCodes};
use tower_retry_hedge::{BufferLimits, Hedge, HedgeLayer, HedgePolicy, Policies};

use super::attempt_peer::AttemptPeer;
use super::common::pb::Chunk;
use super::common::pb::bidi_echo_client::BidiEchoClient;
use super::common::{
    Action, AttemptRecord, Recorder, Script, fed_request, grpc_channel, spawn_grpc,
};
use super::{NO_RESULT, guard, late};

type Client = BidiEchoClient<Hedge<Channel>>;

const BIDI_SERVICE: &str = "test.echo.BidiEcho";
/// How many calls each test makes.
const CALLS: u32 = 200;
/// The per-call limit: the first chunk fits, the next outgrows it.
const PER_CALL: usize = 256;
/// How long the calls still running once all have started may take to end.
const HANG: Duration = Duration::from_secs(10);
/// How late the caller comes back to its call after each wake (see [`late`]).
const PAUSE: Duration = Duration::from_millis(2);

/// `len` deterministic, varied bytes.
fn bytes(len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state.to_be_bytes()[0]
        })
        .collect()
}

/// Three attempts at once, UNAVAILABLE non-fatal; a per-call limit of [`PER_CALL`] bytes. No
/// hedge budget: every call is to have its three attempts (the default budget would hold
/// most of the [`CALLS`] to one).
async fn hedged_client(channel: Channel) -> Client {
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(Duration::ZERO)
        .non_fatal(GrpcCodes::from([classify::Code::Unavailable]))
        .budget(None)
        .build()
        .expect("a valid policy");
    let policies = Policies::builder()
        .service(BIDI_SERVICE, policy)
        .buffer_limits(BufferLimits::new(PER_CALL, 64 * 1024 * 1024))
        .build();
    BidiEchoClient::new(
        ServiceBuilder::new()
            .layer(HedgeLayer::new(policies))
            .service(channel),
    )
}

/// What a call waits for at the peer before it sends the chunks that outgrow the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wait {
    /// Nothing: right after the first chunk.
    Nothing,
    /// Any attempt's first chunk.
    OneFirstChunk,
    /// The first chunk of the attempt with this number (`grpc-previous-rpc-attempts` + 1).
    FirstChunkOf(u32),
    /// Two attempts' first chunks.
    TwoFirstChunks,
}

impl Wait {
    /// Waits at most a second: an attempt may be cut off before its first chunk.
    async fn wait(self, recorder: &Recorder, call: u32) {
        let number = |a: &AttemptRecord| {
            a.previous_attempts
                .as_deref()
                .and_then(|v| v.parse::<u32>().ok())
                .map_or(1, |previous| previous + 1)
        };
        let with_chunk = move |all: &[AttemptRecord], of: Option<u32>| {
            all.iter()
                .filter(|a| a.call == call && a.messages >= 1)
                .filter(|a| of.is_none_or(|of| number(a) == of))
                .count()
        };
        let seen = recorder.wait_until(move |all| match self {
            Wait::Nothing => true,
            Wait::OneFirstChunk => with_chunk(all, None) >= 1,
            Wait::FirstChunkOf(n) => with_chunk(all, Some(n)) >= 1,
            Wait::TwoFirstChunks => with_chunk(all, None) >= 2,
        });
        let _ = tokio::time::timeout(Duration::from_secs(1), seen).await;
    }
}

/// Feeds one call's stream: `first`, then (once the peer has seen what `wait` says) `rest`,
/// then its end.
async fn feed(
    sender: mpsc::Sender<Chunk>,
    recorder: &Recorder,
    call: u32,
    wait: Wait,
    first: Vec<u8>,
    rest: Vec<Vec<u8>>,
) {
    // A send fails once every attempt is over: nothing reads the stream any more.
    if sender.send(Chunk { data: first }).await.is_err() {
        return;
    }
    wait.wait(recorder, call).await;
    for data in rest {
        if sender.send(Chunk { data }).await.is_err() {
            return;
        }
    }
}

/// Waits up to [`HANG`] for every call of `calls` to end; gives what they ended with and the
/// calls still running then (which it aborts).
async fn join_all<T: 'static>(calls: &mut JoinSet<(u32, T)>) -> (Vec<(u32, T)>, Vec<u32>) {
    let mut ended = Vec::new();
    let _ = tokio::time::timeout(HANG, async {
        while let Some(joined) = calls.join_next().await {
            ended.push(joined.expect("the call task ends"));
        }
    })
    .await;
    let done: BTreeSet<u32> = ended.iter().map(|(call, _)| *call).collect();
    let hung = (0..CALLS).filter(|call| !done.contains(call)).collect();
    calls.abort_all();
    (ended, hung)
}

/// How many of `calls` each wait had, as `"Wait: n"`.
fn by_wait<'a>(calls: impl IntoIterator<Item = &'a u32>, wait: impl Fn(u32) -> Wait) -> String {
    let mut counts = BTreeMap::new();
    for call in calls {
        *counts.entry(wait(*call)).or_insert(0usize) += 1;
    }
    format!("{counts:?}")
}

/// Fails with what went wrong, if anything did; `what` says what the calls were.
fn report(
    what: &str,
    ended: usize,
    wrong: &BTreeMap<u32, String>,
    hung: &[u32],
    wait: impl Fn(u32) -> Wait + Copy,
) {
    eprintln!(
        "{CALLS} {what}: {} right; {} wrong, by wait: {}; {} never ended, by wait: {}",
        ended - wrong.len(),
        wrong.len(),
        by_wait(wrong.keys(), wait),
        hung.len(),
        by_wait(hung, wait)
    );
    let shown: Vec<_> = wrong.iter().take(5).collect();
    assert!(
        hung.is_empty() && wrong.is_empty(),
        "{CALLS} {what}: {} never ended within {HANG:?} of the last call's start (calls \
         {:?}); {} ended wrong, first ones: {shown:#?}",
        hung.len(),
        &hung[..hung.len().min(20)],
        wrong.len(),
    );
}

/// The first test's waits, call by call.
fn failing_wait(call: u32) -> Wait {
    [
        Wait::Nothing,
        Wait::OneFirstChunk,
        Wait::FirstChunkOf(2),
        Wait::TwoFirstChunks,
    ][call as usize % 4]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedged_streams_committed_by_their_body_end_when_their_attempts_fail_together() {
    // Every attempt fails UNAVAILABLE (Trailers-Only) as soon as its first chunk is in.
    let peer = spawn_grpc(Script::always(Action::fail(Code::Unavailable))).await;
    let recorder = peer.recorder();
    let client = hedged_client(peer.channel().await).await;

    let mut calls = JoinSet::new();
    for call in 0..CALLS {
        let (sender, request) = fed_request(call);
        let mut client = client.clone();
        calls.spawn(async move {
            let ended = match late(client.bidi(request), PAUSE).await {
                Ok(_) => Err("response headers, though every attempt failed"),
                Err(status) => Ok(status),
            };
            (call, ended)
        });
        let (first, rest) = (
            bytes(PER_CALL / 4, call),
            vec![bytes(4 * PER_CALL, call), bytes(PER_CALL, !call)],
        );
        guard(feed(
            sender,
            &recorder,
            call,
            failing_wait(call),
            first,
            rest,
        ))
        .await;
    }
    let (ended, hung) = join_all(&mut calls).await;

    let mut wrong = BTreeMap::new();
    for (call, ended) in &ended {
        match ended {
            Ok(status) if status.code() == Code::Unavailable => {}
            Ok(status) if status.message().contains(NO_RESULT) => {
                wrong.insert(*call, format!("{NO_RESULT:?}: {status:?}"));
            }
            Ok(status) => {
                wrong.insert(*call, format!("not UNAVAILABLE: {status:?}"));
            }
            Err(why) => {
                wrong.insert(*call, (*why).to_owned());
            }
        }
    }
    let no_result = wrong.values().filter(|why| why.contains(NO_RESULT)).count();
    eprintln!("of the wrong ends, {no_result} were {NO_RESULT:?}");
    report(
        "hedged streams committed by their body while their attempts failed (the right end: \
         UNAVAILABLE)",
        ended.len(),
        &wrong,
        &hung,
        failing_wait,
    );
    guard(peer.shutdown()).await;
}

/// What a call of the second test got back.
#[derive(Debug)]
enum Got {
    /// The echoes of its whole stream and an OK end.
    Echoed(Vec<u8>),
    /// Its echo stream broke off after this many bytes.
    Broken(usize, tonic::Status),
    /// No response.
    Failed(tonic::Status),
}

/// The second test's waits, call by call: mostly the fast attempt's first chunk (the peer
/// sends its headers right then), sometimes nothing.
fn answering_wait(call: u32) -> Wait {
    if call % 4 == 3 {
        Wait::Nothing
    } else {
        Wait::FirstChunkOf(2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedged_streams_committed_by_their_body_return_the_committed_attempts_response() {
    // Every attempt answers with response headers once its first chunk is in, then echoes
    // every chunk it receives, and ends OK when its request stream ends. The second attempt
    // answers at once, the others 20 ms later: by then the call has committed to one of them.
    let peer = AttemptPeer::spawn(2, Duration::from_millis(20)).await;
    let recorder = peer.recorder();
    let client = hedged_client(grpc_channel(peer.addr()).await).await;

    let mut calls = JoinSet::new();
    let mut bodies = Vec::new();
    for call in 0..CALLS {
        let (sender, request) = fed_request(call);
        let mut client = client.clone();
        calls.spawn(async move {
            let got = match late(client.bidi(request), PAUSE).await {
                Err(status) => Got::Failed(status),
                Ok(response) => {
                    let mut echoes = response.into_inner();
                    let mut echoed = Vec::new();
                    loop {
                        match echoes.message().await {
                            Ok(Some(chunk)) => echoed.extend_from_slice(&chunk.data),
                            Ok(None) => break Got::Echoed(echoed),
                            Err(status) => break Got::Broken(echoed.len(), status),
                        }
                    }
                }
            };
            (call, got)
        });
        let first = bytes(PER_CALL / 4, call);
        let rest = vec![bytes(4 * PER_CALL, call), bytes(PER_CALL, !call)];
        bodies.push([first.clone(), rest.concat()].concat());
        guard(feed(
            sender,
            &recorder,
            call,
            answering_wait(call),
            first,
            rest,
        ))
        .await;
    }
    let (ended, hung) = join_all(&mut calls).await;

    let mut wrong = BTreeMap::new();
    for (call, got) in &ended {
        let sent = &bodies[*call as usize];
        // The echoes come from the attempt that received the whole stream, and only one did.
        // (The peer's outcomes tell nothing here: tonic's server ends a request stream the
        // client cancelled as if it had ended, so a cancelled attempt may show OK.)
        let whole: Vec<_> = recorder
            .attempts(*call)
            .into_iter()
            .filter(|a| a.payload.as_ref() == sent.as_slice())
            .map(|a| a.previous_attempts)
            .collect();
        let why = match got {
            Got::Echoed(echoed) if echoed == sent && whole.len() == 1 => continue,
            Got::Echoed(echoed) if echoed == sent => format!(
                "{} attempts received the whole stream at the peer",
                whole.len()
            ),
            Got::Echoed(echoed) => format!(
                "the response echoed {} of the {} bytes sent, then ended",
                echoed.len(),
                sent.len()
            ),
            Got::Broken(len, status) => format!(
                "the response came from an attempt whose request stream failed: its echoes \
                 broke off after {len} of {} bytes; attempts that received the whole stream \
                 (by grpc-previous-rpc-attempts): {whole:?}; {status:?}",
                sent.len(),
            ),
            Got::Failed(status) => format!("no response: {status:?}"),
        };
        wrong.insert(*call, why);
    }
    report(
        "hedged streams committed by their body while their attempts answered (the right \
         response: the one whose attempt received the whole stream)",
        ended.len(),
        &wrong,
        &hung,
        answering_wait,
    );
    guard(peer.shutdown()).await;
}
