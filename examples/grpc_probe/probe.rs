//! The probe's logic, apart from `main`, so that `tests/interop` runs exactly this code
//! (it includes this file with `#[path]`).
//!
//! * [`Args::parse`] reads the command line (no clap: a handful of flags).
//! * [`RawCodec`] is a pass-through [`Codec`]: the message is the payload bytes as they
//!   are, both ways, so no protobuf definitions are needed.
//! * [`Probe::new`] builds the stack `RetryLayer → CountAttempts → Channel` from a parsed
//!   service config (one layer drives every call by its method's policy: a retry policy is
//!   retried, a hedging policy hedged); [`Probe::call`] makes one call and returns a
//!   [`CallRecord`]; [`Probe::run`] makes them all, `concurrency` at a time, in call order.
// The interop test uses only part of this file.
#![allow(dead_code)]

use std::fmt;
use std::future::Future;
use std::io::Read;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use futures_util::stream::{self, Stream, StreamExt};
use http::uri::PathAndQuery;
use tokio::time::Instant;
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};
use tower::ServiceBuilder;
use tower_retry_hedge::classify::Code;
use tower_retry_hedge::config::{ConfigError, ServiceConfig};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{Retry, RetryLayer};

/// The most calls in flight at once that `--concurrency` accepts.
pub const MAX_CONCURRENCY: usize = 10_000;

/// The text `--payload` replaces with the call's index.
pub const CALL_PLACEHOLDER: &str = "{call}";

/// The usage text.
pub const USAGE: &str = "\
usage: grpc_probe --target HOST:PORT --service-config JSON|@FILE --method /pkg.Service/Method
                  [--payload STRING] [--calls N] [--concurrency N] [--deadline-ms N]

Sends N unary calls through the crate's retry layer (it retries or hedges each method as
its policy says), configured by a gRPC service config, and prints one JSON line per call,
in call order:
  {\"call\": 0, \"code\": 0, \"status\": \"OK\", \"message\": \"\", \"attempts\": 1, \"elapsed_ms\": 1.2}

  --target          the server, HOST:PORT (plain-text HTTP/2), or a full http:// URI
  --service-config  the service config JSON, or @FILE to read it from FILE
  --method          the gRPC method path, /package.Service/Method
  --payload         the request message's bytes, as UTF-8 text; {call} is replaced by the
                    call's index (default: empty)
  --calls           how many calls to make (default 1)
  --concurrency     how many calls may be in flight at once (default 1, at most 10000)
  --deadline-ms     each call's deadline in milliseconds, across all its attempts
                    (default: the method config's timeout, if any; the shorter wins)

Exit status: 0 when every call was made (whatever their status), 2 for a bad argument or
an invalid service config, 1 when the channel cannot be set up.";

/// The parsed command line.
#[derive(Debug, Clone)]
pub struct Args {
    /// The endpoint URI, `http://HOST:PORT`.
    pub target: String,
    /// The validated service config.
    pub service_config: ServiceConfig,
    /// The method path, `/package.Service/Method`.
    pub method: PathAndQuery,
    /// The payload template; [`CALL_PLACEHOLDER`] is replaced per call.
    pub payload: String,
    /// How many calls to make.
    pub calls: u32,
    /// How many calls may be in flight at once, 1 to [`MAX_CONCURRENCY`].
    pub concurrency: usize,
    /// The deadline given with `--deadline-ms`.
    pub deadline: Option<Duration>,
}

/// Why the command line was refused. Every variant means exit status 2.
#[derive(Debug)]
pub enum ArgsError {
    /// `--help` or `-h`: print the usage and exit successfully.
    Help,
    /// A flag is unknown, repeated, missing its value, or required and absent.
    Usage(String),
    /// A flag's value is malformed.
    Value {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        rule: &'static str,
    },
    /// `--service-config @FILE` could not be read.
    ConfigFile {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The service config is invalid; the error names the JSON path and the rule.
    Config(ConfigError),
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgsError::Help => f.write_str("help requested"),
            ArgsError::Usage(message) => f.write_str(message),
            ArgsError::Value { flag, value, rule } => {
                write!(f, "{flag}: must be {rule}, got {value:?}")
            }
            ArgsError::ConfigFile { path, error } => {
                write!(f, "--service-config: cannot read {path:?}: {error}")
            }
            ArgsError::Config(error) => write!(f, "invalid service config: {error}"),
        }
    }
}

impl std::error::Error for ArgsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ArgsError::ConfigFile { error, .. } => Some(error),
            ArgsError::Config(error) => Some(error),
            _ => None,
        }
    }
}

