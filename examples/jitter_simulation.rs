//! The model of the AWS Architecture Blog study "Exponential Backoff And Jitter" (Marc
//! Brooker, 2015), run with this crate's backoff schedules.
//!
//! N clients each update one shared record once, by optimistic concurrency: read the
//! record's version, then write it back on the condition that the version has not changed.
//! Every message (read request, read reply, write request, write reply) takes
//! `|Normal(10 ms, σ 2 ms)|`. A client whose write lost the race waits `backoff(n)` after
//! its `n`-th failure (n = 1, 2, …), counted from the moment it sends its next read, as in
//! the study. With `base` 5 ms and `cap` 2 s, `expo(n) = min(cap, 2^n · base)`:
//!
//! | strategy | wait after failure n | this crate's type |
//! |---|---|---|
//! | `exponential` | `expo(n)` | `Exponential::new(base, cap, 2.0, Jitter::None)`, attempt `n` |
//! | `full` | `U(0, expo(n))` | the same with `Jitter::Full` |
//! | `equal` | `expo(n)/2 + U(0, expo(n)/2)` | the same with `Jitter::Equal` |
//! | `decorrelated` | `min(cap, U(base, 3 · previous))` | `Decorrelated::new(base, cap)` |
//! | `none` | 0 | — |
//! | `table` | seed 002's table, `±50 %` | `Table::seed_default()`, wait number `n - 1` |
//! | `grpc` | `expo(n) · U(0.8, 1.2)` | `Exponential::grpc(base, cap, 2.0)`, attempt `n` |
//!
//! `table` is the crate's reconnect schedule as it ships (0, 10, 10, 100, 100, 500, 500,
//! 3000, 3000, 5000 ms `±50 %`), not a table built from the study's `base` and `cap`.
//!
//! For each N in 10, 30, …, 190 and each strategy the simulation measures the completion
//! time (until the last client is done) and the work (writes sent), averaged over `--runs`
//! runs, and prints them as CSV on stdout (`clients,strategy,time_ms,writes`). It writes an
//! SVG plot of both to `--svg` (default `target/jitter_simulation.svg`) and a short check of
//! the study's findings to stderr. Time is a discrete-event queue, not a clock, so the
//! default 100 runs take a few seconds.
//!
//! ```text
//! cargo run --release --example jitter_simulation -- [--seed N] [--runs N] [--svg PATH]
//! ```

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::error::Error;
use std::f64::consts::TAU;
use std::path::PathBuf;
use std::time::Duration;

use plotters::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tower_retry_hedge::backoff::{Backoff, Decorrelated, Exponential, Jitter, Step, Table};

const BASE: Duration = Duration::from_millis(5);
const CAP: Duration = Duration::from_secs(2);
const NET_MEAN_MS: f64 = 10.0;
const NET_SD_MS: f64 = 2.0;
const CLIENTS: [usize; 10] = [10, 30, 50, 70, 90, 110, 130, 150, 170, 190];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Exponential,
    Full,
    Equal,
    Decorrelated,
    None,
    Table,
    Grpc,
}

impl Strategy {
    const ALL: [Strategy; 7] = [
        Strategy::Exponential,
        Strategy::Full,
        Strategy::Equal,
        Strategy::Decorrelated,
        Strategy::None,
        Strategy::Table,
        Strategy::Grpc,
    ];

    fn name(self) -> &'static str {
        match self {
            Strategy::Exponential => "exponential",
            Strategy::Full => "full",
            Strategy::Equal => "equal",
            Strategy::Decorrelated => "decorrelated",
            Strategy::None => "none",
            Strategy::Table => "table",
            Strategy::Grpc => "grpc",
        }
    }

    fn color(self) -> RGBColor {
        match self {
            Strategy::Exponential => RGBColor(214, 39, 40),
            Strategy::Full => RGBColor(31, 119, 180),
            Strategy::Equal => RGBColor(44, 160, 44),
            Strategy::Decorrelated => RGBColor(148, 103, 189),
            Strategy::None => RGBColor(127, 127, 127),
            Strategy::Table => RGBColor(255, 127, 14),
            Strategy::Grpc => RGBColor(23, 190, 207),
        }
    }
}

