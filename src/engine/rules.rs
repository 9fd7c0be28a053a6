//! What a call's rules are: one pure function of its method's policy, the table it was found
//! in and the request's own facts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Exponential};
use crate::classify::{AttemptResult, Classify, Code, Outcome};
use crate::policy::{HedgePolicy, MethodPolicy, Policies, RetryPolicy, ThrottleHandle};

/// How a call makes its attempts after the first.
#[derive(Clone)]
pub(crate) enum Mode {
    /// One attempt at a time, the next after a backoff (A6 `retryPolicy`).
    Retry(Arc<RetryPolicy>),
    /// A new attempt every `delay`, without waiting for answers (A6 `hedgingPolicy`).
    Hedge(Arc<HedgePolicy>, Duration),
    /// No policy: only transparent retries (A6 applies them "regardless of the retry
    /// configuration"), each answer final.
    Single,
}

/// How the request body can be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// Every attempt gets a clone; nothing is recorded, and the body never commits itself.
    Clones,
    /// The first attempt records what it sends for the others, within the buffer limits;
    /// the body commits itself to one reader when it outgrows them or its source fails.
    Recorded,
    /// The body could not be recorded (it is known to be over the limits): it goes with the
    /// first attempt, and no other attempt can be made.
    Once,
}

/// What a call's rules are made of: its policy and what the table says of every call.
pub(crate) struct Rules {
    pub(crate) mode: Mode,
    /// `maxAttempts`, clamped to the client's cap.
    pub(crate) max_attempts: u32,
    /// Whether the request may reach the server's application more than once (gRPC, an
    /// idempotent HTTP method, or an opt-in). When not, only transparent retries are made.
    pub(crate) may_repeat: bool,
    pub(crate) grpc: bool,
    /// The longest pushback waited out; a longer one stops the retries.
    pub(crate) max_pushback: Duration,
    pub(crate) throttle: Option<ThrottleHandle>,
    /// gRPC's wait-for-ready: an attempt that could not connect is resent transparently
    /// until the deadline; without it, it is an `UNAVAILABLE` failure for the policy.
    pub(crate) wait_for_ready: bool,
}

impl Rules {
    pub(super) fn classifier(&self) -> &dyn Classify {
        match &self.mode {
            Mode::Retry(policy) => &*policy.classifier,
            Mode::Hedge(policy, _) => &*policy.classifier,
            Mode::Single => &NoPolicy,
        }
    }

    /// The backoff of retries after a failure, and of never-sent resends.
    pub(super) fn backoff(&self) -> &dyn Backoff {
        match &self.mode {
            Mode::Retry(policy) => &*policy.backoff,
            Mode::Hedge(..) | Mode::Single => &TRANSPARENT_BACKOFF,
        }
    }

    /// The bound on resends of attempts that could not be sent, for a call without deadline.
    pub(super) fn max_transparent(&self) -> u32 {
        match &self.mode {
            Mode::Retry(policy) => policy.max_transparent_retries,
            Mode::Hedge(..) | Mode::Single => crate::policy::DEFAULT_MAX_TRANSPARENT_RETRIES,
        }
    }

    pub(super) fn hedging_delay(&self) -> Option<Duration> {
        match &self.mode {
            Mode::Hedge(_, delay) => Some(*delay),
            _ => None,
        }
    }

    pub(super) fn per_attempt_timeout(&self) -> Option<(Duration, bool)> {
        match &self.mode {
            Mode::Retry(policy) => policy
                .per_attempt_timeout
                .map(|timeout| (timeout, policy.hedge_on_per_attempt_timeout)),
            _ => None,
        }
    }
}

/// How a call without a policy sees its answers: final, successes credit the throttle. A
/// gRPC status is read where there is one (OK or a committed response is a success); an HTTP
/// 5xx or 429 is a failure; errors are checked for never-sent and refused attempts.
#[derive(Debug)]
struct NoPolicy;

