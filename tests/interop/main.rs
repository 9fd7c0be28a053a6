//! Interop: the crate's layers, driven by a service config, against a real gRPC C-core
//! server (Python `grpcio`, `server.py` beside this file).
//!
//! The client side is the `grpc_probe` example's own code: `examples/grpc_probe/probe.rs`
//! is included below, so these tests run exactly what the example runs (codec, layers,
//! attempt counting, output lines) in this process. Running the example binary instead
//! would need a nested `cargo build` (which waits on the build lock `cargo test` holds, or
//! rebuilds everything in a second target dir) or a binary `cargo test --test interop` does
//! not build (and might find stale); only `main`'s few lines of argument handling and exit
//! codes are left out, and [`args`] covers the parsing they call.
//!
//! Needs `python3` with its `venv` module (Debian and Ubuntu: `apt-get install python3
//! python3-venv`) and, the first time, network access to PyPI: the test makes a venv of its
//! own, `target/interop-venv`, and installs `requirements.txt` there (see `python.rs`).
//! Without them every server test fails and names what is missing; `SKIP_INTEROP=1` skips
//! them explicitly. `INTEROP_PYTHON` names another interpreter, one that has grpcio.
//!
//! Times come from a real clock (the server is another process), so delays are checked as
//! lower bounds only; the server's clock is used for gaps between its own arrivals.

#[path = "../../examples/grpc_probe/probe.rs"]
mod probe;

#[cfg(feature = "grpc")]
mod channel_probe;
mod python;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use tonic::client::Grpc;
use tower_retry_hedge::config::ServiceConfig;

use probe::{Args, ArgsError, CallRecord, Probe, RawCodec};

const SKIP_VAR: &str = "SKIP_INTEROP";
/// Where the server's Python comes from, for the failure messages.
const INSTALL: &str = "the test makes target/interop-venv from tests/interop/requirements.txt";
/// How long the server may take to start (importing grpc, binding) or a condition on its
/// records may take to hold before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);
/// The most server stderr kept for a failure message.
const STDERR_KEEP: usize = 16 * 1024;

// ---------------------------------------------------------------------------------
// The Python server
// ---------------------------------------------------------------------------------

/// A running `server.py`; dropping it kills the process and reaps it.
struct PythonServer {
    child: Child,
    // Held open: the server exits when it reads end of file, so it dies with this process
    // even when the test is killed before `Drop` runs.
    _stdin: ChildStdin,
    port: u16,
    stderr: Arc<Mutex<String>>,
}

/// One attempt as the server recorded it.
#[derive(Debug, Clone, Deserialize)]
struct Record {
    call: u32,
    attempt: u32,
    method: String,
    previous_attempts: Option<String>,
    timeout_ms: Option<f64>,
    arrived_ms: f64,
    ended_ms: Option<f64>,
    cancelled: bool,
    code: Option<i32>,
}

