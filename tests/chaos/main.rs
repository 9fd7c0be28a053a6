//! Chaos: 10 000 calls through `HedgeLayer` over `RetryLayer` to a real tonic server that
//! fails, delays, pushes back, hangs and resets streams at random (from a seed), 32 calls in
//! flight. Even calls are `ClientStream` (a streaming request body, retried), odd calls
//! `Unary` (hedged).
//!
//! Invariants, checked on every call (the run counts violations, then asserts there are
//! none):
//! 1. the client reports success only if the server recorded a success for that call, and
//!    the answer is the one that attempt gave;
//! 2. attempts never exceed the cap, as the server saw them and as the client reports them;
//! 3. no call outlives its deadline by more than scheduling slack (2 s: a bound that only a
//!    hung call can cross, on a busy machine too; not a speed assertion);
//! 4. every request body the server received is byte-identical to what the client sent, when
//!    the request stream ended as a whole request does (`END_STREAM`); a prefix of it when
//!    the stream broke off (the client cut the attempt off while it was streaming). How it
//!    ended is seen below tonic, on the HTTP/2 body: tonic 0.14's server hands its handler
//!    a stream that a client reset with `CANCEL` as if it had ended, so the handler's view
//!    cannot tell a cut-off request from a whole one;
//! 5. the replay buffer's budget is back to 0 at the end.
//!
//! This runs on the real clock (a real server on 127.0.0.1); delays are a few milliseconds,
//! so the run takes seconds. `CHAOS_SEED=<u64>` replays another seed.

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::pb::echo_client::EchoClient;
use common::pb::{Chunk, EchoRequest};
use common::{Action, AttemptRecord, FaultEcho, Method, Outcome, Recorder, Script};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::{Channel, Endpoint, Server};
use tower::{Layer, Service, ServiceBuilder};
use tower_retry_hedge::backoff::Exponential;
use tower_retry_hedge::classify::{Code as Grpc, GrpcCodes};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{BufferLimits, HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy};

const DEFAULT_SEED: u64 = 0x5eed_0c4a_0500_0001;
const CALLS: u32 = 10_000;
const IN_FLIGHT: u32 = 32;
/// Each call's deadline (the policies' timeout).
const TIMEOUT: Duration = Duration::from_millis(300);
/// How far past its deadline a call may end before it counts as a violation: a hang, not
/// a slow scheduler (a call ended 853 ms late with the two cores busy).
const SLACK: Duration = Duration::from_secs(2);
const RETRY_MAX_ATTEMPTS: u32 = 5;
const HEDGE_MAX_ATTEMPTS: u32 = 3;
const HEDGE_DELAY: Duration = Duration::from_millis(15);
/// Per-call and total replay limits: small enough that some bodies outgrow them.
const PER_CALL: usize = 16 * 1024;
const TOTAL: usize = 256 * 1024;
/// Per cent of attempts the server resets before its handler sees them.
const RESET_PERCENT: u64 = 4;

const CLIENT_STREAM: &str = "test.echo.Echo/ClientStream";
const UNARY: &str = "test.echo.Echo/Unary";

fn method(call: u32) -> Method {
    if call.is_multiple_of(2) {
        Method::ClientStream
    } else {
        Method::Unary
    }
}

fn cap(call: u32) -> u32 {
    match method(call) {
        Method::Unary => HEDGE_MAX_ATTEMPTS,
        _ => RETRY_MAX_ATTEMPTS,
    }
}

/// What a call sends.
#[derive(Clone, Debug)]
enum Sent {
    Unary { message: String, payload: Vec<u8> },
    Stream { chunks: Vec<Vec<u8>> },
}

impl Sent {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Sent::Unary { payload, .. } => payload.clone(),
            Sent::Stream { chunks } => chunks.concat(),
        }
    }
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes[..]);
    bytes
}

/// One attempt's fate: mostly answers, with failures of every kind.
fn random_action(rng: &mut StdRng) -> Action {
    match rng.random_range(0..100) {
        0..45 => Action::Ok,
        45..65 => Action::fail(Code::Unavailable),
        65..72 => Action::pushback(Code::Unavailable, rng.random_range(0..=20u32).to_string()),
        72..75 => Action::pushback(Code::ResourceExhausted, "-1"),
        75..77 => Action::pushback(Code::Unavailable, "soon"),
        77..81 => Action::fail(Code::Internal),
        81..83 => Action::fail(Code::Cancelled),
        83..85 => Action::Hang,
        _ => {
            let then = if rng.random_bool(0.7) {
                Action::Ok
            } else {
                Action::fail(Code::Unavailable)
            };
            Action::delay(Duration::from_millis(rng.random_range(1..=25)), then)
        }
    }
}

