//! One test per rule, on the engine alone: no runtime, no clock, no IO. The helpers are
//! here; the tests are grouped by concern.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;
// The rules' verdicts, without the marks a returned answer carries (`seams` checks them).
use self::plain::Verdict;
use crate::backoff::{Exponential, Jitter};
use crate::classify::{Code, GrpcCodes};
use crate::policy::{HedgePolicy, MethodPolicy, RetryDecision, RetryPolicy, ThrottleHandle};
use crate::pushback::Pushback;
use crate::throttle::{RetryThrottle, Throttle};

mod a6;
mod connect;
mod plan;
mod seams;

mod plain {
    /// [`super::super::Verdict`], without the marks of a returned answer.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Verdict {
        Return,
        Keep,
        Drop,
    }

    impl From<super::super::Verdict> for Verdict {
        fn from(verdict: super::super::Verdict) -> Verdict {
            match verdict {
                super::super::Verdict::Return(_) => Verdict::Return,
                super::super::Verdict::Keep => Verdict::Keep,
                super::super::Verdict::Drop => Verdict::Drop,
            }
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A fixed clock for one step of a test.
struct Clock(Instant);

impl Clock {
    fn at(&self, offset: Duration) -> Instant {
        self.0 + offset
    }
}

/// Runs `f` with the engine's inputs at `at`, and a generator that always draws the same.
fn at<T>(at: Instant, f: impl FnOnce(&mut Inputs<'_>) -> T) -> T {
    let read = move || at;
    let mut rng = SmallRng::seed_from_u64(7);
    f(&mut Inputs::new(&read, &mut rng))
}

/// The engine's next action at `now`, past the records it posts (which the statistics tests
/// read with [`poll_posting`]).
fn poll(engine: &mut Engine, now: Instant) -> Action {
    poll_posting(engine, now, &crate::stats::MethodStats::default())
}

/// The engine's next action at `now`, with the records it posts added to `stats`.
fn poll_posting(engine: &mut Engine, now: Instant, stats: &crate::stats::MethodStats) -> Action {
    at(now, |inputs| {
        loop {
            match engine.poll(inputs) {
                Action::Post(records) => stats.add(&records),
                action => return action,
            }
        }
    })
}

/// The driver's service is ready for `send`: whether the engine lets it go.
fn admit(engine: &mut Engine, send: Dispatch) -> Admission {
    at(t0(), |inputs| engine.admit(send, Readiness::Ready, inputs))
}

/// A body whose commit always goes to the reader that asks, as a body that records nothing.
struct Unrecorded;

impl CommitBody for Unrecorded {
    fn commit(&self, reader: u64) -> u64 {
        reader
    }
}

fn answer(engine: &mut Engine, id: AttemptId, outcome: Outcome, now: Instant) -> Verdict {
    let headers = HeaderMap::new();
    let result = AttemptResult::Response {
        status: StatusCode::OK,
        headers: &headers,
    };
    at(now, |inputs| {
        engine
            .on_outcome(id, outcome, result, &Unrecorded, inputs)
            .into()
    })
}

/// Sends `send` as the driver does: admitted, then sent with the body reader numbered as the
/// send is.
fn sent(engine: &mut Engine, send: Dispatch, now: Instant) -> AttemptId {
    assert_eq!(admit(engine, send), Admission::Send, "{send:?} is admitted");
    let reader = u64::from(engine.attempts().sent() + 1);
    at(now, |inputs| engine.on_sent(send, reader, inputs).0)
}

/// An engine whose first attempt sends body reader 1, with a body that records nothing.
fn engine_of(rules: Rules, deadline: Option<Instant>) -> Engine {
    Engine::new(rules, deadline, BodyKind::Clones, 1, None)
}

/// How the call ends, if `action` ends it.
fn ended(action: Action) -> Option<End> {
    match action {
        Action::End(end, _) => Some(end),
        _ => None,
    }
}

fn ends_with_last(action: Action) -> bool {
    matches!(action, Action::End(End::Last(_), _))
}

fn retry_policy(
    build: impl FnOnce(crate::policy::RetryPolicyBuilder) -> crate::policy::RetryPolicyBuilder,
) -> Arc<RetryPolicy> {
    let builder = RetryPolicy::builder()
        .max_attempts(5)
        .backoff(Exponential::new(ms(100), ms(1000), 2.0, Jitter::None).unwrap())
        .retryable(GrpcCodes::from([Code::Unavailable]));
    Arc::new(build(builder).build().unwrap())
}

fn rules(mode: Mode, max_attempts: u32, throttle: Option<ThrottleHandle>) -> Rules {
    Rules {
        mode,
        max_attempts,
        may_repeat: true,
        grpc: true,
        max_pushback: Duration::from_secs(60),
        throttle,
        wait_for_ready: false,
    }
}

/// [`rules`] with gRPC's wait-for-ready: never-sent attempts are resent transparently.
fn waiting(mut rules: Rules) -> Rules {
    rules.wait_for_ready = true;
    rules
}

fn retry_engine(policy: Arc<RetryPolicy>, deadline: Option<Instant>) -> Engine {
    let max = policy.max_attempts;
    engine_of(rules(Mode::Retry(policy), max, None), deadline)
}

const RETRYABLE: Outcome = Outcome::Retryable(None);

fn hedge_engine(max: u32, delay: Duration, throttle: Option<ThrottleHandle>) -> Engine {
    let mut rules = hedge_rules(max, delay);
    rules.throttle = throttle;
    engine_of(rules, None)
}

fn t0() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

// The seams the engine now owns: commit, winner and end.

/// A recorded body already committed (by a transport's task) to `reader`, which the engine
/// has not been told of.
struct CommittedTo(u64);

impl CommitBody for CommittedTo {
    fn commit(&self, _: u64) -> u64 {
        self.0
    }
}

fn answer_with(
    engine: &mut Engine,
    id: AttemptId,
    outcome: Outcome,
    body: &dyn CommitBody,
) -> Verdict {
    let headers = HeaderMap::new();
    let result = AttemptResult::Response {
        status: StatusCode::OK,
        headers: &headers,
    };
    at(t0(), |inputs| {
        engine.on_outcome(id, outcome, result, body, inputs).into()
    })
}

/// The first attempt fails with a retryable code, and the call ends with that failure at
/// once: no retry can be made.
fn fails_at_once_with_its_first_attempt(engine: &mut Engine) {
    assert_eq!(
        answer(engine, AttemptId::FIRST, RETRYABLE, t0()),
        Verdict::Keep
    );
    assert_eq!(ended(poll(engine, t0())), Some(End::Last(AttemptId::FIRST)));
}

fn recorded(rules: Rules, deadline: Option<Instant>) -> Engine {
    Engine::new(rules, deadline, BodyKind::Recorded, 1, None)
}

fn hedge_rules(max: u32, delay: Duration) -> Rules {
    let policy = HedgePolicy::builder()
        .max_attempts(max)
        .delay(delay)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    rules(Mode::Hedge(Arc::new(policy), delay), max, None)
}

/// A throttle that always allows, and counts how often it was asked.
#[derive(Debug, Clone, Default)]
struct Counting(Arc<std::sync::atomic::AtomicU32>);

impl Counting {
    fn asked(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl RetryThrottle for Counting {
    fn on_success(&self) {}

    fn on_failure(&self) {}

    fn allows_retry(&self) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    }
}
