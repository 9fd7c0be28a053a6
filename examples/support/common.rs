//! What the behaviour benchmarks share: a paused-clock runtime, gRPC requests and
//! Trailers-Only responses, a seeded backoff, argument parsing and plain tables.
//!
//! Included by each benchmark with `#[path = "support/common.rs"] mod common;`; each uses a
//! part of it.
#![allow(dead_code)]

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use rand::RngCore;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tower_retry_hedge::backoff::{Backoff, Step};

/// The gRPC service every simulated call goes to.
pub const SERVICE: &str = "sim.Echo";
/// The path of its one method.
pub const PATH: &str = "/sim.Echo/Call";

/// The request body of every call.
pub type Body = Full<Bytes>;
/// The request every peer sends.
pub type Req = Request<Body>;
/// The response every downstream gives: the status is in the headers (Trailers-Only).
pub type Res = Response<http_body_util::Empty<Bytes>>;

/// A current-thread runtime on tokio's paused clock: time jumps to the next timer as soon as
/// every task is idle, so hours of simulated time take milliseconds.
pub fn paused_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
}

/// A unary gRPC request to [`PATH`].
pub fn grpc_request() -> Req {
    let mut request = Request::new(Full::new(Bytes::from_static(b"\0\0\0\0\x05hello")));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static(PATH);
    request.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    request
}

/// A Trailers-Only gRPC response with status `code` (`0` is OK, `14` UNAVAILABLE).
pub fn trailers_only(code: u8) -> Res {
    let mut response = Response::new(http_body_util::Empty::new());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    response
}

/// The gRPC status of a Trailers-Only response, if it has one.
pub fn grpc_status(response: &Res) -> Option<u8> {
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Whether a response is a gRPC OK.
pub fn is_ok(response: &Res) -> bool {
    grpc_status(response) == Some(0)
}

/// Whether a response is UNAVAILABLE, the code every peer retries.
pub fn is_unavailable(response: &Res) -> bool {
    grpc_status(response) == Some(14)
}

/// A backoff schedule that draws its jitter from one seeded generator, so that a run is
/// repeatable. (The layers sample backoffs with the thread-local generator; a [`Backoff`]
/// implementation may ignore the generator it is handed.)
#[derive(Clone)]
pub struct Seeded<B> {
    schedule: B,
    rng: Arc<Mutex<SmallRng>>,
}

impl<B> Seeded<B> {
    /// `schedule`, jittered from a generator seeded with `seed`.
    pub fn new(schedule: B, seed: u64) -> Self {
        Seeded {
            schedule,
            rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for Seeded<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Seeded").field(&self.schedule).finish()
    }
}

impl<B: Backoff> Backoff for Seeded<B> {
    fn sample(&self, step: Step, _rng: &mut dyn RngCore) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        self.schedule.sample(step, &mut *rng)
    }
}

/// A minimal `--name value` / `--flag` parser.
pub struct Cli {
    program: &'static str,
    usage: &'static str,
    args: Vec<String>,
}

impl Cli {
    /// The process arguments; prints `usage` and exits on `--help`.
    pub fn new(program: &'static str, usage: &'static str) -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.iter().any(|a| a == "-h" || a == "--help") {
            eprintln!("usage: {program} {usage}");
            std::process::exit(0);
        }
        Cli {
            program,
            usage,
            args,
        }
    }

    /// The value after `--name`, or `default`.
    pub fn value<T: FromStr>(&mut self, name: &str, default: T) -> T
    where
        T::Err: fmt::Display,
    {
        let Some(i) = self.args.iter().position(|a| a == name) else {
            return default;
        };
        self.args.remove(i);
        if i >= self.args.len() {
            self.fail(&format!("{name} needs a value"));
        }
        let raw = self.args.remove(i);
        match raw.parse() {
            Ok(v) => v,
            Err(e) => self.fail(&format!("{name} {raw:?}: {e}")),
        }
    }

    /// Whether `--name` was given.
    pub fn flag(&mut self, name: &str) -> bool {
        match self.args.iter().position(|a| a == name) {
            Some(i) => {
                self.args.remove(i);
                true
            }
            None => false,
        }
    }

    /// Rejects any argument not taken.
    pub fn finish(self) {
        if let Some(extra) = self.args.first() {
            self.fail(&format!("unknown argument {extra:?}"));
        }
    }

    /// Prints `message` and the usage, and exits with status 2.
    pub fn fail(&self, message: &str) -> ! {
        eprintln!(
            "{}: {message}\nusage: {} {}",
            self.program, self.program, self.usage
        );
        std::process::exit(2);
    }
}

/// Prints a plain table on stdout: see [`render_table`].
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    print!("{}", render_table(header, rows));
}

/// A plain table, columns padded to their widest cell, numbers right-aligned.
pub fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| {
                let numeric = cell.trim_end_matches(['%', 'x']).parse::<f64>().is_ok();
                if i > 0 && numeric {
                    format!("{cell:>w$}")
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    out.push_str(&rule.join("  "));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// The value at quantile `q` of sorted `values` (nearest rank).
pub fn quantile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len()) - 1)
        .copied()
        .unwrap_or_default()
}