/// The whole run's plan: what each call sends, and the server's script.
fn plan(seed: u64) -> (Vec<Sent>, Script) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut script = Script::new();
    let mut sent = Vec::with_capacity(CALLS as usize);
    for call in 0..CALLS {
        let actions: Vec<Action> = (0..6).map(|_| random_action(&mut rng)).collect();
        script = script.call(call, actions);
        sent.push(match method(call) {
            Method::Unary => {
                let len = rng.random_range(0..2048);
                Sent::Unary {
                    message: format!("call {call}"),
                    payload: random_bytes(&mut rng, len),
                }
            }
            _ => {
                // One stream in twenty outgrows the per-call limit and commits its call.
                let (count, max) = if rng.random_bool(0.05) {
                    (6, 6 * 1024)
                } else {
                    (8, 2048)
                };
                let count = rng.random_range(0..=count);
                let chunks = (0..count)
                    .map(|_| {
                        let len = rng.random_range(0..max);
                        random_bytes(&mut rng, len)
                    })
                    .collect();
                Sent::Stream { chunks }
            }
        });
    }
    (sent, script)
}

/// Whether the server resets attempt `attempt` of `call` (a hash of the seed, so the plan
/// is fixed before the run).
fn resets(seed: u64, call: u32, attempt: u32) -> bool {
    let mut x = seed ^ (u64::from(call) << 32) ^ u64::from(attempt);
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x % 100 < RESET_PERCENT
}

/// In front of the tonic service: resets the scripted attempts' streams (the service fails,
/// so hyper resets the HTTP/2 stream) before the handler sees them, and watches how every
/// other request stream ends (see [`Ends`]).
#[derive(Clone)]
struct Resetting<S> {
    inner: S,
    seed: u64,
    resets: Arc<Vec<AtomicU32>>,
    ends: Ends,
}

/// The metadata that names a request for [`Ends`].
const TRANSPORT_ID: &str = "x-transport-id";

/// How each request stream ended at the transport, by the id [`Resetting`] gave it in its
/// [`TRANSPORT_ID`] metadata.
#[derive(Clone, Default)]
struct Ends {
    next: Arc<AtomicU32>,
    ended: Arc<Mutex<BTreeMap<u32, End>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The client ended the stream (`END_STREAM`): a whole request.
    Whole,
    /// The stream broke off (a reset, or the connection went).
    BrokeOff,
}

impl Ends {
    fn of(&self, record: &AttemptRecord) -> Option<End> {
        let id: u32 = record
            .metadata
            .get(TRANSPORT_ID)?
            .to_str()
            .ok()?
            .parse()
            .ok()?;
        self.ended.lock().unwrap().get(&id).copied()
    }
}

pin_project_lite::pin_project! {
    /// A request body that notes how it ended.
    struct Watched {
        #[pin]
        inner: tonic::body::Body,
        id: u32,
        ends: Ends,
    }
}

impl http_body::Body for Watched {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        let end = match &polled {
            Poll::Ready(None) => Some(End::Whole),
            Poll::Ready(Some(Err(_))) => Some(End::BrokeOff),
            _ => None,
        };
        if let Some(end) = end {
            this.ends
                .ended
                .lock()
                .unwrap()
                .entry(*this.id)
                .or_insert(end);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[derive(Debug)]
struct ScriptedReset;

impl std::fmt::Display for ScriptedReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted stream reset")
    }
}

impl std::error::Error for ScriptedReset {}