/// The crate's schedules, built once.
struct Schedules {
    exponential: Exponential,
    full: Exponential,
    equal: Exponential,
    decorrelated: Decorrelated,
    table: Table,
    grpc: Exponential,
}

impl Schedules {
    fn new() -> Result<Self, Box<dyn Error>> {
        // `Exponential` gives `initial * 2^attempt`; with `initial = base` and the study's
        // 1-based failure count as the attempt, that is exactly `expo(n) = 2^n * base`.
        Ok(Schedules {
            exponential: Exponential::new(BASE, CAP, 2.0, Jitter::None)?,
            full: Exponential::new(BASE, CAP, 2.0, Jitter::Full)?,
            equal: Exponential::new(BASE, CAP, 2.0, Jitter::Equal)?,
            decorrelated: Decorrelated::new(BASE, CAP)?,
            table: Table::seed_default(),
            grpc: Exponential::grpc(BASE, CAP, 2.0)?,
        })
    }

    /// The wait after failure number `n` (1-based); `previous` is the client's last wait.
    fn wait(
        &self,
        strategy: Strategy,
        n: u32,
        previous: Option<Duration>,
        rng: &mut SmallRng,
    ) -> Duration {
        let step = Step::new(n);
        match strategy {
            Strategy::Exponential => self.exponential.sample(step, rng),
            Strategy::Full => self.full.sample(step, rng),
            Strategy::Equal => self.equal.sample(step, rng),
            Strategy::Decorrelated => self.decorrelated.sample(
                Step {
                    attempt: n,
                    previous,
                },
                rng,
            ),
            Strategy::None => Duration::ZERO,
            // The table's wait numbers are 0-based: its first entry is the first wait.
            Strategy::Table => self.table.sample(Step::new(n.saturating_sub(1)), rng),
            Strategy::Grpc => self.grpc.sample(step, rng),
        }
    }
}

/// What arrives where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    /// A read request reaches the server.
    Read,
    /// The server's reply, with the version it read, reaches the client.
    ReadReply(u64),
    /// A conditional write for this version reaches the server.
    Write(u64),
    /// The outcome of the write reaches the client.
    WriteReply(bool),
}

#[derive(Debug, PartialEq, Eq)]
struct Event {
    at_ns: u64,
    // Ties (rare with continuous delays) break by insertion order, so a run is repeatable.
    seq: u64,
    client: usize,
    message: Message,
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap and the earliest event goes first.
        (other.at_ns, other.seq).cmp(&(self.at_ns, self.seq))
    }
}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `|Normal(mean, sd)|` milliseconds, in nanoseconds (Box–Muller).
fn net_delay_ns(rng: &mut SmallRng) -> u64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: the logarithm stays finite
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos();
    let ms = (NET_MEAN_MS + NET_SD_MS * z).abs();
    (ms * 1e6) as u64
}

#[derive(Debug, Default, Clone, Copy)]
struct RunResult {
    time_ns: u64,
    writes: u64,
}

struct Client {
    failures: u32,
    previous_wait: Option<Duration>,
}