impl Args {
    /// Parses the arguments after the program name. Flags take their value as the next
    /// argument or after `=` (`--calls 3`, `--calls=3`).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, ArgsError> {
        let mut target = None;
        let mut service_config = None;
        let mut method = None;
        let mut payload = None;
        let mut calls = None;
        let mut concurrency = None;
        let mut deadline_ms = None;

        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Err(ArgsError::Help);
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value)),
                _ => (arg.clone(), None),
            };
            let slot = match flag.as_str() {
                "--target" => &mut target,
                "--service-config" => &mut service_config,
                "--method" => &mut method,
                "--payload" => &mut payload,
                "--calls" => &mut calls,
                "--concurrency" => &mut concurrency,
                "--deadline-ms" => &mut deadline_ms,
                _ => return Err(ArgsError::Usage(format!("unknown argument {arg:?}"))),
            };
            if slot.is_some() {
                return Err(ArgsError::Usage(format!("{flag} given twice")));
            }
            let value = match inline {
                Some(value) => value.to_owned(),
                None => args
                    .next()
                    .ok_or_else(|| ArgsError::Usage(format!("{flag} needs a value")))?,
            };
            *slot = Some(value);
        }

        let required = |value: Option<String>, flag: &str| {
            value.ok_or_else(|| ArgsError::Usage(format!("{flag} is required")))
        };
        let target = parse_target(&required(target, "--target")?)?;
        let method = parse_method(required(method, "--method")?)?;
        let service_config = load_config(&required(service_config, "--service-config")?)?;
        let calls = match calls {
            Some(value) => parse_number::<u32>("--calls", value, "an integer >= 0")?,
            None => 1,
        };
        let concurrency = match concurrency {
            Some(value) => {
                let rule = "an integer from 1 to 10000";
                match parse_number::<usize>("--concurrency", value.clone(), rule)? {
                    n @ 1..=MAX_CONCURRENCY => n,
                    _ => {
                        return Err(ArgsError::Value {
                            flag: "--concurrency",
                            value,
                            rule,
                        });
                    }
                }
            }
            None => 1,
        };
        let deadline = match deadline_ms {
            Some(value) => Some(Duration::from_millis(parse_number::<u64>(
                "--deadline-ms",
                value,
                "an integer number of milliseconds",
            )?)),
            None => None,
        };
        Ok(Args {
            target,
            service_config,
            method,
            payload: payload.unwrap_or_default(),
            calls,
            concurrency,
            deadline,
        })
    }
}

fn parse_number<T: FromStr>(
    flag: &'static str,
    value: String,
    rule: &'static str,
) -> Result<T, ArgsError> {
    value
        .parse()
        .map_err(|_| ArgsError::Value { flag, value, rule })
}

/// `HOST:PORT` becomes `http://HOST:PORT`; a URI with a scheme is kept.
fn parse_target(target: &str) -> Result<String, ArgsError> {
    let uri = if target.contains("://") {
        target.to_owned()
    } else {
        format!("http://{target}")
    };
    match uri.parse::<http::Uri>() {
        Ok(parsed) if parsed.host().is_some() => Ok(uri),
        _ => Err(ArgsError::Value {
            flag: "--target",
            value: target.to_owned(),
            rule: "HOST:PORT or an http:// URI",
        }),
    }
}

/// Accepts `/package.Service/Method` only: two non-empty segments, no query.
fn parse_method(method: String) -> Result<PathAndQuery, ArgsError> {
    let well_formed = method
        .strip_prefix('/')
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(service, name)| {
            !service.is_empty() && !name.is_empty() && !name.contains('/')
        });
    match PathAndQuery::from_str(&method) {
        Ok(path) if well_formed && path.query().is_none() => Ok(path),
        _ => Err(ArgsError::Value {
            flag: "--method",
            value: method,
            rule: "a gRPC method path such as /package.Service/Method",
        }),
    }
}

/// The service config from the JSON text, or from a file when the value starts with `@`.
fn load_config(value: &str) -> Result<ServiceConfig, ArgsError> {
    let json = match value.strip_prefix('@') {
        Some(path) => {
            let read = || -> std::io::Result<String> {
                // One byte more than a document may have (1 MiB), so that from_json still
                // sees (and refuses) an oversized file without reading all of it.
                let limit = 1024 * 1024 + 1;
                let mut text = String::new();
                std::fs::File::open(path)?
                    .take(limit)
                    .read_to_string(&mut text)?;
                Ok(text)
            };
            read().map_err(|error| ArgsError::ConfigFile {
                path: path.to_owned(),
                error,
            })?
        }
        None => value.to_owned(),
    };
    ServiceConfig::from_json(&json).map_err(ArgsError::Config)
}

