//! Choosing a policy: retry or hedge, which throttle, which delay, which jitter.
//!
//! This page has no code of its own; it says which of the crate's pieces to reach for.
//! The figures quoted come from the simulations in `BENCHMARKS.md` (paused clock, seeded,
//! reproducible with the commands given there).
//!
//! # Retry or hedge?
//!
//! - **Retry** ([`RetryPolicy`](crate::RetryPolicy)) when failures are the problem: a replica
//!   restarts, a load balancer drains, a server sheds load with `UNAVAILABLE` or 503. A retry
//!   costs nothing while things go well.
//! - **Hedge** ([`HedgePolicy`](crate::HedgePolicy)) when the *tail latency* is the problem
//!   and the method is safe to run twice (reads, idempotent writes). A hedge sends a second
//!   copy when the first is slow, and pays for it with extra load: with the delay at the pN
//!   latency, about (100 − N) % extra requests.
//! - **Per-attempt timeout** ([`per_attempt_timeout`]) when an attempt can hang while the
//!   call's deadline is long: the slow attempt is cancelled and retried. With
//!   [`hedge_on_per_attempt_timeout`], the slow attempt keeps running and the first good answer
//!   wins: a hedge that only fires on a clear outlier.
//!
//! A method has one or the other, never both (gRFC A6).
//!
//! # Which throttle: the A6 bucket, a budget, or adaptive throttling?
//!
//! All three sit behind [`RetryThrottle`](crate::throttle::RetryThrottle) and are set with
//! [`PoliciesBuilder::throttle`](crate::policy::PoliciesBuilder::throttle), or one per host
//! with [`throttle_per_authority`](crate::policy::PoliciesBuilder::throttle_per_authority).
//!
//! ## The default: the A6 bucket with `tokenRatio` 1
//!
//! Unless you have a reason to choose otherwise, use
//!
//! ```
//! # use tower_retry_hedge::{Policies, Throttle};
//! let policies = Policies::builder()
//!     .throttle(Throttle::new(20, 1.0)?)
//!     // .method(..), .service(..), .route(..)
//!     .build();
//! # Ok::<(), tower_retry_hedge::error::BuildError>(())
//! ```
//!
//! or, in service config, `"retryThrottling": {"maxTokens": 20, "tokenRatio": 1}` (the same
//! JSON gives grpc-go and grpc-java clients the same throttle). A success earns the token a
//! failure costs, so retries flow while failures are fewer than successes, and stop once
//! there have been 10 failures more than successes, however much healthy traffic came
//! before. In the brown-out simulation of `BENCHMARKS.md` (200 calls/s, 4 attempts; 30 % of
//! attempts failing for 10 s, then all of them) it is the one configuration that wins both
//! phases: at 30 % failure the goodput of unlimited retries (197.3 calls/s, 1.00×), in the
//! outage 1.01× the offered load on the dead server. The retry storm measures 1.0007
//! attempts per call.
//!
//! | throttle | 30 % failing: goodput, × unlimited retries | all failing: load, × offered |
//! |---|---|---|
//! | [`Throttle::new(10, 0.1)`](crate::Throttle::new), gRFC A6's example | 0.72 | 1.00 |
//! | [`RetryBudget::new(10 s, 10, 0.2)`](crate::throttle::RetryBudget::new) | 0.89 | 1.25 |
//! | [`AdaptiveThrottle::default()`](crate::throttle::AdaptiveThrottle) (k 2, 10 s) | 1.00 | 2.09 |
//! | **[`Throttle::new(20, 1.0)`](crate::Throttle::new)** | **1.00** | **1.01** |
//!
//! ## The others
//!
//! - The **A6 bucket** ([`Throttle`](crate::Throttle)) watches the *failure rate*: each
//!   failure costs a token, each success earns `tokenRatio`, and retries stop while the
//!   bucket is at or below half. It tolerates failures up to `tokenRatio / (1 + tokenRatio)`
//!   of the answers: with gRFC A6's example `(10, 0.1)`, about 9 %, so a partial outage of
//!   30 % stops nearly every retry. In a total outage it lets through one attempt per call
//!   after the first few calls: the retry storm benchmark measures ≤ 1.01 attempts per call.
//! - A **budget** ([`RetryBudget`](crate::throttle::RetryBudget)) bounds the *extra load*:
//!   retries ≤ ratio × calls over a window, plus a floor per second. It never lets retries add
//!   more than the ratio, however the failures are spread, and keeps retrying at that rate
//!   through a partial outage and a total one alike. Choose it when capacity is planned by
//!   load (Finagle and Linkerd's default), or for HTTP clients with no service config.
//! - **Adaptive throttling** ([`AdaptiveThrottle`](crate::throttle::AdaptiveThrottle), the
//!   SRE book's, as google-cloud-gax ships it) rejects a retry with probability
//!   `max(0, (requests − k·accepts) / (requests + 1))` over a sliding window, where a fatal
//!   answer counts as accepted. Its rejection grows smoothly instead of switching at a
//!   threshold, which suits a server that sheds a growing share of its load. Its memory is
//!   its window: after healthy traffic, an outage is recognised only once its failures
//!   outweigh the accepts still in the window (2.09× the offered load on the dead server
//!   above, with 10 s), and with few answers in the window one failure rejects half the
//!   retries. Choose it for steady, high traffic.
//!
//! # A fixed or an adaptive hedging delay?
//!
//! - **Fixed** (A6's `hedgingDelay`): predictable, and right when the latency is stable and
//!   known. Set it near the p95–p99 of the method: lower sends more extra requests, higher
//!   cuts less of the tail.
//! - **Adaptive** ([`AdaptiveDelay`](crate::latency::AdaptiveDelay)): follows a percentile of
//!   recent successful attempts, clamped between a minimum and a maximum, with a fixed
//!   fallback until enough samples are in. Right when the latency moves (time of day, cache
//!   warmth, deployments) and a fixed delay would be too eager at one time and too late at
//!   another. The clamp keeps a latency collapse from turning every call into two.
//!
//! # Which jitter?
//!
//! Jitter spreads clients that failed together so they do not retry together.
//!
//! | jitter | formula (v = the capped exponential delay) | use it for |
//! |---|---|---|
//! | [`Jitter::Proportional(0.2)`](crate::backoff::Jitter) | `v · U(0.8, 1.2)` | gRPC's current behaviour; the default for service config |
//! | [`Jitter::Full`](crate::backoff::Jitter) | `U(0, v)` | many clients contending for one resource: the least total work |
//! | [`Jitter::Equal`](crate::backoff::Jitter) | `v/2 + U(0, v/2)` | a floor on the wait with some spread |
//! | [`Decorrelated`](crate::backoff::Decorrelated) | `min(cap, U(base, 3·prev))` | long-running reconnect loops; needs the previous delay |
//! | [`Table`](crate::backoff::Table) | `U(0.5·d, 1.5·d)` of a fixed table | hand-tuned schedules, reconnect loops (seed 002) |
//! | [`Jitter::None`](crate::backoff::Jitter) | `v` | tests, and single clients only |
//!
//! The contention simulation (`examples/jitter_simulation.rs`, after the AWS Architecture
//! Blog study) reproduces the study: without jitter, clients that collide keep colliding and
//! the work grows with the square of their number; full jitter does the least work; plain
//! exponential backoff is by far the slowest to finish. gRPC's ±20 % sits between: it
//! de-synchronises clients but keeps each wait near its nominal value.
//!
//! Which schedule, by use:
//!
//! - **gRPC retries**: [`Exponential::grpc`](crate::backoff::Exponential::grpc). gRFC A6 was
//!   revised in 2024 to match what grpc-go, grpc-java and grpc C-core do:
//!   `min(initial * multiplier^(n-1), max) * U(0.8, 1.2)`, i.e. `±20 %` after the cap. The
//!   2017 text of A6 said `U(0, min(initial * multiplier^(n-1), max))`;
//!   [`Exponential::grpc_full_jitter`](crate::backoff::Exponential::grpc_full_jitter) gives
//!   that.
//! - **Many clients contending for one resource**: full jitter
//!   ([`Jitter::Full`](crate::backoff::Jitter::Full)) or
//!   [`Decorrelated`](crate::backoff::Decorrelated) spread the load most (the AWS
//!   Architecture Blog's "Exponential Backoff And Jitter");
//!   [`Jitter::Equal`](crate::backoff::Jitter::Equal) trades some spread for a guaranteed
//!   minimum wait.
//! - **A reconnect loop**: [`Table::seed_default`](crate::backoff::Table::seed_default)
//!   (seed 002: up to 5 s `±50 %`) or [`Exponential::google`](crate::backoff::Exponential::google)
//!   (0.5 s, x1.5, `±50 %`, capped at 32 s).
//! - **A fixed pause**: [`Constant`](crate::backoff::Constant).
//!
//! # Backoff in your own loop: the loop owns the counter
//!
//! The [`backoff`](crate::backoff) schedules are plain data; the loop that retries keeps the
//! attempt counter. Seed 002 ("Simple backoff") makes the case. A backoff object that runs
//! your function and counts its failures takes the control flow away from you. With the
//! counter in your loop:
//!
//! - the loop looks like what it does: sleep, try, count a failure or reset to zero;
//! - it can wait in a `select!` next to other signals ("stop", "the server is back, retry
//!   from zero") and reset the counter mid-wait;
//! - it decides which errors are fatal and which are worth another attempt, without
//!   teaching the schedule about its errors;
//! - the counter is a plain integer whose zero means "first wait", and the schedule, which
//!   holds no state, is shared freely between tasks without a lock.
//!
//! # Server hints: pushback and `RetryInfo`
//!
//! gRPC servers ask for a delay with `grpc-retry-pushback-ms`, which every policy reads.
//! Google APIs send it as a `google.rpc.RetryInfo` inside `grpc-status-details-bin` instead;
//! with the `retry-info` feature, `GrpcCodes::with_retry_info()` reads that too. Either way
//! the next attempt waits exactly the server's delay, and a delay longer than
//! [`max_pushback`](crate::policy::PoliciesBuilder::max_pushback) (60 s by default) stops the
//! retries rather than parking the call.
//!
//! # Gateways (axum)
//!
//! A gateway that forwards its callers' requests gets them with a body that cannot be
//! replayed as it is (axum's `Body`, hyper's `Incoming`). Box it as an
//! `UnsyncBoxBody<Bytes, BoxError>` and give the client that body type: the layers replay it
//! from a record. In an axum handler, box the call's future as well
//! (`Box::pin(upstream.oneshot(request))` into a `BoxFuture`): awaiting it unboxed makes rustc
//! reject the route with "implementation of `Service` is not general enough". The README's
//! "Gateways (axum)" section has the whole handler; `tests/axum` runs it.
//!
//! # HTTP
//!
//! - Non-idempotent methods (`POST`, `PATCH`) are retried only when the request provably
//!   did not reach the application (never sent, `REFUSED_STREAM`, `425 Too Early`), unless the
//!   policy opts in ([`retry_non_idempotent`]) or the request carries an `Idempotency-Key` and
//!   the policy honours it ([`retry_with_idempotency_key`]).
//! - `Retry-After` and rate-limit reset headers
//!   ([`HttpStatuses::reset_headers`](crate::classify::HttpStatuses::reset_headers)) are
//!   pushback; a value above the cap falls back to the backoff, and
//!   [`retry_after_jitter`](crate::classify::HttpStatuses::retry_after_jitter) keeps the
//!   clients told the same instant from arriving together.
//!
//! [`per_attempt_timeout`]: crate::policy::RetryPolicyBuilder::per_attempt_timeout
//! [`hedge_on_per_attempt_timeout`]: crate::policy::RetryPolicyBuilder::hedge_on_per_attempt_timeout
//! [`retry_non_idempotent`]: crate::policy::RetryPolicyBuilder::retry_non_idempotent
//! [`retry_with_idempotency_key`]: crate::policy::RetryPolicyBuilder::retry_with_idempotency_key