impl<S> Service<http::Request<tonic::body::Body>> for Resetting<S>
where
    S: Service<http::Request<tonic::body::Body>>,
    S::Error: Into<tower_retry_hedge::BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = tower_retry_hedge::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let header = |name: &str| -> Option<u32> {
            request.headers().get(name)?.to_str().ok()?.parse().ok()
        };
        if let Some(call) = header("x-call") {
            let attempt = header("grpc-previous-rpc-attempts").unwrap_or(0);
            if resets(self.seed, call, attempt) {
                if let Some(count) = self.resets.get(call as usize) {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                return Box::pin(async { Err(ScriptedReset.into()) });
            }
        }
        let id = self.ends.next.fetch_add(1, Ordering::SeqCst);
        request
            .headers_mut()
            .insert(TRANSPORT_ID, http::HeaderValue::from(id));
        let ends = self.ends.clone();
        let request = request.map(|inner| tonic::body::Body::new(Watched { inner, id, ends }));
        let future = self.inner.call(request);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

#[derive(Clone)]
struct ResettingLayer {
    seed: u64,
    resets: Arc<Vec<AtomicU32>>,
    ends: Ends,
}

impl<S> Layer<S> for ResettingLayer {
    type Service = Resetting<S>;

    fn layer(&self, inner: S) -> Resetting<S> {
        Resetting {
            inner,
            seed: self.seed,
            resets: Arc::clone(&self.resets),
            ends: self.ends.clone(),
        }
    }
}

struct Peer {
    addr: std::net::SocketAddr,
    service: FaultEcho,
    ends: Ends,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn serve(seed: u64, script: Script, resets: Arc<Vec<AtomicU32>>) -> Peer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.and_then(|stream| {
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    });
    let service = FaultEcho::new(script);
    let ends = Ends::default();
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let layer = ResettingLayer {
        seed,
        resets,
        ends: ends.clone(),
    };
    let task = tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(service.clone().into_server())
            .serve_with_incoming_shutdown(incoming, async {
                let _ = signal.await;
            }),
    );
    Peer {
        addr,
        service,
        ends,
        stop,
        task,
    }
}

fn policies() -> Policies {
    let retry = RetryPolicy::builder()
        .max_attempts(RETRY_MAX_ATTEMPTS)
        .backoff(
            Exponential::grpc(Duration::from_millis(5), Duration::from_millis(40), 2.0).unwrap(),
        )
        .retryable(GrpcCodes::from([
            Grpc::Unavailable,
            Grpc::ResourceExhausted,
        ]))
        .timeout(TIMEOUT)
        .build()
        .unwrap();
    let hedge = HedgePolicy::builder()
        .max_attempts(HEDGE_MAX_ATTEMPTS)
        .delay(HEDGE_DELAY)
        .non_fatal(GrpcCodes::from([
            Grpc::Unavailable,
            Grpc::ResourceExhausted,
        ]))
        .timeout(TIMEOUT)
        // Every hedge A6 allows, for as many races as the chaos can make (the default
        // budget would hold most of them back).
        .budget(None)
        .build()
        .unwrap();
    Policies::builder()
        .method(CLIENT_STREAM, retry)
        .method(UNARY, hedge)
        .buffer_limits(BufferLimits::new(PER_CALL, TOTAL))
        .build()
}

/// What the client saw of one call.
#[derive(Debug)]
struct ClientResult {
    call: u32,
    elapsed: Duration,
    outcome: Result<Reply, Code>,
    attempts: Option<Attempts>,
}

#[derive(Debug)]
enum Reply {
    Unary {
        message: String,
        payload: Vec<u8>,
        attempt: u32,
    },
    Stream {
        bytes: u64,
        chunks: u64,
        all: Vec<u8>,
    },
}

type Client = EchoClient<tower_retry_hedge::Hedge<tower_retry_hedge::Retry<Channel>>>;

