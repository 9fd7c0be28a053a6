//! The README's "Defaults" table against what the code builds: each row's two cells are
//! made here from the defaults of a table built in code and of one made from service-config
//! JSON, and must read as the README says. A default that changes without its row, or a
//! row added or dropped without a check here, fails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use crate::backoff::Jitter;
use crate::config::ServiceConfig;
use crate::policy::{HedgeDelay, HedgePolicy, MethodPolicy, Policies, RetryPolicy};
use crate::throttle::HedgeBudget;

const README: &str = include_str!("../../../README.md");

/// The rows of the README's "Defaults" table: setting -> (built in code, from JSON).
fn readme_rows() -> BTreeMap<String, (String, String)> {
    let section = README
        .split("\n## Defaults\n")
        .nth(1)
        .expect("README.md has a \"## Defaults\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut rows = BTreeMap::new();
    let lines = section.lines().filter(|line| line.starts_with('|'));
    // The header and the separator line come first.
    for line in lines.skip(2) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 3, "a row of three cells: {line}");
        let previous = rows.insert(
            cells[0].to_owned(),
            (cells[1].to_owned(), cells[2].to_owned()),
        );
        assert!(previous.is_none(), "the row {} is given twice", cells[0]);
    }
    rows
}

/// A service config with one retry and one hedging policy, each with only its required
/// fields, and `extra` at the top level.
fn from_json(extra: &str) -> Policies {
    let json = format!(
        r#"{{"methodConfig": [
            {{"name": [{{"service": "p.Retry"}}],
              "retryPolicy": {{"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                              "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}}},
            {{"name": [{{"service": "p.Hedge"}}], "hedgingPolicy": {{"maxAttempts": 3}}}}
          ]{extra}}}"#
    );
    ServiceConfig::from_json(&json)
        .expect("a valid service config")
        .policies()
}

/// A table built in code with the builders' defaults.
fn in_code() -> Policies {
    let retry = RetryPolicy::builder()
        .build()
        .expect("the default retry policy");
    let hedge = HedgePolicy::builder()
        .delay(Duration::ZERO)
        .build()
        .expect("a hedging policy with a delay");
    Policies::builder()
        .service("p.Retry", retry)
        .service("p.Hedge", hedge)
        .build()
}

fn retry_of(policies: &Policies) -> Arc<RetryPolicy> {
    match policies.lookup(&Method::POST, "/p.Retry/M") {
        Some(MethodPolicy::Retry(policy)) => policy.clone(),
        other => panic!("a retry policy, not {other:?}"),
    }
}

fn hedge_of(policies: &Policies) -> Arc<HedgePolicy> {
    match policies.lookup(&Method::POST, "/p.Hedge/M") {
        Some(MethodPolicy::Hedge(policy)) => policy.clone(),
        other => panic!("a hedging policy, not {other:?}"),
    }
}

fn budget(budget: Option<&HedgeBudget>) -> String {
    let Some(budget) = budget else {
        return "none".to_owned();
    };
    format!(
        "{} % of calls over {} s, plus {} hedges a second",
        budget.ratio() * 100.0,
        budget.window().as_secs(),
        budget.min_per_second()
    )
}

fn transparent(policies: &Policies, policy: &RetryPolicy) -> String {
    assert!(
        policies.transparent_retries(),
        "on for calls without a policy"
    );
    format!(
        "on, also for calls without a policy; at most {} in a row without a deadline",
        policy.max_transparent_retries
    )
}

fn resets(policies: &Policies) -> String {
    let resets = policies.stream_resets();
    match (resets.per_second(), resets.burst()) {
        (Some(per_second), Some(burst)) => {
            format!("{per_second} resets a second, in bursts of {burst}")
        }
        _ => "none: every loser reset at once".to_owned(),
    }
}

fn buffers(policies: &Policies) -> String {
    let limits = policies.buffer_limits();
    format!(
        "{} KiB per call, {} MiB in all",
        limits.per_call() / 1024,
        limits.total() / (1024 * 1024)
    )
}

