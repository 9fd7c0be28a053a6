//! The guide: how to choose (retry or hedge, which throttle, which hedging delay, which
//! jitter), and how the crate works, from a retried call to the balancer and telemetry.
//!
//! This module holds no items of its own. Its first sections say which of the crate's pieces
//! to reach for; the figures quoted come from the simulations in `BENCHMARKS.md` (paused
//! clock, seeded, reproducible with the commands given there).
//!
//! The sections from [How a retried call runs](#how-a-retried-call-runs) on hold the background
//! of the modules' docs: how the pieces work and why they were built so (a call's life,
//! `poll_ready` and cloned services, replay bodies, service config, load balancing,
//! telemetry), with longer examples.
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
//! # How a retried call runs
//!
//! [`Retry`](crate::Retry) (also named [`Hedge`](crate::Hedge)) hands each call to the crate's
//! one call engine, which applies every rule of gRFC A6. For a method with a
//! [`RetryPolicy`](crate::RetryPolicy):
//!
//! 1. The deadline is the earliest of the request's `grpc-timeout` (gRPC), the policy's timeout
//!    and a [`Deadline`](crate::metadata::Deadline) extension. It spans every attempt and every
//!    wait; each gRPC attempt carries the *remaining* time in `grpc-timeout`. When it passes,
//!    the call ends: a gRPC call with the `tonic` feature returns `Status::deadline_exceeded`,
//!    other calls [`DeadlineExceeded`](crate::error::DeadlineExceeded). (A call whose last
//!    attempt outlived a per-attempt timeout ends `CANCELLED` for gRPC, as in C-core, and
//!    [`AttemptTimedOut`](crate::error::AttemptTimedOut) for HTTP.)
//! 2. The body is made replayable within the [`BufferLimits`](crate::body::BufferLimits);
//!    one that cannot be (its size is known to be over the limit) is sent once, untouched,
//!    and its call is never retried.
//! 3. Attempt 1 is sent; attempt N+1 carries `grpc-previous-rpc-attempts: N` (transparent
//!    retries are not counted).
//! 4. The outcome is classified ([`classify`](crate::classify)). A success is returned and
//!    credits the throttle. A response with ordinary headers (not Trailers-Only) commits the
//!    call and is returned as it is.
//! 5. A retryable failure debits the throttle; the call is retried only if attempts remain
//!    (`maxAttempts`, clamped to the client cap), the body can still be replayed, the throttle
//!    is above half, no pushback said stop, and the next attempt can start before the
//!    deadline.
//! 6. The wait is the server's pushback exactly when it gave one (and the backoff then
//!    restarts from its first step), else the backoff schedule's next delay. When the wait
//!    would reach the deadline, the call returns the last failure at once rather than
//!    sleeping into a certain `DEADLINE_EXCEEDED`.
//! 7. The last attempt's outcome is returned. After more than one attempt it carries an
//!    [`Attempts`](crate::metadata::Attempts) extension and, for gRPC, the
//!    `grpc-previous-rpc-attempts` of the retry attempts made; after one, neither (read it
//!    with [`Attempts::of`](crate::metadata::Attempts::of)), so the success path allocates
//!    nothing for it.
//!
//! An attempt that could not be sent because no connection could be made is, as in gRPC, an
//! `UNAVAILABLE` (HTTP: 503) failure for the policy: counted, backed off and throttled like any
//! other, and retried whatever the HTTP method, since it never reached the server; a call
//! without a policy fails at once. With gRPC's wait-for-ready
//! ([`wait_for_ready`](crate::policy::RetryPolicyBuilder::wait_for_ready), or
//! `"waitForReady": true` in service config) it is resent transparently, with backoff, until
//! the deadline (or
//! [`max_transparent_retries`](crate::policy::RetryPolicyBuilder::max_transparent_retries)
//! times without one). A stream refused before the server's application saw it is resent once
//! at once, then judged by the policy. Transparent resends count toward neither `maxAttempts`
//! nor the throttle.
//!
//! # `poll_ready` and cloned services
//!
//! The first attempt goes to the service that
//! [`poll_ready`](tower_service::Service::poll_ready) made ready, which stays in `self` for the
//! next call. At its first call the layer also keeps a spare clone of the service, shared by
//! its calls; a call that retries clones the spare for its later attempts, and a call that does
//! not clones nothing (a clone per call would cost a tonic `Channel` an allocation and a
//! `poll_ready` from cold). The exception is a policy that hedges on its per-attempt timeout,
//! whose calls take their clone at the start. Before each later attempt the future polls its
//! clone ready, so a buffer or a concurrency limit below sees every attempt as a request of its
//! own and no capacity is taken while the future waits out a backoff.
//!
//! Each clone of a [`Retry`](crate::Retry) keeps its own spare, and its own references to the
//! table's policies and throttle, made at its first call: calls through clones on different
//! cores write nothing they share while they succeed (the throttle's bucket, budgets and
//! latency windows stay one, shared by every clone). Clone the stack per task or per core, not
//! per call: a clone's first call pays for making them.
//!
//! # Replay bodies: errors from the source
//!
//! The error of a [`ReplayBody`](crate::body::ReplayBody)'s source is not `Clone`, and the
//! retry layers need the original to classify it, so only the reader that hit the error
//! receives it. The call is then committed to that reader (no attempt can send the whole body
//! any more), the record is freed, and every other reader fails with a
//! [`NotReplayable`](crate::body::NotReplayable) that carries the source error's message
//! ([`NotReplayable::is_source_failure`](crate::body::NotReplayable::is_source_failure)).
//!
//! # Service config
//!
//! What the [`config`](crate::config) module's docs leave out: a second example, what becomes
//! of keys gRPC does not define, the decisions taken where gRFC A6 leaves room, and the limits
//! on untrusted input.
//!
//! ## A hedging policy, a default, and errors
//!
//! A hedging policy for a whole service, a default for everything else, and errors, from
//! [`ServiceConfig`](crate::config::ServiceConfig):
//!
//! ```
//! use std::time::Duration;
//! use http::Method;
//! use tower_retry_hedge::config::{Rule, ServiceConfig};
//! use tower_retry_hedge::MethodPolicy;
//!
//! let json = r#"{
//!   "methodConfig": [
//!     { "name": [{ "service": "pkg.Search" }],
//!       "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.05s",
//!                          "nonFatalStatusCodes": ["unavailable", 8] } },
//!     { "name": [{}], "timeout": "2.5s", "waitForReady": true }
//!   ]
//! }"#;
//! let config: ServiceConfig = json.parse()?;
//! let policies = config.policies();
//!
//! match policies.lookup(&Method::POST, "/pkg.Search/Query") {
//!     Some(MethodPolicy::Hedge(hedge)) => {
//!         assert_eq!(hedge.max_attempts(), 3);
//!         assert_eq!(hedge.delay().current(), Duration::from_millis(50));
//!     }
//!     other => panic!("expected hedging, got {other:?}"),
//! }
//!
//! // The default has no retry or hedging policy: a deadline, and wait-for-ready.
//! let other = policies.lookup(&Method::POST, "/pkg.Users/Get").expect("the default");
//! assert!(matches!(other, MethodPolicy::WaitForReady(_)));
//! assert_eq!(other.timeout(), Some(Duration::from_millis(2500)));
//!
//! let err = ServiceConfig::from_json(
//!     r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1}}]}"#,
//! )
//! .unwrap_err();
//! assert_eq!(err.path(), "methodConfig[0].retryPolicy.maxAttempts");
//! assert_eq!(err.rule(), &Rule::MaxAttempts);
//! assert_eq!(
//!     err.to_string(),
//!     "methodConfig[0].retryPolicy.maxAttempts: must be an integer >= 2, got 1"
//! );
//! # Ok::<(), tower_retry_hedge::config::ConfigError>(())
//! ```
//!
//! ## Unknown keys
//!
//! gRPC ignores keys it does not define, so a misspelt field is silent there: with
//! `"hedgeDelay"` for `"hedgingDelay"` every hedge goes at once, and `"retryThrotling"` means
//! no throttle at all. The [`config`](crate::config) module ignores them too, so that the same
//! JSON behaves as it does in grpc-go, but says so:
//!
//! * [`ServiceConfig::from_json`](crate::config::ServiceConfig::from_json) logs them in one
//!   `WARN` event (message `service config: unknown fields ignored`, fields `count` and `keys`,
//!   which names the first 10), and
//!   [`ServiceConfig::ignored`](crate::config::ServiceConfig::ignored) lists them as
//!   [`IgnoredKey`](crate::config::IgnoredKey)s: the JSON path
//!   (`methodConfig[0].hedgingPolicy.hedgeDelay`), the key, and, for a near miss, the field it
//!   likely stands for (an edit distance, ignoring case, of at most a third of the key's
//!   length: `hedgingDelay`; `maxAttempts` for `MaxAttempts` or `max_attempts`).
//! * [`ServiceConfig::from_json_strict`](crate::config::ServiceConfig::from_json_strict)
//!   refuses them, with [`Rule::UnknownField`](crate::config::Rule::UnknownField) and the same
//!   path and suggestion.
//! * A required field that is absent names the near miss that stands in its place:
//!   `methodConfig[0].retryPolicy.maxAttempts: is required (found "maxAttempt": did you
//!   mean maxAttempts?)`.
//!
//! A key is unknown only if gRPC's service config does not define it in that place: every
//! field of `grpc/service_config/service_config.proto` is known, whether or not this crate
//! uses it (`loadBalancingPolicy`, `loadBalancingConfig`, `healthCheckConfig.serviceName`,
//! `connectionScaling.maxConnectionsPerSubchannel`, `waitForReady`, `timeout`,
//! `maxRequestMessageBytes`, `maxResponseMessageBytes`, `name[].service` and
//! `name[].method`), as is `retryPolicy.perAttemptRecvTimeout`, which grpc-java and C-core
//! read, and this crate applies as C-core does. The contents of `loadBalancingConfig` belong
//! to each load balancer and are not looked into.
//!
//! ```
//! use tower_retry_hedge::config::ServiceConfig;
//!
//! let json = r#"{"methodConfig": [{
//!     "name": [{"service": "pkg.Search"}],
//!     "hedgingPolicy": {"maxAttempts": 3, "hedgeDelay": "0.05s"}
//! }]}"#;
//! let config = ServiceConfig::from_json(json)?; // and a WARN event
//! assert_eq!(
//!     config.ignored()[0].to_string(),
//!     "methodConfig[0].hedgingPolicy.hedgeDelay (did you mean hedgingDelay?)"
//! );
//! assert!(ServiceConfig::from_json_strict(json).is_err());
//! # Ok::<(), tower_retry_hedge::config::ConfigError>(())
//! ```
//!
//! ## Decisions where A6 leaves room
//!
//! * **Integers written as floats.** `maxAttempts`, `maxTokens`, status codes and
//!   message sizes are JSON numbers with an integral value: `2`, `2.0` and `2e0` are all
//!   accepted, `2.5` is rejected. JSON has no separate integer type, and the protobuf
//!   JSON parser and grpc-java accept `2.0` too (grpc-go and C-core reject it).
//!   Numbers are never accepted as strings (`"2"`), as A6 asks for JSON numbers.
//! * **Huge `maxAttempts`.** Any integer >= 2 is kept as given, saturated to
//!   `u32::MAX`; the clamp to the client's cap (default 5) belongs to the layer, as A6
//!   says values above the cap are "treated as" the cap, not rejected.
//! * **`maxBackoff < initialBackoff`** is accepted: A6 does not forbid it, and the delay
//!   `min(initialBackoff * multiplier^(n-1), maxBackoff)` is then always `maxBackoff`.
//! * **`timeout: "0s"`** is valid and kept as `Some(Duration::ZERO)`: proto3 allows it
//!   and A6 sets no lower bound. grpc-go and grpc-java apply it as a deadline that has
//!   already expired; C-core reads 0 as "no timeout". The model keeps the value; the
//!   layer decides.
//! * **Durations** follow the proto3 JSON form exactly: an optional `-`, whole seconds,
//!   optionally `.` and 1 to 9 digits, and `s`; no `+`, exponent, whitespace or leading
//!   zeros, and at most 315 576 000 000 seconds (protobuf's 10 000 years).
//!   `".5s"` and `"1.s"` are rejected. A6 says the numeric part "must be a valid JSON
//!   number", which neither is, and the protobuf reference parser
//!   (`json/internal/parser.cc`) rejects both too ("duration must start with an
//!   integer", and a `.` must be followed by a digit). grpc-go accepts both and C-core
//!   accepts `".5s"`.
//! * **`tokenRatio`** is truncated on the shortest decimal form of the `f64` serde_json
//!   reads (correctly rounded: the crate enables serde_json's `float_roundtrip`), so the
//!   truncation is exact for any number written with up to 15 significant digits; only
//!   longer ones such as `0.29999999999999999999` may read as the nearest float (0.3)
//!   first. C-core truncates the text itself.
//! * **`maxTokens: 10.5`** is rejected: A6's validation rules ask for an integer (and
//!   C-core rejects it), although the comment in A6's schema speaks of "up to 3 decimal
//!   places" for both throttling fields.
//! * **Errors**: the first violation in document order is reported.
//!
//! ## Limits on untrusted input
//!
//! A service config may come from DNS, so parsing never panics and its memory is
//! bounded: a document longer than 1 MiB is refused before parsing,
//! serde_json's recursion limit (128 levels) refuses deeper nesting, and
//! at most 10 000 method configs, 10 000 names in all and 100 status codes per list.
//! Values quoted in error messages are cut to 64 characters. Unknown keys cost a few
//! string comparisons each; at most 100 are kept (the rest are counted),
//! each cut to 64 characters, and only kept keys (or, for a missing field,
//! at most 100 keys of its object) are searched for a near miss.
//!
//! The document is read into a `serde_json::Value` first, which costs more than the text:
//! measured at up to 34 times the document's length at the peak for the worst shapes
//! (`[[{}],[{}],...]`; 24 times for `[0,0,...]`), so about 34 MiB for a 1 MiB document,
//! released when parsing ends. Callers with a tighter budget can refuse longer documents before
//! calling [`ServiceConfig::from_json`](crate::config::ServiceConfig::from_json); real service
//! configs are a few kilobytes.
//!
//! # Load balancing
//!
//! ## Why a call's attempts avoid the backends it tried
//!
//! A retry that lands on the backend that just failed, or a hedge sent to the backend the first
//! attempt is stuck on, buys nothing. tower's `p2c::Balance` and tonic's
//! `Channel::balance_list` pick each attempt afresh: over 3 backends with one dead, 3 attempts
//! of a call all land on the dead one once in 27 calls. [`Balance`](crate::balance::Balance)
//! reads the call's [`TriedBackends`](crate::metadata::TriedBackends) record and draws only
//! among the endpoints the call has not tried (Envoy's `previous_hosts` retry predicate;
//! grpc-java passes each attempt through its picker again).
//!
//! The record saves the calls whose first attempt reached a dead backend, but not what they
//! cost: the first attempt is spent, and the retry throttle is debited. A backend that fails
//! fast holds the fewest requests in flight, so power of two choices on load even favours it (a
//! third to over 40 % of the first attempts over three backends), and under gRFC A6's throttle
//! `{10, 0.1}` the bucket drains and calls fail. So the balancer also learns from each answer,
//! and ejects outliers (see [Outlier detection in the
//! balancer](#outlier-detection-in-the-balancer)).
//!
//! ## How the balancer picks
//!
//! [`Balance`](crate::balance::Balance) is a tower [`Service`](tower_service::Service) over a
//! [`tower::discover::Discover`] of endpoint services that measure their
//! [`Load`](tower::load::Load) (wrap them in [`tower::load::PendingRequests`] or
//! [`tower::load::PeakEwma`]). Endpoints are driven to readiness by tower's
//! [`ReadyCache`](tower::ready_cache::ReadyCache), as in tower's own balancer. For each
//! request:
//!
//! 1. Without a [`TriedBackends`](crate::metadata::TriedBackends) extension: power of two
//!    choices on load among the ready endpoints in rotation (two drawn at random, the less
//!    loaded one takes the request), as tower's `p2c::Balance` does, with recent failures
//!    weighed in (below).
//! 2. With one: the same, drawn only among the endpoints in rotation whose
//!    [`BackendId`](crate::metadata::BackendId) the record does not hold; when every one was
//!    tried, among all of them. Then the id of the endpoint picked is added to the record,
//!    which every attempt of the call shares, so the next attempt avoids it.
//! 3. A hedge ([`AttemptInfo::hedge`](crate::metadata::AttemptInfo::hedge)) whose call tried
//!    every endpoint in rotation goes to an ejected one it has not tried, if one is ready: the
//!    tried ones hold the call's attempts in flight, where a second attempt buys nothing. A
//!    retry follows failures, and the backends in rotation it tried are still better bets than
//!    one ejected for failing.
//!
//! *In rotation* means not ejected by the outlier detection; when every ready endpoint is
//! ejected (which the detection never does to every known one, but some may not be ready),
//! all ready endpoints are in rotation rather than none.
//!
//! An endpoint's id is [`BackendId::of`](crate::metadata::BackendId::of) its discovery key (for
//! [`BalancedChannel`](crate::balance::BalancedChannel), the endpoint's URI, or the key of its
//! [`Change`](tonic::transport::channel::Change)).
//!
//! The choice is among *ready* endpoints: an untried endpoint that is not ready (its
//! connection is being set up, or its buffer is full) is passed over in favour of a tried one
//! that is, rather than holding the attempt back. tonic channels are ready at once: the
//! balancer polls its endpoints outside tokio's task budget, which would otherwise hold one
//! back after it took a request, under load for many picks.
//!
//! A request without the record costs the balancer one extension lookup, and is balanced as
//! tower balances.
//!
//! ## Outlier detection in the balancer
//!
//! The balancer learns each backend's outcomes, classified as the layers classify attempts:
//!
//! - the `grpc-status` of a Trailers-Only response (status in the headers), or, for a gRPC
//!   response that has begun, the `grpc-status` of its trailers, read as the body passes
//!   through a [`ResponseBody`](crate::balance::ResponseBody) (a body dropped before its end
//!   counts for nothing);
//! - without a gRPC status, HTTP 5xx and 429 fail and anything else succeeds;
//! - an error of the endpoint's service (a transport error) fails.
//!
//! A gRPC status fails when it is in
//! [`failure_codes`](crate::balance::OutlierDetectionBuilder::failure_codes) (by default the
//! codes whose HTTP mapping is a 5xx or 429, as Envoy counts gRPC answers; gRFC A50 counts
//! every code but `OK`). Then:
//!
//! - **Recent failures weigh the choice.** Of the two endpoints drawn, the less loaded one
//!   keeps the request with probability `w / w'` when its weight `w` is below the other's `w'`,
//!   and leaves it to the other otherwise. A backend's weight is the lower of
//!   `((s + 1) / (f + s + 1))²`, of its recent successes `s` and failures `f`, and
//!   `1 / (1 + r)²`, of its run `r` of failures since its last success (up to 9); all fade by
//!   half every
//!   [`failure_half_life`](crate::balance::OutlierDetectionBuilder::failure_half_life) (2 s).
//!   One failure costs a backend three quarters of the draws it would win on load, five in a
//!   row 35 in 36: a backend that fails fast no longer looks least loaded, before any ejection.
//!   The weight multiplies a probability rather than the load, so it works with any
//!   [`Load`](tower::load::Load) metric (`PeakEwma`'s as `PendingRequests`'), and with every
//!   weight at 1 the pick is tower's, draw for draw.
//! - **A run of failures ejects at once** (Envoy's `consecutive_5xx`):
//!   [`consecutive_failures`](crate::balance::OutlierDetectionBuilder::consecutive_failures)
//!   (5) answers in a row, if another backend in rotation does well (its recent successes
//!   outnumber its failures: a run of failures everywhere is no outlier).
//! - **gRFC A50's algorithms run each
//!   [`interval`](crate::balance::OutlierDetectionBuilder::interval)** (1 s) over the answers
//!   of the interval that ended: failure percentage (a backend with at least `request_volume`
//!   answers, more than `threshold` % failed) and success rate (a backend whose success rate is
//!   below `mean − stdev × stdev_factor / 1000`), each ejecting with probability
//!   `enforcement_percentage` %.
//! - **An ejection lasts** `base_ejection_time × times ejected`, at most
//!   `max(base_ejection_time, max_ejection_time)` (30 s and 300 s); "times ejected" drops by
//!   one each interval the backend stays in rotation, as in A50.
//! - **At most
//!   [`max_ejection_percent`](crate::balance::OutlierDetectionBuilder::max_ejection_percent) %
//!   of the known backends are out at once** (10 %), but one may always be (as Envoy allows, so
//!   that one dead backend of three is ejected), and never all of them: with every backend
//!   failing, calls fail as they would without the balancer.
//! - **A backend comes back** at the balancer's first call after its ejection time (A50 waits
//!   for the next interval), on probation: weighed as after one failure, a quarter of its
//!   draws, until it answers well and earns its full share back.
//!
//! The detection runs on tokio's clock, inside `poll_ready`: there is no timer task, and a
//! paused clock drives it as it drives the rest.
//!
//! Why these defaults: A50's interval (10 s) and minimum hosts (5) never eject one backend of
//! three, and a balancer that waits for an interval sends attempts to a dead backend for
//! seconds; under the A6 throttle `{10, 0.1}` the bucket is spent after five failures. The run
//! of five failures ejects a dead backend within the first few calls it takes (over loopback,
//! the first burst of concurrent calls), the weights keep it from taking more meanwhile, and
//! the 1 s interval with a failure percentage over three hosts and 10 answers ejects a backend
//! that fails most calls but not every one in a row. The ejection times and the 10 % share are
//! A50's. [`OutlierDetection::from_json`](crate::balance::OutlierDetection::from_json) reads
//! gRPC's `outlier_detection_experimental` config, with A50's defaults for what it leaves out.
//!
//! It shows: each ejection is a `tracing` event at `WARN` (`balance: backend ejected`, with the
//! backend's key, its id, the reason, its failure rate, the ejection time and how many times in
//! a row), each return one at `INFO`; [`Balance::outliers`](crate::balance::Balance::outliers)
//! and [`BalancedChannel::outliers`](crate::balance::BalancedChannel::outliers) give an
//! [`Outliers`](crate::balance::Outliers) view of who is out and how many ejections there were;
//! with the `opentelemetry` feature, [`OutlierMetrics`](crate::balance::OutlierMetrics) counts
//! ejections, and outliers left in rotation, on gRFC A91's two counters.
//!
//! ## How the balancer composes
//!
//! - **tonic's balancer**: [`BalancedChannel`](crate::balance::BalancedChannel) replaces it, it
//!   does not stack on it. Each endpoint is a plain tonic `Channel` to one backend; a channel
//!   made by `Channel::balance_list` hides its backends, so as an endpoint of this balancer it
//!   would be one backend that answers from several, and avoiding it would avoid all of them.
//! - **`Clone`**: the retry and hedge layers clone their inner service for later attempts, and
//!   [`Balance`](crate::balance::Balance) is not `Clone` (it owns the endpoints). Put a
//!   [`tower::buffer::Buffer`] over it, as tonic does over its own balancer;
//!   [`BalancedChannel`](crate::balance::BalancedChannel) does.
//! - **Order**: the layers go above the balancer (one call, several attempts, each balanced);
//!   a balancer above the layers would pick once per call.
//! - **A throttle per authority**
//!   ([`throttle_per_authority`](crate::policy::PoliciesBuilder::throttle_per_authority)): the
//!   layers read the authority of the request *above* the balancer, the name of the service,
//!   not of a backend, so one bucket counts the failures of the whole backend set, as gRFC A6
//!   asks ("per server name"). The bucket counts every failure of a bad backend: without
//!   outlier detection, one that fails every call drains the bucket all backends share, and
//!   the throttle then stops retries to the healthy ones too. With it, the bad backend takes
//!   a few attempts before it is out.
//! - **Discovery**: an endpoint whose `poll_ready` fails is dropped, as tower's balancer drops
//!   it, until discovery inserts it again; one discovery removes is forgotten, ejection and
//!   all. An endpoint inserted again under its key keeps what the balancer learned of it.
//! - **The response type**: [`Balance`](crate::balance::Balance) answers
//!   `http::Response<ResponseBody<B>>` for an endpoint's `http::Response<B>` (the body
//!   unchanged, read through); [`BalancedChannel`](crate::balance::BalancedChannel) answers
//!   tonic's `http::Response<tonic::body::Body>` as before.
//!
//! # Telemetry
//!
//! ## When a call records the A96 metrics
//!
//! As gRFC A96 says ("if there were no retries, 0 is not reported"), a count of zero is not
//! recorded, and a call of a single attempt records nothing at all (as gRPC C-core does), so
//! the success path costs a comparison. The retry delay is recorded for every call of more
//! than one attempt.
//!
//! The boundaries are given to the SDK as advice (`with_boundaries`); a view may override
//! them.
//!
//! A table built with a meter, with the `opentelemetry` feature (see
//! [`RetryMetrics`](crate::telemetry::RetryMetrics)):
//!
//! ```
//! # #[cfg(feature = "opentelemetry")]
//! # fn main() {
//! use opentelemetry::metrics::MeterProvider as _;
//! use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
//! use tower_retry_hedge::telemetry::RetryMetrics;
//! use tower_retry_hedge::Policies;
//!
//! let exporter = InMemoryMetricExporter::default();
//! let provider = SdkMeterProvider::builder()
//!     .with_reader(PeriodicReader::builder(exporter.clone()).build())
//!     .build();
//! let meter = provider.meter("tower-retry-hedge");
//!
//! // The meter alone: `grpc.target` is each request's authority.
//! let policies = Policies::builder().metrics(&meter).build();
//! // Or with the channel's target, as A66 defines it.
//! let policies = Policies::builder()
//!     .metrics(RetryMetrics::new(&meter).target("dns:///greeter.example.com:443"))
//!     .build();
//! # let _ = policies;
//! # }
//! # #[cfg(not(feature = "opentelemetry"))]
//! # fn main() {}
//! ```
//!
//! ## Reading the layers' state
//!
//! [`Policies::throttle_state`](crate::Policies::throttle_state),
//! [`Policies::buffer_limits`](crate::Policies::buffer_limits) and
//! [`Policies::stats`](crate::Policies::stats), on a table built from service config:
//!
//! ```
//! use tower_retry_hedge::config::ServiceConfig;
//! use tower_retry_hedge::throttle::ThrottleState;
//!
//! let policies = ServiceConfig::from_json(r#"{
//!   "methodConfig": [],
//!   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
//! }"#)?
//! .policies();
//! match policies.throttle_state() {
//!     Some(ThrottleState::Bucket { tokens, threshold, .. }) => {
//!         assert_eq!((tokens, threshold), (10.0, 5.0)); // retries flow while tokens > threshold
//!     }
//!     other => panic!("an A6 bucket, not {other:?}"),
//! }
//! assert_eq!(policies.buffer_limits().in_use(), 0); // no body is being recorded
//! assert!(policies.stats().snapshot().methods.is_empty()); // no retry yet
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`per_attempt_timeout`]: crate::policy::RetryPolicyBuilder::per_attempt_timeout
//! [`hedge_on_per_attempt_timeout`]: crate::policy::RetryPolicyBuilder::hedge_on_per_attempt_timeout
//! [`retry_non_idempotent`]: crate::policy::RetryPolicyBuilder::retry_non_idempotent
//! [`retry_with_idempotency_key`]: crate::policy::RetryPolicyBuilder::retry_with_idempotency_key