/// The payload of call `call`: the template with every [`CALL_PLACEHOLDER`] replaced.
pub fn payload_for(template: &str, call: u32) -> Bytes {
    Bytes::from(template.replace(CALL_PLACEHOLDER, &call.to_string()))
}

// ---------------------------------------------------------------------------------
// The pass-through codec
// ---------------------------------------------------------------------------------

/// A codec whose messages are raw bytes: what is sent is the payload as given, what is
/// received is the response message as the server encoded it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

/// [`RawCodec`]'s encoder: copies the bytes into the frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawEncoder;

/// [`RawCodec`]'s decoder: takes the whole message.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        // tonic hands over exactly one message (its length prefix already read).
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

// ---------------------------------------------------------------------------------
// Counting attempts below the layer
// ---------------------------------------------------------------------------------

/// A request extension every attempt of a call shares: the layer copies the request's
/// extensions into each attempt.
#[derive(Debug, Clone, Default)]
pub struct AttemptCounter(Arc<AtomicU32>);

impl AttemptCounter {
    /// Attempts that reached the channel so far.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counts the attempts the layer hands to the channel, so that a call that ends in an
/// error the layer made itself (a deadline) still reports its attempts.
#[derive(Debug, Clone)]
pub struct CountAttempts<S>(S);

impl<S, B> tower::Service<http::Request<B>> for CountAttempts<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> S::Future {
        if let Some(counter) = request.extensions().get::<AttemptCounter>() {
            counter.0.fetch_add(1, Ordering::Relaxed);
        }
        self.0.call(request)
    }
}

// ---------------------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------------------

/// The service stack under the gRPC client.
pub type ProbeService = Retry<CountAttempts<Channel>>;

/// What one call did: one output line.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// The call's index, from 0.
    pub call: u32,
    /// The final status code.
    pub code: i32,
    /// The code's name (`OK`, `UNAVAILABLE`, ...).
    pub status: &'static str,
    /// The status message (empty on success).
    pub message: String,
    /// The attempt count the response carried: its `Attempts` extension, else its
    /// `grpc-previous-rpc-attempts` metadata + 1. `None` when it carried neither, as for a
    /// deadline the layer enforces (then [`CallRecord::attempts`] falls back on `sent`).
    pub reported_attempts: Option<u32>,
    /// Attempts the layer handed to the channel, counted below it.
    pub sent: u32,
    /// The response message (empty on error).
    pub response: Bytes,
    /// From just before the client waited for readiness to the final status.
    pub elapsed: Duration,
}

impl CallRecord {
    /// The attempts printed: the count the response reported, else the count seen below
    /// the layer.
    pub fn attempts(&self) -> u32 {
        self.reported_attempts.unwrap_or(self.sent)
    }

    /// The output line, without its newline, fields in a fixed order.
    pub fn to_json(&self) -> String {
        let message = serde_json::Value::String(self.message.clone());
        let elapsed_ms = self.elapsed.as_secs_f64() * 1000.0;
        format!(
            "{{\"call\": {}, \"code\": {}, \"status\": \"{}\", \"message\": {message}, \
             \"attempts\": {}, \"elapsed_ms\": {:.3}}}",
            self.call,
            self.code,
            self.status,
            self.attempts(),
            elapsed_ms,
        )
    }
}

/// The attempt count a response or status carried in `grpc-previous-rpc-attempts`.
fn attempts_from_metadata(metadata: &tonic::metadata::MetadataMap) -> Option<u32> {
    metadata
        .get("grpc-previous-rpc-attempts")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u32>().ok())
        .map(|previous| previous.saturating_add(1))
}

/// The name of status code `code` (`OK`, `UNAVAILABLE`, ...; `UNKNOWN` for a code gRPC does
/// not define).
pub fn status_name(code: i32) -> &'static str {
    Code::from_i32(code).map_or("UNKNOWN", Code::as_str)
}

/// A client for one method, configured by a service config.
#[derive(Debug, Clone)]
pub struct Probe {
    client: Grpc<ProbeService>,
    method: PathAndQuery,
    deadline: Option<Duration>,
}