/// Starts a server, or returns `None` when `SKIP_INTEROP=1`. Panics, naming the fix, when
/// Python or grpcio is missing.
fn server() -> Option<PythonServer> {
    if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("{SKIP_VAR}=1: interop test skipped");
        return None;
    }
    let python = python::interpreter().unwrap_or_else(|why| panic!("interop test: {why}"));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/server.py");
    let mut child = Command::new(&python)
        .arg(script)
        .arg("--max-seconds")
        .arg("600")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "interop test: cannot run {python:?} ({error}). It needs Python 3 with grpcio \
                 ({INSTALL}); set {} to use another interpreter, or {SKIP_VAR}=1 to skip",
                python::PYTHON_VAR
            )
        });
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr_pipe = child.stderr.take().expect("piped stderr");

    // Drained in the background so the server never blocks on a full pipe.
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&stderr);
    let stderr_reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        let mut pipe = stderr_pipe;
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            let mut kept = sink.lock().unwrap_or_else(|e| e.into_inner());
            kept.push_str(&String::from_utf8_lossy(&chunk[..n]));
            if kept.len() > STDERR_KEEP {
                let cut = kept.len() - STDERR_KEEP;
                let cut = (cut..kept.len())
                    .find(|&i| kept.is_char_boundary(i))
                    .unwrap_or(0);
                kept.drain(..cut);
            }
        }
    });
    let (port_tx, port_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = port_tx.send(lines.next());
        // Keep reading so that nothing the server prints later can block it.
        for _ in lines {}
    });

    let mut server = PythonServer {
        child,
        _stdin: stdin,
        port: 0,
        stderr,
    };
    let first_line = port_rx.recv_timeout(PATIENCE);
    match first_line {
        Ok(Some(Ok(line))) if line.trim().parse::<u16>().is_ok_and(|p| p > 0) => {
            server.port = line.trim().parse().unwrap_or(0);
            // The reader ends by itself when the server exits.
            drop(stderr_reader);
            Some(server)
        }
        other => {
            // Once the process is gone its stderr (an ImportError, typically) is complete.
            let _ = server.child.kill();
            let _ = server.child.wait();
            let _ = stderr_reader.join();
            panic!(
                "interop test: server.py did not print its port (got {other:?}). It needs \
                 Python 3 with grpcio ({INSTALL}), or {SKIP_VAR}=1 to skip. Its stderr:\n{}",
                server.stderr()
            );
        }
    }
}

impl PythonServer {
    fn target(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A probe for `method` with the service config `json`.
    fn probe(&self, json: &str, method: &str, deadline: Option<Duration>) -> Probe {
        let config = ServiceConfig::from_json(json).expect("valid service config");
        let channel = probe::channel(&self.target()).expect("channel");
        Probe::new(
            channel,
            &config,
            method.parse().expect("method path"),
            deadline,
        )
    }

    /// Every attempt the server saw, in arrival order.
    async fn records(&self) -> Vec<Record> {
        let channel = probe::channel(&self.target()).expect("channel");
        let mut client = Grpc::new(channel);
        client.ready().await.expect("control channel ready");
        let response = client
            .unary(
                tonic::Request::new(Bytes::new()),
                "/interop.Control/Records".parse().expect("path"),
                RawCodec,
            )
            .await
            .unwrap_or_else(|status| {
                panic!("records: {status:?}; server stderr:\n{}", self.stderr())
            });
        serde_json::from_slice(response.get_ref()).expect("records are JSON")
    }

    /// The attempts of `call`, in attempt order.
    async fn attempts(&self, call: u32) -> Vec<Record> {
        let mut attempts: Vec<Record> = self
            .records()
            .await
            .into_iter()
            .filter(|r| r.call == call)
            .collect();
        attempts.sort_by_key(|r| r.attempt);
        attempts
    }

    /// Waits (polling, at most [`PATIENCE`]) until `done` holds for the records.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Record]) -> bool) -> Vec<Record> {
        let give_up = tokio::time::Instant::now() + PATIENCE;
        loop {
            let records = self.records().await;
            if done(&records) {
                return records;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "waited {PATIENCE:?} for {what}; records: {records:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A service config with a retry policy for `interop.Retry`: 1 ms initial backoff, so
/// that pushback delays stand out; `extra` is added to the top level.
fn retry_config(max_attempts: u32, codes: &str, extra: &str) -> String {
    format!(
        r#"{{
          "methodConfig": [{{
            "name": [{{"service": "interop.Retry"}}],
            "retryPolicy": {{
              "maxAttempts": {max_attempts}, "initialBackoff": "0.001s", "maxBackoff": "0.002s",
              "backoffMultiplier": 2, "retryableStatusCodes": [{codes}]
            }}
          }}]{extra}
        }}"#
    )
}

fn hedge_config(max_attempts: u32, delay: &str) -> String {
    format!(
        r#"{{
          "methodConfig": [{{
            "name": [{{"service": "interop.Hedge"}}],
            "hedgingPolicy": {{
              "maxAttempts": {max_attempts}, "hedgingDelay": "{delay}",
              "nonFatalStatusCodes": ["UNAVAILABLE"]
            }}
          }}]
        }}"#
    )
}

