//! A call's rules: the plan a layer makes of its policy, table and request.

use super::*;
use crate::policy::Policies;

fn facts<'a>(method: &'a http::Method, headers: &'a HeaderMap, grpc: bool) -> CallFacts<'a> {
    CallFacts {
        method,
        grpc,
        headers,
        deadline: None,
    }
}

const TABLE: TableFacts = TableFacts {
    max_attempts_cap: 3,
    max_pushback: Duration::from_secs(60),
    drive_without_policy: true,
    has_throttle: false,
    track_backends: false,
};

fn drive(plan: Option<Start>) -> Start {
    plan.expect("the call is driven")
}

#[test]
fn the_plan_of_a_call_is_its_policy_whichever_layer_meets_it_first() {
    let never = || panic!("no timeout: the clock is not read");
    let (post, get) = (http::Method::POST, http::Method::GET);
    let headers = HeaderMap::new();
    let retry = MethodPolicy::Retry(retry_policy(|b| b.max_attempts(5)));
    // Retried, its cap clamped to the table's; a gRPC POST may repeat.
    let start = drive(plan(
        Some(retry.clone()),
        &TABLE,
        &facts(&post, &headers, true),
        None,
        None,
        &never,
    ));
    assert!(matches!(start.rules.mode, Mode::Retry(_)));
    assert_eq!(
        (start.rules.max_attempts, start.rules.may_repeat),
        (3, true)
    );
    assert!(start.deadline.is_none());
    // An HTTP POST may not, unless it carries an idempotency key its policy accepts.
    let start = drive(plan(
        Some(retry.clone()),
        &TABLE,
        &facts(&post, &headers, false),
        None,
        None,
        &never,
    ));
    assert!(!start.rules.may_repeat);
    let keyed = MethodPolicy::Retry(retry_policy(|b| b.retry_with_idempotency_key(true)));
    let mut with_key = HeaderMap::new();
    with_key.insert("idempotency-key", http::HeaderValue::from_static("k"));
    let start = drive(plan(
        Some(keyed.clone()),
        &TABLE,
        &facts(&post, &with_key, false),
        None,
        None,
        &never,
    ));
    assert!(start.rules.may_repeat);
    // A call with nothing to apply passes through. (A call a layer above drives never gets
    // here: the layer passes it on before the entry.)
    let off = TableFacts {
        drive_without_policy: false,
        ..TABLE
    };
    let get_facts = facts(&get, &headers, false);
    assert!(plan(None, &off, &get_facts, None, None, &never).is_none());
    let start = drive(plan(None, &TABLE, &get_facts, None, None, &never));
    assert!(matches!(start.rules.mode, Mode::Single));
    // A hedging policy keeps its record of backends (by default), whatever the table says.
    let hedge = HedgePolicy::builder()
        .max_attempts(2)
        .delay(Duration::ZERO)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    let hedge = MethodPolicy::Hedge(Arc::new(hedge));
    let start = drive(plan(
        Some(hedge.clone()),
        &TABLE,
        &facts(&get, &headers, true),
        None,
        None,
        &never,
    ));
    assert!(matches!(start.rules.mode, Mode::Hedge(..)) && start.track_backends);
}

#[test]
fn the_deadline_is_the_earliest_of_header_timeout_and_extension() {
    let now = t0();
    let read = move || now;
    let get = http::Method::GET;
    let mut grpc_headers = HeaderMap::new();
    grpc_headers.insert("grpc-timeout", http::HeaderValue::from_static("2S"));
    let secs = Duration::from_secs;
    let deadline_of = |timeout: Option<Duration>, call: &CallFacts<'_>| {
        let policy = timeout.map(MethodPolicy::Timeout);
        let start = drive(plan(policy, &TABLE, call, None, None, &read));
        (start.deadline, start.first_timeout(|| now))
    };
    // The first attempt keeps the request's own `grpc-timeout` where it is the deadline,
    // and carries the time left where it is not.
    let left = |timeout| Some(crate::grpc_timeout::encode(timeout));
    let grpc = facts(&get, &grpc_headers, true);
    assert_eq!(deadline_of(None, &grpc), (Some(now + secs(2)), None));
    assert_eq!(
        deadline_of(Some(secs(1)), &grpc),
        (Some(now + secs(1)), left(secs(1)))
    );
    assert_eq!(
        deadline_of(Some(secs(3)), &grpc),
        (Some(now + secs(2)), None)
    );
    // Not gRPC: its `grpc-timeout` is not the call's, and none is sent.
    let http = facts(&get, &grpc_headers, false);
    assert_eq!(deadline_of(None, &http), (None, None));
    assert_eq!(
        deadline_of(Some(secs(5)), &http),
        (Some(now + secs(5)), None)
    );
    let mut with_extension = facts(&get, &grpc_headers, true);
    with_extension.deadline = Some(now + ms(500));
    assert_eq!(
        deadline_of(Some(secs(1)), &with_extension),
        (Some(now + ms(500)), left(ms(500)))
    );
}

