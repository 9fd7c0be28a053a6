//! A brown-out: goodput and load of each retry strategy while a downstream degrades, fails
//! outright, and recovers.
//!
//! Calls arrive at 200 per second on tokio's paused clock for 30 s. The downstream answers
//! every attempt after 1 ms; it fails 30 % of attempts (Trailers-Only `UNAVAILABLE`) for the
//! first 10 s, all of them for the next 10 s, and none after that. The strategies are those
//! of `retry_storm` (4 attempts, gRFC A6's example backoff, and what limits retries).
//!
//! For each phase it prints the mean goodput (calls that ended `OK`, per second of their
//! end) and load (attempts the downstream received, per second). With `--csv` it prints the
//! per-second figures as CSV on stdout (`second,strategy,goodput,load`) and the tables on
//! stderr.
//!
//! ```text
//! cargo run --release --example brownout -- [--seed N] [--csv]
//! ```

#[path = "support/common.rs"]
mod common;
#[path = "support/peers.rs"]
mod peers;

use std::time::Duration;

use tower::BoxError;

use common::{Cli, paused_runtime, render_table};
use peers::{Downstream, Peer, drive};

const LATENCY: Duration = Duration::from_millis(1);
const RATE: u64 = 200;
const PHASE_SECS: u64 = 10;

/// The phases: a name and the share of attempts that fail.
const PHASES: [(&str, f64); 3] = [
    ("30 % of attempts fail", 0.3),
    ("every attempt fails", 1.0),
    ("recovered", 0.0),
];

fn failure_rate(elapsed: Duration) -> f64 {
    let phase = usize::try_from(elapsed.as_secs() / PHASE_SECS).unwrap_or(usize::MAX);
    PHASES.get(phase).map_or(0.0, |&(_, rate)| rate)
}

/// Goodput and load in each second of one strategy's run.
struct Timeline {
    goodput: Vec<u64>,
    load: Vec<u64>,
}

fn run(peer: Peer, seed: u64) -> Result<Option<Timeline>, BoxError> {
    let runtime = paused_runtime()?;
    runtime.block_on(async {
        let downstream = Downstream::new(seed, LATENCY, failure_rate);
        let Some(service) = peer.service(downstream.clone(), seed)? else {
            return Ok(None);
        };
        let calls = RATE * PHASE_SECS * PHASES.len() as u64;
        let interval = Duration::from_secs(1) / RATE as u32;
        let done = drive(service, downstream.start(), calls, Some(interval)).await;
        let load = downstream.attempts_per_second();
        let mut goodput = vec![0u64; load.len()];
        for completion in done.iter().filter(|c| c.ok) {
            let second = usize::try_from(completion.at.as_secs()).unwrap_or(usize::MAX);
            if goodput.len() <= second {
                goodput.resize(second + 1, 0);
            }
            if let Some(count) = goodput.get_mut(second) {
                *count += 1;
            }
        }
        Ok(Some(Timeline { goodput, load }))
    })
}

/// The mean of `values` over the seconds of phase `phase`.
fn phase_mean(values: &[u64], phase: usize) -> f64 {
    let from = phase * PHASE_SECS as usize;
    let sum: u64 = values.iter().skip(from).take(PHASE_SECS as usize).sum();
    sum as f64 / PHASE_SECS as f64
}

fn main() -> Result<(), BoxError> {
    let mut cli = Cli::new("brownout", "[--seed N] [--csv]");
    let seed: u64 = cli.value("--seed", 1);
    let csv = cli.flag("--csv");
    cli.finish();

    let mut timelines = Vec::new();
    for peer in Peer::ALL {
        timelines.push((peer, run(peer, seed)?));
    }

    let mut report = format!(
        "brownout: {RATE} calls/s, phases of {PHASE_SECS} s, downstream latency 1 ms, at most \
         {} attempts; seed {seed}; per-second means\n",
        peers::MAX_ATTEMPTS
    );
    for (i, (name, _)) in PHASES.iter().enumerate() {
        let from = i as u64 * PHASE_SECS;
        report.push_str(&format!(
            "\nphase {}: {from}-{} s, {name}\n",
            i + 1,
            from + PHASE_SECS
        ));
        let rows: Vec<Vec<String>> = timelines
            .iter()
            .map(|(peer, timeline)| match timeline {
                Some(t) => {
                    let (goodput, load) = (phase_mean(&t.goodput, i), phase_mean(&t.load, i));
                    vec![
                        peer.label().to_string(),
                        format!("{goodput:.1}"),
                        format!("{load:.1}"),
                        format!("{:.2}", load / RATE as f64),
                    ]
                }
                None => vec![
                    peer.label().to_string(),
                    "(pending)".into(),
                    "(pending)".into(),
                    "".into(),
                ],
            })
            .collect();
        report.push_str(&render_table(
            &["strategy", "goodput/s", "load/s", "load per offered call"],
            &rows,
        ));
    }

    if csv {
        eprint!("{report}");
        println!("second,strategy,goodput,load");
        for (peer, timeline) in &timelines {
            let Some(t) = timeline else { continue };
            for second in 0..t.load.len().max(t.goodput.len()) {
                println!(
                    "{second},{},{},{}",
                    peer.id(),
                    t.goodput.get(second).copied().unwrap_or(0),
                    t.load.get(second).copied().unwrap_or(0)
                );
            }
        }
    } else {
        print!("{report}");
    }
    Ok(())
}
