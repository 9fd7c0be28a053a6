//! `grpc_channel_probe` (the calls through a `grpc` 0.9 channel and `RetryInterceptor`)
//! against the same C-core server as `grpc_probe`: each scenario runs both probes, each on a
//! fresh server (the server counts attempts per call id), and their answers must agree call
//! by call: status code and name, the status message, and the attempt count.
//!
//! Pushback scenarios are left out: `grpc` 0.9's transport drops the metadata of error
//! trailers, so `grpc-retry-pushback-ms` never reaches the interceptor (see the
//! `grpc_channel` module docs). The last test shows that difference, so that it is known,
//! not hidden.

#[path = "../../examples/grpc_channel_probe/channel.rs"]
mod channel;

use std::time::Duration;

use futures_util::StreamExt;
use tower_retry_hedge::config::ServiceConfig;

use super::{hedge_config, retry_config, run_all, server};
use channel::{ChannelProbe, grpc_target};

/// One comparison: a service config, a method, a payload template, how many calls (made
/// one at a time), and a deadline.
struct Scenario {
    name: &'static str,
    config: String,
    method: &'static str,
    payload: &'static str,
    calls: u32,
    deadline: Option<Duration>,
}

/// What both probes must agree on for one call.
type Answer = (u32, i32, &'static str, String, u32);

fn answer(record: &crate::probe::CallRecord) -> Answer {
    (
        record.call,
        record.code,
        record.status,
        record.message.clone(),
        record.attempts(),
    )
}

async fn grpc_probe_answers(scenario: &Scenario) -> Option<Vec<Answer>> {
    let server = server()?;
    let probe = server.probe(&scenario.config, scenario.method, scenario.deadline);
    let records = run_all(&probe, scenario.payload, scenario.calls, 1).await;
    Some(records.iter().map(answer).collect())
}

async fn channel_probe_answers(scenario: &Scenario) -> Option<Vec<Answer>> {
    let server = server()?;
    let config = ServiceConfig::from_json(&scenario.config).expect("valid service config");
    let target = grpc_target(&server.target()).expect("an http target");
    let probe = ChannelProbe::new(
        &target,
        &config,
        scenario.method.to_owned(),
        scenario.deadline,
    );
    let records: Vec<_> = probe
        .run(scenario.payload, scenario.calls, 1)
        .collect()
        .await;
    Some(records.iter().map(answer).collect())
}

fn scenarios() -> Vec<Scenario> {
    let retry = retry_config(4, r#""UNAVAILABLE""#, "");
    vec![
        Scenario {
            name: "retried until success",
            config: retry.clone(),
            method: "/interop.Retry/Call",
            payload: r#"{"call": {call}, "fail": [14, 14]}"#,
            calls: 2,
            deadline: None,
        },
        Scenario {
            name: "attempts exhausted",
            config: retry_config(3, r#""UNAVAILABLE""#, ""),
            method: "/interop.Retry/Call",
            payload: r#"{"call": {call}, "fail": [14, 14, 14, 14]}"#,
            calls: 1,
            deadline: None,
        },
        Scenario {
            name: "maxAttempts clamped to 5",
            config: retry_config(10, "14", ""),
            method: "/interop.Retry/Call",
            payload: r#"{"call": {call}, "fail": [14, 14, 14, 14, 14, 14, 14]}"#,
            calls: 1,
            deadline: None,
        },
        Scenario {
            name: "a non-retryable status",
            config: retry.clone(),
            method: "/interop.Retry/Call",
            payload: r#"{"call": {call}, "fail": [3, 14]}"#,
            calls: 1,
            deadline: None,
        },
        Scenario {
            name: "a method without a policy",
            config: retry.clone(),
            method: "/interop.Other/Call",
            payload: r#"{"call": {call}, "fail": [14]}"#,
            calls: 1,
            deadline: None,
        },
        Scenario {
            name: "the throttle",
            config: retry_config(
                3,
                r#""UNAVAILABLE""#,
                r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}"#,
            ),
            method: "/interop.Retry/Call",
            payload: r#"{"call": {call}, "fail": [14, 14, 14]}"#,
            calls: 4,
            deadline: None,
        },
        Scenario {
            name: "a hedge after the delay wins",
            config: hedge_config(3, "0.1s"),
            method: "/interop.Hedge/Call",
            payload: r#"{"call": {call}, "delay": [10000]}"#,
            calls: 1,
            deadline: None,
        },
        Scenario {
            name: "a non-fatal failure sends the next hedge at once",
            config: hedge_config(3, "20s"),
            method: "/interop.Hedge/Call",
            payload: r#"{"call": {call}, "fail": [14]}"#,
            calls: 1,
            deadline: None,
        },
        // Every attempt goes at once; the answer counts them all, whichever won (the first
        // or the second to reach the server), through both drivers.
        Scenario {
            name: "hedging delay 0, the first to arrive wins",
            config: hedge_config(3, "0s"),
            method: "/interop.Hedge/Call",
            payload: r#"{"call": {call}, "delay": [0, 10000, 10000]}"#,
            calls: 1,
            deadline: None,
        },
        Scenario {
            name: "hedging delay 0, the second to arrive wins",
            config: hedge_config(3, "0s"),
            method: "/interop.Hedge/Call",
            payload: r#"{"call": {call}, "delay": [10000, 0, 10000]}"#,
            calls: 1,
            deadline: None,
        },
        Scenario {
            name: "a fatal status ends a hedged call",
            config: hedge_config(3, "20s"),
            method: "/interop.Hedge/Call",
            payload: r#"{"call": {call}, "fail": [3]}"#,
            calls: 1,
            deadline: None,
        },
    ]
}

#[tokio::test]
async fn the_grpc_channel_probe_gives_the_same_answers_as_grpc_probe() {
    for scenario in scenarios() {
        let Some(expected) = grpc_probe_answers(&scenario).await else {
            return;
        };
        let Some(answers) = channel_probe_answers(&scenario).await else {
            return;
        };
        assert_eq!(answers, expected, "{}", scenario.name);
    }
}

#[tokio::test]
async fn a_deadline_ends_both_probes_calls_alike() {
    let scenario = Scenario {
        name: "a deadline across attempts",
        config: retry_config(4, r#""UNAVAILABLE""#, ""),
        method: "/interop.Retry/Call",
        payload: r#"{"call": {call}, "fail": [14], "delay": [0, 10000]}"#,
        calls: 1,
        deadline: Some(Duration::from_millis(500)),
    };
    let Some(expected) = grpc_probe_answers(&scenario).await else {
        return;
    };
    let Some(answers) = channel_probe_answers(&scenario).await else {
        return;
    };
    // The messages are each client's own; code, name and attempts agree.
    let strip = |answers: Vec<Answer>| -> Vec<(u32, i32, &'static str, u32)> {
        answers
            .into_iter()
            .map(|(c, code, name, _, n)| (c, code, name, n))
            .collect()
    };
    assert_eq!(strip(answers), strip(expected), "{}", scenario.name);
}

#[tokio::test]
async fn pushback_does_not_reach_the_interceptor_through_grpc_0_9() {
    // C-core's client (and `grpc_probe`) stop at a negative pushback; through `grpc` 0.9
    // the pushback is dropped before the interceptor, which retries by its policy.
    let scenario = Scenario {
        name: "a negative pushback",
        config: retry_config(4, r#""UNAVAILABLE""#, ""),
        method: "/interop.Retry/Call",
        payload: r#"{"call": {call}, "fail": [14, 14], "pushback": ["-1"]}"#,
        calls: 1,
        deadline: None,
    };
    let Some(expected) = grpc_probe_answers(&scenario).await else {
        return;
    };
    let Some(answers) = channel_probe_answers(&scenario).await else {
        return;
    };
    assert_eq!(expected[0].4, 1, "grpc_probe stops at the pushback");
    assert_eq!(answers[0].4, 3, "the interceptor never saw it: {answers:?}");
}