impl Probe {
    /// The client for `method` over `channel`: the layer gets the config's policy table
    /// (and throttle), and the method config's `timeout` and message size limits apply
    /// as a gRPC client applies them. `deadline` (from `--deadline-ms`) and the config's
    /// `timeout` both bound each call; the shorter wins. A `timeout` of `0s` is read as no
    /// timeout, as C-core does.
    pub fn new(
        channel: Channel,
        config: &ServiceConfig,
        method: PathAndQuery,
        deadline: Option<Duration>,
    ) -> Probe {
        let policies = config.policies();
        let timeout = policies
            .lookup(&http::Method::POST, method.path())
            .and_then(|policy| policy.timeout())
            .filter(|t| !t.is_zero());
        let service = ServiceBuilder::new()
            .layer(RetryLayer::new(policies))
            .layer_fn(CountAttempts)
            .service(channel);
        let mut client = Grpc::new(service);
        let deadline = match (deadline, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(limit) = config.max_request_message_bytes(method.path()) {
            client = client.max_encoding_message_size(usize::try_from(limit).unwrap_or(usize::MAX));
        }
        if let Some(limit) = config.max_response_message_bytes(method.path()) {
            client = client.max_decoding_message_size(usize::try_from(limit).unwrap_or(usize::MAX));
        }
        Probe {
            client,
            method,
            deadline,
        }
    }

    /// The deadline each call gets, if any.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// Makes call number `call` with `payload` as its message.
    pub async fn call(&self, call: u32, payload: Bytes) -> CallRecord {
        let mut client = self.client.clone();
        let counter = AttemptCounter::default();
        let mut request = Request::new(payload);
        request.extensions_mut().insert(counter.clone());
        if let Some(deadline) = self.deadline {
            request.set_timeout(deadline);
        }
        let started = Instant::now();
        let result = match client.ready().await {
            Ok(()) => client.unary(request, self.method.clone(), RawCodec).await,
            Err(error) => Err(Status::from_error(error)),
        };
        let elapsed = started.elapsed();
        let sent = counter.get();
        match result {
            Ok(response) => CallRecord {
                call,
                code: 0,
                status: "OK",
                message: String::new(),
                reported_attempts: response
                    .extensions()
                    .get::<Attempts>()
                    .map(Attempts::sent)
                    .or_else(|| attempts_from_metadata(response.metadata())),
                sent,
                response: response.into_inner(),
                elapsed,
            },
            Err(status) => {
                let code = i32::from(status.code());
                CallRecord {
                    call,
                    code,
                    status: status_name(code),
                    message: status.message().to_owned(),
                    reported_attempts: attempts_from_metadata(status.metadata()),
                    sent,
                    response: Bytes::new(),
                    elapsed,
                }
            }
        }
    }

    /// Makes calls `0..calls`, at most `concurrency` at a time, and yields their records in
    /// call order (a record waits for the earlier calls' records).
    pub fn run(
        &self,
        payload: &str,
        calls: u32,
        concurrency: usize,
    ) -> impl Stream<Item = CallRecord> + '_ {
        in_call_order(payload, calls, concurrency, move |call, payload| {
            self.call(call, payload)
        })
    }
}

/// Makes calls `0..calls` with `call` (given each call's index and payload), at most
/// `concurrency` at a time, and yields their records in call order (a record waits for the
/// earlier calls' records).
pub fn in_call_order<'a, F, Fut>(
    payload: &str,
    calls: u32,
    concurrency: usize,
    call: F,
) -> impl Stream<Item = CallRecord> + 'a
where
    F: Fn(u32, Bytes) -> Fut + 'a,
    Fut: Future<Output = CallRecord> + 'a,
{
    let payload = payload.to_owned();
    stream::iter(0..calls)
        .map(move |index| call(index, payload_for(&payload, index)))
        .buffered(concurrency.clamp(1, MAX_CONCURRENCY))
}

/// The command line of `program`, or the exit code it ends with: `--help` prints the usage
/// (success); a bad argument or service config prints why (status 2).
pub fn args_or_exit(program: &str) -> Result<Args, std::process::ExitCode> {
    let usage = USAGE.replace("grpc_probe", program);
    match Args::parse(std::env::args().skip(1)) {
        Ok(args) => Ok(args),
        Err(ArgsError::Help) => {
            println!("{usage}");
            Err(std::process::ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("{program}: {error}");
            if matches!(error, ArgsError::Usage(_)) {
                eprintln!("{usage}");
            }
            Err(std::process::ExitCode::from(2))
        }
    }
}

/// Prints each record as its JSON line, flushed line by line so that a reader sees each call
/// as it ends; status 1 when the reader goes away (a closed pipe).
pub async fn print_records(records: impl Stream<Item = CallRecord>) -> std::process::ExitCode {
    use std::io::Write;

    let mut stdout = std::io::stdout().lock();
    let mut records = std::pin::pin!(records);
    while let Some(record) = records.next().await {
        if writeln!(stdout, "{}", record.to_json())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return std::process::ExitCode::from(1);
        }
    }
    std::process::ExitCode::SUCCESS
}

/// A channel to `target` (`http://HOST:PORT`) that connects on first use, as gRPC
/// channels do, so that connection failures show as call statuses.
pub fn channel(target: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(Endpoint::from_shared(target.to_owned())?
        .tcp_nodelay(true)
        .connect_lazy())
}