async fn run_all(probe: &Probe, payload: &str, calls: u32, concurrency: usize) -> Vec<CallRecord> {
    probe.run(payload, calls, concurrency).collect().await
}

fn previous(records: &[Record]) -> Vec<Option<&str>> {
    records
        .iter()
        .map(|r| r.previous_attempts.as_deref())
        .collect()
}

fn codes(records: &[Record]) -> Vec<Option<i32>> {
    records.iter().map(|r| r.code).collect()
}

const UNAVAILABLE: i32 = 14;
const INVALID_ARGUMENT: i32 = 3;
const DEADLINE_EXCEEDED: i32 = 4;

// ---------------------------------------------------------------------------------
// Retries
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn retries_until_success_and_tells_the_server_each_attempt() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(4, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        None,
    );
    let results = run_all(&probe, r#"{"call": {call}, "fail": [14, 14]}"#, 3, 3).await;

    assert_eq!(
        results.iter().map(|r| r.call).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    for result in &results {
        assert_eq!((result.code, result.status), (0, "OK"), "{result:?}");
        assert_eq!(result.reported_attempts, Some(3), "{result:?}");
        assert_eq!(result.sent, 3);
        let reply: serde_json::Value = serde_json::from_slice(&result.response).expect("reply");
        assert_eq!(reply["attempt"], 2);
        let line: serde_json::Value = serde_json::from_str(&result.to_json()).expect("line");
        assert_eq!(line["attempts"], 3);

        let attempts = server.attempts(result.call).await;
        assert_eq!(previous(&attempts), [None, Some("1"), Some("2")]);
        assert_eq!(codes(&attempts), [Some(14), Some(14), Some(0)]);
        assert!(attempts.iter().all(|r| r.method == "/interop.Retry/Call"));
    }
}

#[tokio::test]
async fn pushback_sets_the_delay_before_the_next_attempt() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(4, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        None,
    );
    let results = run_all(
        &probe,
        r#"{"call": {call}, "fail": [14, 14], "pushback": ["300", "0"]}"#,
        1,
        1,
    )
    .await;
    let result = &results[0];
    assert_eq!(result.code, 0, "{result:?}");
    assert_eq!(result.attempts(), 3);
    assert!(result.elapsed >= Duration::from_millis(300), "{result:?}");

    let attempts = server.attempts(0).await;
    assert_eq!(attempts.len(), 3);
    // The backoff alone is at most 2 ms; the server's 300 ms pushback set the wait.
    let gap = attempts[1].arrived_ms - attempts[0].ended_ms.expect("answered");
    assert!(
        gap >= 300.0,
        "retried {gap} ms after a 300 ms pushback: {attempts:#?}"
    );
    assert_eq!(previous(&attempts), [None, Some("1"), Some("2")]);
}

#[tokio::test]
async fn negative_pushback_stops_retrying() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(4, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        None,
    );
    let results = run_all(
        &probe,
        r#"{"call": {call}, "fail": [14, 14], "pushback": ["-1"]}"#,
        1,
        1,
    )
    .await;
    let result = &results[0];
    assert_eq!((result.code, result.status), (UNAVAILABLE, "UNAVAILABLE"));
    assert_eq!(result.message, "scripted failure of attempt 0");
    assert_eq!(result.attempts(), 1);
    assert_eq!(result.sent, 1);
    assert_eq!(server.attempts(0).await.len(), 1);
}