#[test]
fn nothing_applies_only_without_a_policy_a_throttle_or_transparent_retries() {
    let off = TableFacts {
        drive_without_policy: false,
        ..TABLE
    };
    assert!(nothing_applies(None, &off));
    assert!(!nothing_applies(None, &TABLE), "transparent retries");
    let throttled = TableFacts {
        has_throttle: true,
        ..off
    };
    assert!(!nothing_applies(None, &throttled), "a throttle to credit");
    let retry = MethodPolicy::Retry(retry_policy(|b| b));
    assert!(!nothing_applies(Some(&retry), &off), "a policy");
}

/// A driver's side of a call's entry, with its throttle and a count of the facts read.
struct TestEntrance {
    headers: HeaderMap,
    facts_read: std::cell::Cell<u32>,
    throttle: Option<ThrottleHandle>,
    /// Overrides the table's "drive calls without a policy", as the `grpc` interceptor does.
    without_policy: Option<bool>,
}

impl TestEntrance {
    fn new(throttle: Option<ThrottleHandle>) -> TestEntrance {
        TestEntrance {
            headers: HeaderMap::new(),
            facts_read: std::cell::Cell::new(0),
            throttle,
            without_policy: None,
        }
    }
}

impl Entrance for TestEntrance {
    fn drive_without_policy(&self, table_says: bool) -> bool {
        self.without_policy.unwrap_or(table_says)
    }

    fn facts(&self) -> CallFacts<'_> {
        self.facts_read.set(self.facts_read.get() + 1);
        CallFacts {
            method: &http::Method::POST,
            grpc: true,
            headers: &self.headers,
            deadline: None,
        }
    }

    fn throttle(&mut self) -> Option<ThrottleHandle> {
        self.throttle.clone()
    }
}

/// A throttle that allows every retry and counts the calls it is told of.
#[derive(Debug, Default)]
struct Deposits(std::sync::atomic::AtomicU32);

impl RetryThrottle for Deposits {
    fn on_call(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn on_success(&self) {}

    fn on_failure(&self) {}

    fn allows_retry(&self) -> bool {
        true
    }
}

/// One entry for every driver: the policy looked up, the plan made from it, the throttle
/// handed to the call, and the deposit paid by a call with a policy alone. A call nothing
/// applies to passes through before its request is read.
#[test]
fn a_call_enters_by_lookup_then_plan_then_the_throttle_s_deposit() {
    let never = || panic!("no timeout: the clock is not read");
    let policy = retry_policy(|b| b.max_attempts(2));
    let policies = Policies::builder()
        .method("pkg.Svc/Retried", MethodPolicy::Retry(policy))
        .transparent_retries(false)
        .build();
    let post = http::Method::POST;
    let deposits = Arc::new(Deposits::default());
    let throttle = Some(Arc::clone(&deposits) as ThrottleHandle);

    // A call with a policy: driven by it, with the throttle, and one deposit.
    let mut entrance = TestEntrance::new(throttle.clone());
    let entered = enter(&policies, &post, "/pkg.Svc/Retried", &mut entrance, &never);
    let start = entered.expect("a call with a policy is driven");
    assert!(matches!(start.rules.mode, Mode::Retry(_)));
    assert_eq!(start.rules.max_attempts, 2);
    assert!(start.rules.throttle.is_some());
    assert_eq!(deposits.0.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Without a policy, and nothing else to drive it for: through, request unread.
    let mut entrance = TestEntrance::new(throttle.clone());
    let entered = enter(&policies, &post, "/pkg.Svc/Other", &mut entrance, &never);
    assert!(entered.is_none());
    assert_eq!(entrance.facts_read.get(), 0);

    // A driver that drives such calls all the same: driven, but no deposit is paid.
    let mut entrance = TestEntrance::new(throttle);
    entrance.without_policy = Some(true);
    let entered = enter(&policies, &post, "/pkg.Svc/Other", &mut entrance, &never);
    let start = entered.expect("driven without a policy");
    assert!(matches!(start.rules.mode, Mode::Single));
    assert_eq!(deposits.0.load(std::sync::atomic::Ordering::SeqCst), 1);
}