impl Classify for NoPolicy {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        match result {
            AttemptResult::Response { status, headers } => {
                let failed = match crate::classify::header_status(headers) {
                    Some(code) => code != Code::Ok,
                    None => {
                        status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS
                    }
                };
                if failed {
                    Outcome::Fatal(None)
                } else {
                    Outcome::Success
                }
            }
            AttemptResult::Error(error) => {
                crate::classify::transport_outcome(error).unwrap_or(Outcome::Fatal(None))
            }
            AttemptResult::Status { code: Code::Ok, .. } => Outcome::Success,
            AttemptResult::Status { .. } => Outcome::Fatal(None),
        }
    }
}

/// The backoff of never-sent resends for calls whose policy has none (hedges, no policy):
/// A6's example schedule, so that a client that cannot connect does not spin.
const TRANSPARENT_BACKOFF: Exponential = Exponential::A6_EXAMPLE;

/// What the policy table says of every call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TableFacts {
    pub(crate) max_attempts_cap: u32,
    pub(crate) max_pushback: Duration,
    /// Calls without a policy are driven all the same: by the layers for A6's transparent
    /// retries (unless the table turns them off), by the `grpc` interceptor to keep a call's
    /// deadline, which `grpc` 0.9 does not.
    pub(crate) drive_without_policy: bool,
    /// The table has a throttle, which every call's success credits.
    pub(crate) has_throttle: bool,
    /// Every call keeps a record of the backends it tried, for a balancer below.
    pub(crate) track_backends: bool,
}

impl TableFacts {
    /// What `policies` says of every call, for the engine's plan.
    pub(crate) fn of(policies: &Policies) -> TableFacts {
        TableFacts {
            max_attempts_cap: policies.max_attempts_cap(),
            max_pushback: policies.max_pushback(),
            drive_without_policy: policies.transparent_retries(),
            has_throttle: policies.has_throttle(),
            track_backends: policies.track_backends(),
        }
    }
}

/// What a request says of its own call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallFacts<'a> {
    pub(crate) method: &'a http::Method,
    /// A gRPC call (`application/grpc` content type).
    pub(crate) grpc: bool,
    /// The request's headers: `grpc-timeout` (of a gRPC call), `Idempotency-Key`.
    pub(crate) headers: &'a http::HeaderMap,
    /// A [`Deadline`](crate::metadata::Deadline) extension.
    pub(crate) deadline: Option<Instant>,
}

/// How a driven call starts.
pub(crate) struct Start {
    /// Its rules, with the throttle the driver looked up (the layers' by authority).
    pub(crate) rules: Rules,
    pub(crate) deadline: Option<Instant>,
    /// The request's own `grpc-timeout` is the deadline: the first attempt keeps it.
    deadline_from_header: bool,
    /// The call keeps a record of the backends its attempts tried.
    pub(crate) track_backends: bool,
    /// When its first attempt goes, read only for an adaptive hedging delay, which learns
    /// from the latency of the attempt that answers.
    pub(crate) first_sent_at: Option<Instant>,
    /// The route the call matched, for its statistics.
    pub(crate) route: Option<usize>,
}

impl Start {
    /// The `grpc-timeout` the first attempt of a gRPC call carries: the call's time left,
    /// read from `now` (only where there is one). `None` where the request's own
    /// `grpc-timeout` is the deadline, which it keeps (re-encoding it would only allocate).
    pub(crate) fn first_timeout(&self, now: impl FnOnce() -> Instant) -> Option<http::HeaderValue> {
        let deadline = self
            .deadline
            .filter(|_| self.rules.grpc && !self.deadline_from_header)?;
        Some(crate::grpc_timeout::encode(
            deadline.saturating_duration_since(now()),
        ))
    }

    /// Whether the engine may stop the first attempt while it runs: a hedging policy (a
    /// hedge that wins stops it), a deadline, or a per-attempt timeout. The driver keeps
    /// such a first attempt where it can be let finish on a task of its own.
    pub(crate) fn may_stop_first(&self) -> bool {
        self.rules.hedging_delay().is_some()
            || self.deadline.is_some()
            || self.rules.per_attempt_timeout().is_some()
    }
}