/// One run: `clients` clients start at time zero; returns when the last one is done.
fn run_once(
    clients: usize,
    strategy: Strategy,
    schedules: &Schedules,
    rng: &mut SmallRng,
) -> RunResult {
    let mut queue = BinaryHeap::with_capacity(clients * 2);
    let mut seq = 0u64;
    let mut push = |queue: &mut BinaryHeap<Event>, at_ns: u64, client: usize, message| {
        seq += 1;
        queue.push(Event {
            at_ns,
            seq,
            client,
            message,
        });
    };
    let mut state: Vec<Client> = (0..clients)
        .map(|_| Client {
            failures: 0,
            previous_wait: None,
        })
        .collect();
    for client in 0..clients {
        let at = net_delay_ns(rng);
        push(&mut queue, at, client, Message::Read);
    }
    let mut version = 0u64;
    let mut result = RunResult::default();
    while let Some(event) = queue.pop() {
        let now = event.at_ns;
        result.time_ns = now;
        let client = event.client;
        match event.message {
            Message::Read => {
                let at = now + net_delay_ns(rng);
                push(&mut queue, at, client, Message::ReadReply(version));
            }
            Message::ReadReply(read) => {
                let at = now + net_delay_ns(rng);
                push(&mut queue, at, client, Message::Write(read));
            }
            Message::Write(expected) => {
                result.writes += 1;
                let won = expected == version;
                if won {
                    version += 1;
                }
                let at = now + net_delay_ns(rng);
                push(&mut queue, at, client, Message::WriteReply(won));
            }
            Message::WriteReply(true) => {}
            Message::WriteReply(false) => {
                let Some(c) = state.get_mut(client) else {
                    continue;
                };
                c.failures += 1;
                let wait = schedules.wait(strategy, c.failures, c.previous_wait, rng);
                c.previous_wait = Some(wait);
                let wait_ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                let at = now
                    .saturating_add(net_delay_ns(rng))
                    .saturating_add(wait_ns);
                push(&mut queue, at, client, Message::Read);
            }
        }
    }
    result
}

#[derive(Debug, Clone, Copy)]
struct Row {
    clients: usize,
    strategy: Strategy,
    time_ms: f64,
    writes: f64,
}

struct Args {
    seed: u64,
    runs: u32,
    svg: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seed: 1,
        runs: 100,
        svg: PathBuf::from("target/jitter_simulation.svg"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--seed" => {
                args.seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?;
            }
            "--runs" => {
                args.runs = value("--runs")?
                    .parse()
                    .map_err(|e| format!("--runs: {e}"))?;
                if args.runs == 0 {
                    return Err("--runs must be at least 1".into());
                }
            }
            "--svg" => args.svg = PathBuf::from(value("--svg")?),
            "-h" | "--help" => {
                eprintln!(
                    "usage: jitter_simulation [--seed N] [--runs N] [--svg PATH]\n\
                     defaults: --seed 1 --runs 100 --svg target/jitter_simulation.svg"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("jitter_simulation: {e}");
            std::process::exit(2);
        }
    };
    let schedules = Schedules::new()?;
    let mut rows = Vec::new();
    println!("clients,strategy,time_ms,writes");
    for (si, &strategy) in Strategy::ALL.iter().enumerate() {
        for &clients in &CLIENTS {
            // One generator per (strategy, N), so any cell can be reproduced on its own.
            let mut rng = SmallRng::seed_from_u64(
                args.seed ^ ((clients as u64) << 32) ^ ((si as u64 + 1) << 56),
            );
            let (mut time_ns, mut writes) = (0u128, 0u128);
            for _ in 0..args.runs {
                let r = run_once(clients, strategy, &schedules, &mut rng);
                time_ns += u128::from(r.time_ns);
                writes += u128::from(r.writes);
            }
            let runs = f64::from(args.runs);
            rows.push(Row {
                clients,
                strategy,
                time_ms: time_ns as f64 / 1e6 / runs,
                writes: writes as f64 / runs,
            });
        }
    }
    rows.sort_by_key(|r| {
        (
            r.clients,
            Strategy::ALL.iter().position(|&s| s == r.strategy),
        )
    });
    for r in &rows {
        println!(
            "{},{},{:.1},{:.1}",
            r.clients,
            r.strategy.name(),
            r.time_ms,
            r.writes
        );
    }
    check(&rows);
    if let Some(dir) = args.svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    plot(&rows, &args.svg)?;
    eprintln!("plot written to {}", args.svg.display());
    Ok(())
}

fn cell(rows: &[Row], clients: usize, strategy: Strategy) -> Option<Row> {
    rows.iter()
        .copied()
        .find(|r| r.clients == clients && r.strategy == strategy)
}

/// The exponent `k` of `writes ~ N^k`, fitted by least squares on logarithms over the
/// upper half of the range, where the constant terms matter least.
fn growth_exponent(rows: &[Row], strategy: Strategy) -> f64 {
    let points: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.strategy == strategy && r.clients >= 90)
        .map(|r| ((r.clients as f64).ln(), r.writes.ln()))
        .collect();
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (cov, var) = points.iter().fold((0.0, 0.0), |(c, v), (x, y)| {
        (c + (x - mx) * (y - my), v + (x - mx) * (x - mx))
    });
    cov / var
}

