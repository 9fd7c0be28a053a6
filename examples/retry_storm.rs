//! A retry storm: how many attempts each retry strategy sends to a downstream that is down.
//!
//! The downstream answers every attempt after 1 ms with a Trailers-Only `UNAVAILABLE`.
//! 10 000 calls are made on tokio's paused clock, first one at a time (each waits for the
//! previous one, retries included), then at 1 000 calls/s (one spawned every 1 ms whatever
//! the others are doing). Every retrying strategy allows 4 attempts and waits gRFC A6's
//! example backoff (0.1 s, x2, at most 1 s, ±20 %); they differ in what limits retries:
//!
//! - `tower::retry`, nothing else (the naive client);
//! - `tower::retry` with `TpsBudget::default()` (10 s window, 10 retries/s, 20 % of
//!   successes), following tower's budget example;
//! - tower-resilience's retry, as it comes (no budget), and with its AIMD budget;
//! - this crate's `RetryLayer` with the gRFC A6 throttle `(maxTokens 10, tokenRatio 0.1)`,
//!   with a `RetryBudget` (10 s, 10/s, 20 %), with an `AdaptiveThrottle` at its defaults
//!   (k 2, 10 s window), and with the guide's default, the A6 throttle `(20, 1.0)`.
//!
//! It prints the attempts per logical call at both rates. The goal is at most 1.01 for this
//! crate with the A6 throttle.
//!
//! ```text
//! cargo run --release --example retry_storm -- [--calls N] [--seed N]
//! ```

#[path = "support/common.rs"]
mod common;
#[path = "support/peers.rs"]
mod peers;

use std::time::Duration;

use tower::BoxError;

use common::{Cli, paused_runtime, print_table};
use peers::{Downstream, Peer, drive};

const LATENCY: Duration = Duration::from_millis(1);
const GOAL: f64 = 1.01;

fn always_fails(_elapsed: Duration) -> f64 {
    1.0
}

/// Attempts per logical call for `peer`, or `None` for a strategy not written yet.
fn attempts_per_call(
    peer: Peer,
    calls: u64,
    interval: Option<Duration>,
    seed: u64,
) -> Result<Option<f64>, BoxError> {
    let runtime = paused_runtime()?;
    runtime.block_on(async {
        let downstream = Downstream::new(seed, LATENCY, always_fails);
        let Some(service) = peer.service(downstream.clone(), seed)? else {
            return Ok(None);
        };
        let done = drive(service, downstream.start(), calls, interval).await;
        if done.len() as u64 != calls || done.iter().any(|c| c.ok) {
            return Err(format!("{}: calls went missing or succeeded", peer.label()).into());
        }
        Ok(Some(downstream.attempts() as f64 / calls as f64))
    })
}

fn main() -> Result<(), BoxError> {
    let mut cli = Cli::new("retry_storm", "[--calls N] [--seed N]");
    let calls: u64 = cli.value("--calls", 10_000);
    let seed: u64 = cli.value("--seed", 1);
    if calls == 0 {
        cli.fail("--calls must be at least 1");
    }
    cli.finish();

    let mut rows = Vec::new();
    for peer in Peer::ALL {
        let one_at_a_time = attempts_per_call(peer, calls, None, seed)?;
        let at_1000 = attempts_per_call(peer, calls, Some(Duration::from_millis(1)), seed)?;
        let row = match (one_at_a_time, at_1000) {
            (Some(a), Some(b)) => vec![
                peer.label().to_string(),
                format!("{a:.4}"),
                format!("{b:.4}"),
                if a <= GOAL && b <= GOAL { "yes" } else { "no" }.to_string(),
            ],
            _ => vec![
                peer.label().to_string(),
                "(pending)".into(),
                "(pending)".into(),
                "".into(),
            ],
        };
        rows.push(row);
    }
    println!(
        "retry_storm: {calls} calls to a downstream that always answers UNAVAILABLE; \
         at most {} attempts; seed {seed}",
        peers::MAX_ATTEMPTS
    );
    print_table(
        &[
            "strategy",
            "attempts/call, one at a time",
            "attempts/call, 1000 calls/s",
            "<= 1.01",
        ],
        &rows,
    );
    Ok(())
}