async fn one_call(mut client: Client, call: u32, sent: Sent) -> ClientResult {
    let started = Instant::now();
    let x_call = tonic::metadata::MetadataValue::from(call);
    let (outcome, attempts) = match sent {
        Sent::Unary { message, payload } => {
            let mut request = tonic::Request::new(EchoRequest {
                message,
                payload,
                call,
            });
            request.metadata_mut().insert("x-call", x_call);
            match client.unary(request).await {
                Ok(response) => {
                    let attempts = Some(
                        response
                            .extensions()
                            .get::<Attempts>()
                            .copied()
                            .unwrap_or_default(),
                    );
                    let reply = response.into_inner();
                    let reply = Reply::Unary {
                        message: reply.message,
                        payload: reply.payload,
                        attempt: reply.attempt,
                    };
                    (Ok(reply), attempts)
                }
                Err(status) => (Err(status.code()), None),
            }
        }
        Sent::Stream { chunks } => {
            // A message at a time, as a real upload streams: tonic sends each as a chunk of
            // its own, so the replay body records and replays several.
            let stream = futures_util::StreamExt::then(
                futures_util::stream::iter(chunks),
                |data| async move {
                    tokio::task::yield_now().await;
                    Chunk { data }
                },
            );
            let mut request = tonic::Request::new(stream);
            request.metadata_mut().insert("x-call", x_call);
            match client.client_stream(request).await {
                Ok(response) => {
                    let attempts = Some(
                        response
                            .extensions()
                            .get::<Attempts>()
                            .copied()
                            .unwrap_or_default(),
                    );
                    let digest = response.into_inner();
                    let reply = Reply::Stream {
                        bytes: digest.bytes,
                        chunks: digest.chunks,
                        all: digest.sha_or_all,
                    };
                    (Ok(reply), attempts)
                }
                Err(status) => (Err(status.code()), None),
            }
        }
    };
    ClientResult {
        call,
        elapsed: started.elapsed(),
        outcome,
        attempts,
    }
}