/// The strategy that does the least work at `clients`, among `candidates`.
fn least_work(rows: &[Row], clients: usize, candidates: &[Strategy]) -> Option<Row> {
    candidates
        .iter()
        .filter_map(|&s| cell(rows, clients, s))
        .min_by(|a, b| a.writes.total_cmp(&b.writes))
}

/// Prints the study's three findings as measured here, to stderr.
fn check(rows: &[Row]) {
    let top = CLIENTS[CLIENTS.len() - 1];
    eprintln!("strategy      writes@N={top}  time@N={top} (ms)  k in writes ~ N^k (N = 90..190)");
    for &s in &Strategy::ALL {
        if let Some(r) = cell(rows, top, s) {
            let k = growth_exponent(rows, s);
            eprintln!(
                "{:<13} {:>11.1}  {:>15.1}  {k:.2}",
                s.name(),
                r.writes,
                r.time_ms
            );
        }
    }
    let study = &Strategy::ALL[..5];
    let winners = |candidates: &[Strategy]| {
        CLIENTS
            .iter()
            .filter_map(|&n| least_work(rows, n, candidates))
            .map(|r| format!("{}:{}", r.clients, r.strategy.name()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!("least work, the study's five: {}", winners(study));
    eprintln!("least work, all seven:        {}", winners(&Strategy::ALL));
    let slowest: Vec<_> = CLIENTS
        .iter()
        .filter_map(|&n| {
            let mut by_time: Vec<_> = Strategy::ALL
                .iter()
                .filter_map(|&s| cell(rows, n, s))
                .collect();
            by_time.sort_by(|a, b| b.time_ms.total_cmp(&a.time_ms));
            let first = by_time.first()?;
            let second = by_time.get(1)?;
            Some(format!(
                "{n}:{} x{:.1}",
                first.strategy.name(),
                first.time_ms / second.time_ms,
            ))
        })
        .collect();
    eprintln!(
        "slowest, and how many times slower than the next: {}",
        slowest.join(" ")
    );
}

fn plot(rows: &[Row], path: &std::path::Path) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let max_time = rows.iter().map(|r| r.time_ms).fold(1.0, f64::max);
    let min_time = rows.iter().map(|r| r.time_ms).fold(f64::MAX, f64::min);
    let max_writes = rows.iter().map(|r| r.writes).fold(1.0, f64::max);
    // Time on a log scale: exponential backoff without jitter is an order of magnitude
    // slower than the rest. Work on a linear scale, where N^2 growth shows as a curve.
    let mut time_chart = ChartBuilder::on(&left)
        .caption("Completion time (ms, log scale)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // Head room above the curves for the legend.
        .build_cartesian_2d(
            0usize..200usize,
            (min_time * 0.8..max_time * 8.0).log_scale(),
        )?;
    time_chart
        .configure_mesh()
        .x_desc("clients (N)")
        .y_desc("time (ms)")
        .draw()?;
    for &s in &Strategy::ALL {
        let points = series(rows, s, |r| r.time_ms);
        let color = s.color();
        time_chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(s.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    time_chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    let mut work_chart = ChartBuilder::on(&right)
        .caption("Work: writes sent", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0usize..200usize, 0.0..max_writes * 1.05)?;
    work_chart
        .configure_mesh()
        .x_desc("clients (N)")
        .y_desc("writes")
        .draw()?;
    for &s in &Strategy::ALL {
        let points = series(rows, s, |r| r.writes);
        let color = s.color();
        work_chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(s.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    work_chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One strategy's points, in order of N.
fn series(rows: &[Row], strategy: Strategy, value: fn(&Row) -> f64) -> Vec<(usize, f64)> {
    rows.iter()
        .filter(|r| r.strategy == strategy)
        .map(|r| (r.clients, value(r)))
        .collect()
}