/// The rules of a call: its method's `policy` (if any), what `table` says of every call,
/// and what the request says (`call`), with the `throttle` and the `route` the entry looked
/// up; `None` when the layer hands the call on as it is (a
/// layer above drives it, or nothing of A6 applies: no policy, no throttle, transparent
/// retries off). `now` is read once, and only when a timeout or an adaptive hedging delay
/// needs it.
///
/// Whichever layer of the crate meets a call first drives it, by its method's policy (a
/// retry policy is retried, a hedging policy hedged, the same in either layer); a layer
/// below sees the mark the driving layer puts on every attempt, and passes it through. So
/// every call through any stack gets A6's treatment once.
pub(crate) fn plan(
    policy: Option<MethodPolicy>,
    table: &TableFacts,
    call: &CallFacts<'_>,
    throttle: Option<ThrottleHandle>,
    route: Option<usize>,
    now: &dyn Fn() -> Instant,
) -> Option<Start> {
    if nothing_applies(policy.as_ref(), table) {
        return None;
    }
    let mut read = None;
    let mut now = || *read.get_or_insert_with(now);
    let repeatable = call.grpc || call.method.is_idempotent();
    let single = |timeout, wait| (Mode::Single, 1, repeatable, timeout, wait);
    let (mode, max_attempts, may_repeat, timeout, wait_for_ready) = match policy {
        Some(MethodPolicy::Retry(policy)) => {
            let opted_in = policy.retry_non_idempotent
                || (policy.retry_with_idempotency_key
                    && call.headers.contains_key("idempotency-key"));
            let may_repeat = repeatable || opted_in;
            let (max, timeout, wait) = (policy.max_attempts, policy.timeout, policy.wait_for_ready);
            (Mode::Retry(policy), max, may_repeat, timeout, wait)
        }
        Some(MethodPolicy::Hedge(policy)) => {
            let may_repeat = repeatable || policy.non_idempotent;
            let (max, timeout, wait) = (policy.max_attempts, policy.timeout, policy.wait_for_ready);
            let delay = policy.delay.current_at(&mut now);
            (Mode::Hedge(policy, delay), max, may_repeat, timeout, wait)
        }
        Some(MethodPolicy::Timeout(timeout)) => single(Some(timeout), false),
        Some(MethodPolicy::WaitForReady(timeout)) => single(timeout, true),
        None => single(None, false),
    };
    let track_backends =
        table.track_backends || matches!(&mode, Mode::Hedge(policy, _) if policy.track_backends);
    let (deadline, deadline_from_header) = deadline(call, timeout, &mut now);
    let first_sent_at = match &mode {
        Mode::Hedge(policy, _) if policy.delay.is_adaptive() => Some(now()),
        _ => None,
    };
    Some(Start {
        rules: Rules {
            mode,
            max_attempts: max_attempts.min(table.max_attempts_cap),
            may_repeat,
            grpc: call.grpc,
            max_pushback: table.max_pushback,
            throttle,
            wait_for_ready,
        },
        deadline,
        deadline_from_header,
        track_backends,
        first_sent_at,
        route,
    })
}

/// Nothing of A6 applies to a call without a policy when the table has no throttle for its
/// successes to credit and nothing else asks to drive it: it passes through, whatever the
/// request says (so a layer can tell before it reads the request).
pub(crate) fn nothing_applies(policy: Option<&MethodPolicy>, table: &TableFacts) -> bool {
    policy.is_none() && !table.has_throttle && !table.drive_without_policy
}

/// The call's deadline: the earliest of the request's `grpc-timeout`, the method's `timeout`
/// and a deadline extension; `None` when none is set. Also tells whether the request's own
/// `grpc-timeout` is that deadline.
fn deadline(
    call: &CallFacts<'_>,
    timeout: Option<Duration>,
    now: &mut dyn FnMut() -> Instant,
) -> (Option<Instant>, bool) {
    let header = if call.grpc {
        crate::grpc_timeout::from_headers(call.headers)
    } else {
        None
    };
    let (timeout, from_header) = match (header, timeout) {
        (Some(header), Some(method)) => (Some(header.min(method)), header <= method),
        (Some(header), None) => (Some(header), true),
        (None, method) => (method, false),
    };
    // A timeout too large to add to now is no deadline at all.
    let from_timeout = timeout.and_then(|t| now().checked_add(t));
    match (from_timeout, call.deadline) {
        (Some(a), Some(b)) if b < a => (Some(b), false),
        (Some(a), _) => (Some(a), from_header),
        (None, b) => (b, false),
    }
}