/// Checks one call against what the server recorded; returns the violations found.
fn check(
    result: &ClientResult,
    sent: &Sent,
    records: &[AttemptRecord],
    resets: u32,
    ends: &Ends,
) -> Vec<String> {
    let call = result.call;
    let mut violations = Vec::new();
    let mut violation = |what: String| violations.push(format!("call {call}: {what}"));

    // 1. No success the server did not give.
    if let Ok(reply) = &result.outcome {
        let server_ok: Vec<&AttemptRecord> = records
            .iter()
            .filter(|r| r.outcome == Some(Outcome::Ok))
            .collect();
        if server_ok.is_empty() {
            violation("client success, but the server recorded none".into());
        }
        match (reply, sent) {
            (
                Reply::Unary {
                    message,
                    payload,
                    attempt,
                },
                Sent::Unary {
                    message: m,
                    payload: p,
                },
            ) => {
                let from = records.get(*attempt as usize);
                if from.is_none_or(|r| r.outcome != Some(Outcome::Ok)) {
                    violation(format!(
                        "the reply came from attempt {attempt}, which did not succeed"
                    ));
                }
                if message != m || payload != p {
                    violation("the reply is not the echo of the request".into());
                }
            }
            (Reply::Stream { bytes, chunks, all }, Sent::Stream { chunks: c }) => {
                if *all != sent.bytes() || *bytes != all.len() as u64 || *chunks != c.len() as u64 {
                    violation("the digest is not of the stream sent".into());
                }
            }
            _ => violation("a reply of the wrong kind".into()),
        }
    }

    // 2. Attempts within the cap: as the server saw them, and as the client reports them.
    let seen = records.len() as u32 + resets;
    if seen > cap(call) {
        violation(format!(
            "{seen} attempts reached the server, over the cap of {}",
            cap(call)
        ));
    }
    if let Some(attempts) = result.attempts
        && attempts.counted() > cap(call)
    {
        violation(format!("{attempts:?} over the cap of {}", cap(call)));
    }

    // 3. Within the deadline, give or take scheduling.
    if result.elapsed > TIMEOUT + SLACK {
        violation(format!("took {:?}, deadline {TIMEOUT:?}", result.elapsed));
    }

    // 4. Every body received is the body sent: whole if the stream ended as a request does,
    // a prefix of it if it broke off.
    let bytes = sent.bytes();
    for record in records {
        let received = record.payload.as_ref();
        let complete = match sent {
            Sent::Unary { message, .. } => {
                if record.message != *message {
                    violation(format!("attempt {}: another message", record.attempt));
                }
                true
            }
            Sent::Stream { .. } => match ends.of(record) {
                Some(End::Whole) => true,
                Some(End::BrokeOff) => false,
                // Neither, yet the handler read it to the end: the stream cannot have been
                // whole without the transport's end.
                None => record.outcome.is_some(),
            },
        };
        let intact = if complete {
            received == bytes.as_slice()
        } else {
            bytes.starts_with(received)
        };
        if !intact {
            violation(format!(
                "attempt {}: the server received {} bytes that differ from the {} sent",
                record.attempt,
                received.len(),
                bytes.len()
            ));
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_calls_through_faults_keep_every_invariant() {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let (plan, script) = plan(seed);
    let plan = Arc::new(plan);
    let resets: Arc<Vec<AtomicU32>> = Arc::new((0..CALLS).map(|_| AtomicU32::new(0)).collect());
    let server = serve(seed, script, Arc::clone(&resets)).await;
    let recorder: Recorder = server.service.recorder();

    let policies = policies();
    let channel = Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(HedgeLayer::new(policies.clone()))
        .layer(RetryLayer::new(policies.clone()))
        .service(channel);
    let client = EchoClient::new(svc);

    let started = Instant::now();
    let next = Arc::new(AtomicU32::new(0));
    let results = Arc::new(Mutex::new(Vec::with_capacity(CALLS as usize)));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (client, next, results, plan) = (
                client.clone(),
                Arc::clone(&next),
                Arc::clone(&results),
                Arc::clone(&plan),
            );
            tokio::spawn(async move {
                loop {
                    let call = next.fetch_add(1, Ordering::SeqCst);
                    if call >= CALLS {
                        return;
                    }
                    let sent = plan[call as usize].clone();
                    let result = one_call(client.clone(), call, sent).await;
                    results.lock().unwrap().push(result);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("a worker panicked");
    }
    let run_time = started.elapsed();
    drop(client);

    // Attempts the client cancelled end on the server a moment later.
    tokio::time::timeout(
        Duration::from_secs(10),
        recorder.wait_until(|all| all.iter().all(|r| r.ended.is_some())),
    )
    .await
    .expect("server attempts still running 10 s after the last call");
    // So do the request streams h2 still holds.
    let budget_deadline = Instant::now() + Duration::from_secs(10);
    while policies.buffer_limits().in_use() != 0 && Instant::now() < budget_deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let results = std::mem::take(&mut *results.lock().unwrap());
    assert_eq!(results.len(), CALLS as usize);
    let all = recorder.all();
    let mut by_call: BTreeMap<u32, Vec<AttemptRecord>> = BTreeMap::new();
    for record in all.iter() {
        by_call.entry(record.call).or_default().push(record.clone());
    }
    let mut violations = Vec::new();
    let mut codes = BTreeMap::<String, usize>::new();
    let mut successes = 0;
    let mut max_elapsed = Duration::ZERO;
    for result in &results {
        let records = by_call.get(&result.call).map(Vec::as_slice).unwrap_or(&[]);
        let resets = resets[result.call as usize].load(Ordering::SeqCst);
        violations.extend(check(
            result,
            &plan[result.call as usize],
            records,
            resets,
            &server.ends,
        ));
        max_elapsed = max_elapsed.max(result.elapsed);
        match &result.outcome {
            Ok(_) => successes += 1,
            Err(code) => *codes.entry(format!("{code:?}")).or_default() += 1,
        }
    }
    // 5. The budget is back to 0.
    let in_use = policies.buffer_limits().in_use();
    if in_use != 0 {
        violations.push(format!("{in_use} bytes still held in the replay budget"));
    }

    let reset_total: u32 = resets.iter().map(|r| r.load(Ordering::SeqCst)).sum();
    let cancelled = all.iter().filter(|r| r.cancelled).count();
    let attempts = all.len() + reset_total as usize;
    let stats = policies.stats().snapshot();
    let retries: u64 = stats.methods.values().map(|m| m.retry_attempts).sum();
    eprintln!(
        "chaos (seed {seed:#x}): {CALLS} calls in {run_time:?}, {attempts} attempts \
         ({reset_total} reset, {cancelled} cancelled by the client), {retries} retries and \
         hedges, {successes} successes, failures {codes:?}, longest call {max_elapsed:?}, \
         violations = {}",
        violations.len()
    );
    let _ = server.stop.send(());
    server.service.release_hangs();
    let _ = server.task.await;

    assert!(
        violations.is_empty(),
        "{} violations, the first:\n{}",
        violations.len(),
        violations
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The faults were real: every kind of ending happened.
    assert!(successes > CALLS as usize / 2, "{successes} successes");
    assert!(reset_total > 0 && cancelled > 0 && retries > 0);
    assert!(codes.len() >= 3, "failure codes {codes:?}");
}