#[tokio::test]
async fn exhausted_attempts_return_the_last_status_with_its_count() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(3, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        None,
    );
    let results = run_all(
        &probe,
        r#"{"call": {call}, "fail": [14, 14, 14, 14]}"#,
        1,
        1,
    )
    .await;
    let result = &results[0];
    assert_eq!(result.code, UNAVAILABLE);
    assert_eq!(result.message, "scripted failure of attempt 2");
    // Read from the error status's metadata (the response was Trailers-Only).
    assert_eq!(result.reported_attempts, Some(3), "{result:?}");
    assert_eq!(result.sent, 3);
    let attempts = server.attempts(0).await;
    assert_eq!(previous(&attempts), [None, Some("1"), Some("2")]);
}

#[tokio::test]
async fn max_attempts_above_the_client_cap_is_clamped_to_five() {
    let Some(server) = server() else { return };
    let probe = server.probe(&retry_config(10, "14", ""), "/interop.Retry/Call", None);
    let results = run_all(
        &probe,
        r#"{"call": {call}, "fail": [14, 14, 14, 14, 14, 14, 14]}"#,
        1,
        1,
    )
    .await;
    assert_eq!(results[0].code, UNAVAILABLE);
    assert_eq!(results[0].reported_attempts, Some(5));
    assert_eq!(server.attempts(0).await.len(), 5);
}

#[tokio::test]
async fn non_retryable_status_is_returned_at_once() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(4, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        None,
    );
    let results = run_all(&probe, r#"{"call": {call}, "fail": [3, 14]}"#, 1, 1).await;
    assert_eq!(
        (results[0].code, results[0].status),
        (INVALID_ARGUMENT, "INVALID_ARGUMENT")
    );
    assert_eq!(results[0].attempts(), 1);
    assert_eq!(codes(&server.attempts(0).await), [Some(INVALID_ARGUMENT)]);
}

#[tokio::test]
async fn methods_without_a_policy_are_not_retried() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(4, r#""UNAVAILABLE""#, ""),
        "/interop.Other/Call",
        None,
    );
    let results = run_all(&probe, r#"{"call": {call}, "fail": [14]}"#, 1, 1).await;
    assert_eq!(results[0].code, UNAVAILABLE);
    assert_eq!(results[0].attempts(), 1);
    assert_eq!(server.attempts(0).await.len(), 1);
}

#[tokio::test]
async fn throttle_stops_retries_when_tokens_run_low() {
    let Some(server) = server() else { return };
    let throttling = r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}"#;
    let probe = server.probe(
        &retry_config(3, r#""UNAVAILABLE""#, throttling),
        "/interop.Retry/Call",
        None,
    );
    let results = run_all(&probe, r#"{"call": {call}, "fail": [14, 14, 14]}"#, 4, 1).await;
    // 10 tokens, one per failed attempt; a retry needs more than 5. Call 0: 9, 8, 7 (three
    // attempts); call 1: 6, then 5 (no third); calls 2 and 3: 4 and 3, no retry.
    let sent: Vec<u32> = results.iter().map(|r| r.sent).collect();
    assert_eq!(sent, [3, 2, 1, 1], "{results:#?}");
    for (call, expected) in [3, 2, 1, 1].into_iter().enumerate() {
        let call = u32::try_from(call).expect("small");
        assert_eq!(server.attempts(call).await.len(), expected, "call {call}");
        assert_eq!(
            results[call as usize].attempts(),
            u32::try_from(expected).expect("small")
        );
    }
}

// ---------------------------------------------------------------------------------
// Deadlines
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn deadline_spans_the_call_and_reaches_the_server() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(4, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        Some(Duration::from_millis(1500)),
    );
    let results = run_all(
        &probe,
        r#"{"call": {call}, "fail": [14], "delay": [0, 10000]}"#,
        1,
        1,
    )
    .await;
    let result = &results[0];
    assert_eq!(
        (result.code, result.status),
        (DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"),
        "{result:?}"
    );
    assert!(result.elapsed >= Duration::from_millis(1500), "{result:?}");
    // The layers made this status, so it carries no count: the probe counted two attempts.
    assert_eq!(result.sent, 2);
    assert_eq!(result.attempts(), 2);

    let attempts = server
        .wait_for("the second attempt to end", |records| {
            records
                .iter()
                .any(|r| r.attempt == 1 && r.ended_ms.is_some())
        })
        .await;
    let timeouts: Vec<f64> = attempts
        .iter()
        .map(|r| r.timeout_ms.expect("a deadline"))
        .collect();
    // Each attempt carries what is left of the call's 1.5 s, never more.
    assert!(timeouts.iter().all(|&t| t <= 1500.0), "{attempts:#?}");
    // The hanging attempt ended before its scripted 10 s: the client went away.
    assert!(
        attempts.iter().any(|r| r.attempt == 1 && r.cancelled),
        "{attempts:#?}"
    );
}

#[tokio::test]
async fn pushback_past_the_deadline_returns_the_failure_at_once() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(4, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        Some(Duration::from_millis(2000)),
    );
    let results = run_all(
        &probe,
        r#"{"call": {call}, "fail": [14, 14], "pushback": ["5000"]}"#,
        1,
        1,
    )
    .await;
    assert_eq!(results[0].code, UNAVAILABLE, "{:?}", results[0]);
    assert_eq!(results[0].attempts(), 1);
    assert_eq!(server.attempts(0).await.len(), 1);
}

