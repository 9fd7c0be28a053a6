//! A gRPC client for trying a service config against any live server, with no protobuf
//! definitions: the payload bytes are sent as the message as they are, through the crate's
//! [`RetryLayer`](tower_retry_hedge::RetryLayer) built from the config: one layer that
//! retries the methods with a retry policy and hedges those with a hedging policy.
//!
//! ```text
//! cargo run --features tonic --example grpc_probe -- \
//!     --target 127.0.0.1:50051 \
//!     --service-config '{"methodConfig": [{"name": [{"service": "helloworld.Greeter"}],
//!         "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                         "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}' \
//!     --method /helloworld.Greeter/SayHello --payload '' --calls 5 --concurrency 2
//! ```
//!
//! Each call prints one JSON line, in call order:
//!
//! ```text
//! {"call": 0, "code": 0, "status": "OK", "message": "", "attempts": 1, "elapsed_ms": 1.208}
//! ```
//!
//! `attempts` is the count the response carried (the `Attempts` extension, or the
//! `grpc-previous-rpc-attempts` metadata + 1, read from the status for an error); for an
//! error that carries none (a deadline the layer enforces), the attempts the layer handed
//! to the channel. An invalid service config exits with status 2 and names the JSON path
//! of the error on stderr. `--help` prints every option.
//!
//! The payload is sent without protobuf framing of its own, so a server that expects a
//! protobuf message gets whatever those bytes decode to: an empty payload is a valid empty
//! message for any method. `tests/interop` runs this code against a Python (C-core)
//! server.

mod probe;

use std::process::ExitCode;

use probe::{Probe, args_or_exit, channel, print_records};

#[tokio::main]
async fn main() -> ExitCode {
    let args = match args_or_exit("grpc_probe") {
        Ok(args) => args,
        Err(code) => return code,
    };
    let channel = match channel(&args.target) {
        Ok(channel) => channel,
        Err(error) => {
            eprintln!(
                "grpc_probe: cannot set up a channel to {}: {error}",
                args.target
            );
            return ExitCode::from(1);
        }
    };
    let probe = Probe::new(channel, &args.service_config, args.method, args.deadline);
    print_records(probe.run(&args.payload, args.calls, args.concurrency)).await
}
