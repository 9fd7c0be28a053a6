//! Instructions per call on the echo of the overhead benchmark, for every variant, counted by
//! valgrind's callgrind: exact and repeatable, whatever else the machine is doing.
//!
//! Run without valgrind, the binary only makes the calls; the script beside it
//! (`benches/support/instructions.sh`) runs it under callgrind twice per variant and shape,
//! with `INSTRUCTIONS_CALLS` 1 000 and 11 000 (after the same warm-up), and divides the
//! difference of the totals by 10 000: what one call costs, with the start-up cancelled out.
//! Each call is built, made ready, called, polled to completion and dropped on a
//! current-thread runtime (`support::runtime`), as in the overhead benchmark.
//!
//! `INSTRUCTIONS_SHAPE=streaming` (variants `bare` and `ours_retry_policy` only) sends the
//! `grpc_4_headers` request with its body boxed as a stream, read to its end by the echo: the
//! tonic and hyper path, where the layer records the body for a replay instead of cloning it.
//!
//! ```text
//! bash benches/support/instructions.sh                       # every variant, every shape
//! INSTRUCTIONS_VARIANT=ours_retry_policy INSTRUCTIONS_SHAPE=no_headers \
//!     INSTRUCTIONS_CALLS=1000 valgrind --tool=callgrind target/release/deps/instructions-*
//! ```

mod support;

use std::hint::black_box;

use support::streaming::{DrainEcho, StreamRequest, stream_request};
use support::{Req, Res, Shape, Visit};
use tower::{Layer, Service};
use tower_retry_hedge::{Policies, RetryLayer};

const WARM_UP: usize = 1_000;

/// Makes the calls of one variant, if it is the one asked for.
struct Run {
    variant: String,
    shape: Shape,
    calls: usize,
    ran: bool,
}

impl Visit for Run {
    fn visit<S>(&mut self, name: &'static str, mut service: S)
    where
        S: Service<Req, Response = Res>,
        S::Error: std::fmt::Debug,
    {
        if name != self.variant {
            return;
        }
        calls(&mut service, || support::request(self.shape), self.calls);
        self.ran = true;
    }
}

/// `WARM_UP + n` calls of `service`, each on a request from `make`.
fn calls<Rq, S>(service: &mut S, make: impl Fn() -> Rq, n: usize)
where
    S: Service<Rq, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let runtime = support::runtime();
    for _ in 0..WARM_UP + n {
        // Not `support::call`: its awaits cost about 200 instructions per call more, the same
        // for every variant, which would only blur the differences.
        let response = runtime.block_on(async {
            let ready = tower::ServiceExt::<Rq>::ready(&mut *service).await;
            ready.expect("always ready").call(make()).await
        });
        drop(black_box(response.expect("never fails")));
    }
}

/// The streaming shape: the drain echo bare, or under the retry layer with a policy.
fn streaming(variant: &str, n: usize) {
    match variant {
        "bare" => calls::<StreamRequest, _>(&mut DrainEcho, stream_request, n),
        "ours_retry_policy" => {
            let policies = Policies::builder()
                .method(support::METHOD, support::our_retry_policy())
                .build();
            let mut ours = RetryLayer::new(policies).layer(DrainEcho);
            calls(&mut ours, stream_request, n);
        }
        _ => panic!("INSTRUCTIONS_VARIANT: {variant:?} has no streaming shape"),
    }
}

fn main() {
    let var = |name: &str| std::env::var(name).ok();
    // `cargo bench` runs every bench binary: without a variant named, this one does nothing.
    let Some(variant) = var("INSTRUCTIONS_VARIANT") else {
        println!("instructions: set INSTRUCTIONS_VARIANT (see benches/support/instructions.sh)");
        return;
    };
    let shape_name = var("INSTRUCTIONS_SHAPE").unwrap_or_else(|| "no_headers".into());
    let calls = var("INSTRUCTIONS_CALLS")
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(1_000);
    if shape_name == "streaming" {
        streaming(&variant, calls);
        return;
    }
    let shape = Shape::ALL
        .into_iter()
        .find(|shape| shape.name() == shape_name)
        .unwrap_or_else(|| panic!("INSTRUCTIONS_SHAPE: no shape {shape_name:?}"));
    let mut run = Run {
        variant,
        shape,
        calls,
        ran: false,
    };
    support::each_variant(&mut run);
    assert!(
        run.ran,
        "INSTRUCTIONS_VARIANT: no variant {:?}",
        run.variant
    );
}