fn tracking(policies: &Policies) -> String {
    let on = |on: bool| if on { "on" } else { "off" };
    format!(
        "hedging policies: {}; retry policies: {}",
        on(hedge_of(policies).tracks_backends()),
        on(policies.track_backends())
    )
}

/// The jitter of a policy's backoff, which its debug form names.
fn jitter(policy: &RetryPolicy) -> String {
    let grpc = format!("{:?}", Jitter::GRPC);
    assert!(
        format!("{:?}", policy.backoff()).contains(&grpc),
        "{:?}",
        policy.backoff()
    );
    let Jitter::Proportional(f) = Jitter::GRPC else {
        unreachable!("gRPC's jitter is proportional")
    };
    format!("× U({}, {})", 1.0 - f, 1.0 + f)
}

#[test]
fn the_readme_defaults_table_is_what_the_code_builds() {
    let code = in_code();
    let json = from_json("");
    let json_throttled = from_json(r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 1}"#);
    let json_timeout = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "p.Retry"}],
            "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                "backoffMultiplier": 2, "retryableStatusCodes": [],
                "perAttemptRecvTimeout": "0.25s"}}]}"#,
    )
    .expect("a valid service config")
    .policies();

    let mut expected: BTreeMap<&str, (String, String)> = BTreeMap::new();

    assert!(code.throttle_state().is_none() && json.throttle_state().is_none());
    assert!(json_throttled.throttle_state().is_some());
    expected.insert(
        "retry throttle",
        (
            "none".to_owned(),
            "none; `retryThrottling` gives the A6 bucket".to_owned(),
        ),
    );

    expected.insert(
        "hedge budget",
        (
            budget(hedge_of(&code).budget()),
            budget(hedge_of(&json).budget()),
        ),
    );

    let no_delay = HedgePolicy::builder().max_attempts(3).build();
    assert!(
        no_delay
            .as_ref()
            .is_err_and(|error| error.to_string().starts_with("delay: ")),
        "{no_delay:?}"
    );
    assert!(matches!(hedge_of(&json).delay(), HedgeDelay::Fixed(d) if d.is_zero()));
    expected.insert(
        "hedging delay",
        (
            "none: `delay` or `adaptive_delay` must be given".to_owned(),
            "`hedgingDelay`; 0 when absent".to_owned(),
        ),
    );

    expected.insert(
        "transparent retries",
        (
            transparent(&code, &retry_of(&code)),
            transparent(&json, &retry_of(&json)),
        ),
    );
    expected.insert("HTTP/2 reset pacing", (resets(&code), resets(&json)));
    expected.insert("replay buffer limits", (buffers(&code), buffers(&json)));
    expected.insert(
        "`maxAttempts` cap",
        (
            code.max_attempts_cap().to_string(),
            json.max_attempts_cap().to_string(),
        ),
    );
    expected.insert(
        "pushback cap",
        (
            format!("{} s", code.max_pushback().as_secs()),
            format!("{} s", json.max_pushback().as_secs()),
        ),
    );

    assert_eq!(retry_of(&code).per_attempt_timeout, None);
    assert_eq!(retry_of(&json).per_attempt_timeout, None);
    assert_eq!(
        retry_of(&json_timeout).per_attempt_timeout,
        Some(Duration::from_millis(250))
    );
    expected.insert(
        "per-attempt timeout",
        (
            "none".to_owned(),
            "`perAttemptRecvTimeout`; none when absent".to_owned(),
        ),
    );

    expected.insert("backend tracking", (tracking(&code), tracking(&json)));
    expected.insert(
        "backoff jitter",
        (jitter(&retry_of(&code)), jitter(&retry_of(&json))),
    );

    let readme = readme_rows();
    let named = |rows: Vec<&str>| rows.join(", ");
    assert_eq!(
        named(readme.keys().map(String::as_str).collect()),
        named(expected.keys().copied().collect()),
        "the README's rows and the rows checked here"
    );
    for (setting, (in_code, in_json)) in &expected {
        let (readme_code, readme_json) = &readme[*setting];
        assert_eq!(readme_code, in_code, "{setting}, built in code");
        assert_eq!(readme_json, in_json, "{setting}, from JSON");
    }
}
