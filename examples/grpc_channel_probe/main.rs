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

use std::process::ExitCode;

use channel::{ChannelProbe, grpc_target};
use probe::{args_or_exit, print_records};

#[tokio::main]
async fn main() -> ExitCode {
    let args = match args_or_exit("grpc_channel_probe") {
        Ok(args) => args,
        Err(code) => return code,
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
    print_records(probe.run(&args.payload, args.calls, args.concurrency)).await
}