#[tokio::test]
async fn service_config_timeout_becomes_the_deadline() {
    let Some(server) = server() else { return };
    let json = r#"{"methodConfig": [{"name": [{"service": "interop.Timed"}], "timeout": "5s"}]}"#;
    let probe = server.probe(json, "/interop.Timed/Call", None);
    assert_eq!(probe.deadline(), Some(Duration::from_secs(5)));
    let results = run_all(&probe, r#"{"call": {call}}"#, 1, 1).await;
    assert_eq!(results[0].code, 0);
    let attempts = server.attempts(0).await;
    let timeout = attempts[0]
        .timeout_ms
        .expect("the config's timeout reached the server");
    assert!(timeout > 0.0 && timeout <= 5000.0, "{attempts:#?}");

    // --deadline-ms and the config's timeout: the shorter wins.
    let shorter = server.probe(
        json,
        "/interop.Timed/Call",
        Some(Duration::from_millis(100)),
    );
    assert_eq!(shorter.deadline(), Some(Duration::from_millis(100)));
    let longer = server.probe(json, "/interop.Timed/Call", Some(Duration::from_secs(9)));
    assert_eq!(longer.deadline(), Some(Duration::from_secs(5)));
}

// ---------------------------------------------------------------------------------
// Hedging
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn hedge_after_the_delay_wins_and_cancels_the_slow_attempt() {
    let Some(server) = server() else { return };
    let probe = server.probe(&hedge_config(3, "0.1s"), "/interop.Hedge/Call", None);
    let results = run_all(&probe, r#"{"call": {call}, "delay": [10000]}"#, 1, 1).await;
    let result = &results[0];
    assert_eq!(result.code, 0, "{result:?}");
    assert_eq!(result.reported_attempts, Some(2), "{result:?}");
    let reply: serde_json::Value = serde_json::from_slice(&result.response).expect("reply");
    assert_eq!(reply["attempt"], 1, "the hedge answered");
    // The hedge left the client 100 ms after the first attempt. (The server's arrival times
    // give no such bound: the first attempt may reach its handler late.)
    assert!(result.elapsed >= Duration::from_millis(100), "{result:?}");

    let attempts = server
        .wait_for("the slow attempt to be cancelled", |records| {
            records
                .iter()
                .any(|r| r.attempt == 0 && r.ended_ms.is_some())
        })
        .await;
    let attempts: Vec<&Record> = attempts.iter().filter(|r| r.call == 0).collect();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let (first, hedge) = (attempts[0], attempts[1]);
    assert_eq!((first.attempt, hedge.attempt), (0, 1));
    assert_eq!(hedge.previous_attempts.as_deref(), Some("1"));
    assert!(
        first.cancelled,
        "the losing attempt is cancelled: {attempts:#?}"
    );
}

#[tokio::test]
async fn non_fatal_failure_sends_the_next_hedge_without_waiting() {
    let Some(server) = server() else { return };
    // A 20 s hedging delay: a hedge that arrives sooner was sent because of the failure.
    let probe = server.probe(&hedge_config(3, "20s"), "/interop.Hedge/Call", None);
    let results = run_all(&probe, r#"{"call": {call}, "fail": [14]}"#, 1, 1).await;
    assert_eq!(results[0].code, 0, "{:?}", results[0]);
    assert_eq!(results[0].reported_attempts, Some(2));
    let attempts = server.attempts(0).await;
    assert_eq!(previous(&attempts), [None, Some("1")]);
    assert!(attempts[1].arrived_ms - attempts[0].arrived_ms < 20_000.0);
}

#[tokio::test]
async fn fatal_status_ends_a_hedged_call() {
    let Some(server) = server() else { return };
    let probe = server.probe(&hedge_config(3, "20s"), "/interop.Hedge/Call", None);
    let results = run_all(&probe, r#"{"call": {call}, "fail": [3]}"#, 1, 1).await;
    assert_eq!(results[0].code, INVALID_ARGUMENT);
    assert_eq!(results[0].attempts(), 1);
    assert_eq!(server.attempts(0).await.len(), 1);
}

// ---------------------------------------------------------------------------------
// The probe itself
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn results_come_in_call_order_under_concurrency() {
    let Some(server) = server() else { return };
    let probe = server.probe(
        &retry_config(2, r#""UNAVAILABLE""#, ""),
        "/interop.Retry/Call",
        None,
    );
    // The server answers call 0 only once call 3 has ended: call 0 ends last, and only
    // if the four calls were in flight together.
    let payload = r#"{"call": {call}, "calls": {"0": {"await_call": 3}}}"#;
    let results = run_all(&probe, payload, 4, 4).await;
    assert_eq!(
        results.iter().map(|r| r.call).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(results.iter().all(|r| r.code == 0), "{results:#?}");

    let records = server.records().await;
    let ended = |call: u32| {
        records
            .iter()
            .find(|r| r.call == call)
            .and_then(|r| r.ended_ms)
            .expect("every call ended")
    };
    assert_eq!(records.len(), 4);
    assert!(
        ended(3) <= ended(0),
        "call 0 waited for call 3: {records:#?}"
    );
}

/// Parsing needs no server.
mod args {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, ArgsError> {
        Args::parse(args.iter().map(|s| (*s).to_owned()))
    }

    const CONFIG: &str = r#"{"methodConfig": []}"#;

    #[test]
    fn every_flag_is_read() {
        let args = parse(&[
            "--target",
            "127.0.0.1:50051",
            "--service-config",
            CONFIG,
            "--method=/pkg.Svc/Get",
            "--payload",
            "n={call}",
            "--calls",
            "7",
            "--concurrency=3",
            "--deadline-ms",
            "250",
        ])
        .expect("valid");
        assert_eq!(args.target, "http://127.0.0.1:50051");
        assert_eq!(args.method.path(), "/pkg.Svc/Get");
        assert_eq!(args.payload, "n={call}");
        assert_eq!((args.calls, args.concurrency), (7, 3));
        assert_eq!(args.deadline, Some(Duration::from_millis(250)));
    }

    #[test]
    fn defaults_apply() {
        let args = parse(&[
            "--target",
            "localhost:1",
            "--service-config",
            CONFIG,
            "--method",
            "/a.B/C",
        ])
        .expect("valid");
        assert_eq!((args.calls, args.concurrency, args.deadline), (1, 1, None));
        assert_eq!(args.payload, "");
    }

    #[test]
    fn service_config_is_read_from_a_file() {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop_config.json");
        std::fs::write(&path, retry_config(3, "14", "")).expect("write config");
        let flag = format!("@{}", path.display());
        let args = parse(&[
            "--target",
            "h:1",
            "--service-config",
            &flag,
            "--method",
            "/interop.Retry/X",
        ])
        .expect("valid");
        assert!(
            args.service_config
                .policies()
                .lookup(&http::Method::POST, "/interop.Retry/X")
                .is_some()
        );

        let missing = parse(&[
            "--target",
            "h:1",
            "--service-config",
            "@/nonexistent/x.json",
            "--method",
            "/a.B/C",
        ]);
        assert!(
            matches!(missing, Err(ArgsError::ConfigFile { .. })),
            "{missing:?}"
        );
    }

    #[test]
    fn invalid_service_config_names_the_json_path() {
        let error = parse(&[
            "--target",
            "h:1",
            "--service-config",
            r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1}}]}"#,
            "--method",
            "/a.B/C",
        ])
        .expect_err("invalid");
        assert!(matches!(error, ArgsError::Config(_)));
        assert_eq!(
            error.to_string(),
            "invalid service config: methodConfig[0].retryPolicy.maxAttempts: \
             must be an integer >= 2, got 1"
        );
    }

    #[test]
    fn bad_arguments_are_refused() {
        let base = [
            "--target",
            "h:1",
            "--service-config",
            CONFIG,
            "--method",
            "/a.B/C",
        ];
        let with = |extra: &[&str]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            parse(&all)
        };
        for extra in [
            &["--calls", "-1"][..],
            &["--concurrency", "0"],
            &["--concurrency", "10001"],
            &["--deadline-ms", "1.5"],
            &["--calls"],
            &["--calls", "1", "--calls", "2"],
            &["--verbose"],
        ] {
            assert!(with(extra).is_err(), "{extra:?} accepted");
        }
        for method in ["a.B/C", "/a.B", "/a.B/", "//C", "/a/B/C", "/a.B/C?x=1"] {
            let result = parse(&[
                "--target",
                "h:1",
                "--service-config",
                CONFIG,
                "--method",
                method,
            ]);
            assert!(
                matches!(
                    result,
                    Err(ArgsError::Value {
                        flag: "--method",
                        ..
                    })
                ),
                "{method}"
            );
        }
        assert!(matches!(
            parse(&["--target", "h:1"]),
            Err(ArgsError::Usage(_))
        ));
        assert!(matches!(parse(&["-h"]), Err(ArgsError::Help)));
        assert!(
            parse(&[
                "--target",
                "not a uri",
                "--service-config",
                CONFIG,
                "--method",
                "/a.B/C"
            ])
            .is_err()
        );
    }

    #[test]
    fn payload_placeholder_is_replaced_everywhere() {
        assert_eq!(
            probe::payload_for("{call}-{call}", 12),
            Bytes::from("12-12")
        );
        assert_eq!(probe::payload_for("plain", 3), Bytes::from("plain"));
    }

    #[test]
    fn output_line_has_the_documented_fields_in_order() {
        let record = CallRecord {
            call: 4,
            code: 14,
            status: "UNAVAILABLE",
            message: "say \"no\"".to_owned(),
            reported_attempts: None,
            sent: 2,
            response: Bytes::new(),
            elapsed: Duration::from_micros(1500),
        };
        assert_eq!(
            record.to_json(),
            r#"{"call": 4, "code": 14, "status": "UNAVAILABLE", "message": "say \"no\"", "attempts": 2, "elapsed_ms": 1.500}"#
        );
        let reported = CallRecord {
            reported_attempts: Some(3),
            ..record
        };
        assert_eq!(reported.attempts(), 3);
    }
}
