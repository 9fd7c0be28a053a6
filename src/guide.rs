//! Choosing a policy: retry or hedge, bucket or budget, which delay, which jitter.
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
//! # The A6 token bucket or a retry budget?
//!
//! Both sit behind [`RetryThrottle`](crate::throttle::RetryThrottle) and are set with
//! [`PoliciesBuilder::throttle`](crate::policy::PoliciesBuilder::throttle).
//!
//! - The **A6 bucket** ([`Throttle`](crate::Throttle)) watches the *failure rate*: each
//!   failure costs a token, each success earns `tokenRatio`, and retries stop while the
//!   bucket is at or below half. With `(10, 0.1)` it stops retrying once failures outnumber
//!   successes about ten to one, and in a total outage it lets through one attempt per call
//!   after the first few calls: the retry storm benchmark measures ≤ 1.01 attempts per call.
//!   Choose it to get the behaviour gRPC clients have from the same service config.
//! - A **budget** ([`RetryBudget`](crate::throttle::RetryBudget)) bounds the *extra load*:
//!   retries ≤ ratio × calls over a window, plus a floor per second. It never lets retries add
//!   more than the ratio, however the failures are spread, and keeps retrying at that rate
//!   through a partial outage (where the bucket may stop entirely). Choose it when capacity is
//!   planned by load (Finagle and Linkerd's default), or for HTTP clients with no service
//!   config.
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
