//! `grpc_probe`'s twin over the official gRPC crate: the same command line, the same JSON
//! line per call, the calls sent through a `grpc` 0.9 channel with the crate's
//! [`RetryInterceptor`](tower_retry_hedge::grpc_channel::RetryInterceptor) built from the
//! service config, so the comparison held against gRPC C-core runs on it unchanged.
//!
//! ```text
//! cargo run --features grpc --example grpc_channel_probe -- \
//!     --target 127.0.0.1:50051 \
//!     --service-config '{"methodConfig": [{"name": [{"service": "helloworld.Greeter"}],
//!         "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                         "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}' \
//!     --method /helloworld.Greeter/SayHello --payload '' --calls 5 --concurrency 2
//! ```
//!
//! What `grpc` 0.9 changes (see the `grpc_channel` module docs): the target must be
//! plain-text HTTP/2 on a loopback address (its local credentials refuse other peers);
//! `maxRequestMessageBytes`/`maxResponseMessageBytes` are not applied (it has no such
//! limits); and a server's `grpc-retry-pushback-ms` never reaches the interceptor (its
//! transport drops the metadata of error trailers), so a call told to wait or to stop is
//! retried by its policy's backoff instead. `tests/interop` runs both probes against a
//! Python (C-core) server and compares their answers.

#[path = "../grpc_probe/probe.rs"]
mod probe;

mod channel;

use std::io::Write;
use std::process::ExitCode;

use futures_util::StreamExt;

use channel::{ChannelProbe, grpc_target};
use probe::{Args, ArgsError, USAGE};

#[tokio::main]
async fn main() -> ExitCode {
    let usage = USAGE.replace("grpc_probe", "grpc_channel_probe");
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(ArgsError::Help) => {
            println!("{usage}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("grpc_channel_probe: {error}");
            if matches!(error, ArgsError::Usage(_)) {
                eprintln!("{usage}");
            }
            return ExitCode::from(2);
        }
    };
    let Some(target) = grpc_target(&args.target) else {
        eprintln!(
            "grpc_channel_probe: cannot set up a channel to {}: only plain-text http:// targets",
            args.target
        );
        return ExitCode::from(1);
    };
    let probe = ChannelProbe::new(
        &target,
        &args.service_config,
        args.method.path().to_owned(),
        args.deadline,
    );

    let mut stdout = std::io::stdout().lock();
    let mut records = std::pin::pin!(probe.run(&args.payload, args.calls, args.concurrency));
    while let Some(record) = records.next().await {
        // Flushed line by line, so that a reader sees each call as it ends.
        if writeln!(stdout, "{}", record.to_json())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            // The reader went away (a closed pipe): nothing left to report to.
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
