//! Retry throttling: the gRFC A6 token bucket, a retry budget and adaptive throttling,
//! shared per server.
//!
//! # The rule
//!
//! For each server a client keeps a `token_count`, which starts at `maxTokens` and stays
//! within `[0, maxTokens]`:
//!
//! - every failed call (one that ended with a retryable or non-fatal status, or with a
//!   pushback saying "do not retry") takes 1 token;
//! - every successful call adds `tokenRatio` tokens;
//! - a retry or a hedged attempt may be sent only while `token_count > maxTokens / 2`.
//!
//! The first attempt of a call is always sent; only the extra ones are throttled, and they
//! never wait for tokens: a throttled retry is simply not made, and the last failure is
//! returned to the caller.
//!
//! # Why a bucket beats a fixed retry count
//!
//! A fixed `maxAttempts` multiplies the load on a server by up to `maxAttempts` exactly when
//! it is least able to take it: during an outage every call fails and every call is retried,
//! which is how retry storms keep a recovering server down. The bucket ties retries to the
//! health the client observes. While failures stay below `tokenRatio` per success (with
//! `0.1`, one failure in ten successes) the bucket stays near full and retries flow freely.
//! Past that rate it drains, and once `maxTokens / 2` failures more than the successes pay
//! for have arrived, retries stop: in a full outage the extra load is about
//! `maxTokens / 2` retries, a constant, rather than `maxAttempts - 1` retries per call.
//! Retries resume by themselves once enough calls succeed again (with `(10, 0.1)`, 61
//! successes after a full drain).
//!
//! Tokens are kept in thousandths in one atomic integer and updated by compare-and-swap, so
//! a throttle costs no lock on the path of an attempt, and `tokenRatio` is applied with
//! exactly the three decimal places that gRFC A6 supports.
//!
//! # Examples
//!
//! The configuration gRFC A6 uses as its example, `{"maxTokens": 10, "tokenRatio": 0.1}`:
//!
//! ```
//! use tower_retry_hedge::throttle::{RetryThrottle, Throttle};
//!
//! let throttle = Throttle::new(10, 0.1)?;
//! assert!(throttle.allows_retry()); // 10 > 5
//!
//! for _ in 0..5 {
//!     throttle.on_failure();
//! }
//! assert_eq!(throttle.tokens(), 5.0);
//! assert!(!throttle.allows_retry()); // 5 is not above 5
//!
//! throttle.on_success();
//! assert_eq!(throttle.tokens_milli(), 5_100);
//! assert!(throttle.allows_retry());
//! # Ok::<(), tower_retry_hedge::error::BuildError>(())
//! ```
//!
//! A client that talks to many hosts keeps one bucket per authority, shared by every clone
//! of the throttle it hands out:
//!
//! ```
//! use tower_retry_hedge::throttle::{RetryThrottle, ThrottleRegistry};
//!
//! let registry = ThrottleRegistry::new(100, 0.25)?;
//! let api = registry.get("api.example.com:443");
//! let same = registry.get("API.example.com:443"); // hosts compare case-insensitively
//! let other = registry.get("auth.example.com:443");
//!
//! for _ in 0..50 {
//!     api.on_failure();
//! }
//! assert!(!same.allows_retry()); // one bucket, drained to 50 of 100
//! assert!(other.allows_retry()); // another host is not affected
//! assert_eq!(registry.len(), 2);
//! # Ok::<(), tower_retry_hedge::error::BuildError>(())
//! ```
//!
//! # Other throttles
//!
//! A [`RetryBudget`] (retries bounded by a share of recent calls) and an
//! [`AdaptiveThrottle`] (the SRE book's client-side throttling) stand behind the same seam,
//! [`RetryThrottle`], and a [`ThrottleRegistry`] keeps one of either per authority too. The
//! [guide](crate::guide) compares them, and recommends the bucket `Throttle::new(20, 1.0)`,
//! which keeps retrying through a partial outage and stops in a total one.

mod adaptive;
mod budget;
mod hedge_budget;
mod registry;

pub use adaptive::AdaptiveThrottle;
pub use budget::RetryBudget;
pub use hedge_budget::HedgeBudget;
pub(crate) use registry::AuthorityThrottles;
pub use registry::ThrottleRegistry;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::BuildError;

/// The seam through which the retry and hedge layers ask whether another attempt may be
/// sent.
///
/// Implemented by the gRFC A6 token bucket, [`Throttle`], by a [`RetryBudget`] and by an
/// [`AdaptiveThrottle`]. The layers call [`on_call`](RetryThrottle::on_call) once per logical
/// call, [`on_success`](RetryThrottle::on_success), [`on_failure`](RetryThrottle::on_failure)
/// or [`on_fatal`](RetryThrottle::on_fatal) as answers arrive, and
/// [`allows_retry`](RetryThrottle::allows_retry) before every attempt but the first.
///
/// The trait is object safe, so policies may hold an `Arc<dyn RetryThrottle>`:
///
/// ```
/// use std::sync::Arc;
/// use tower_retry_hedge::throttle::{RetryThrottle, Throttle};
///
/// let throttle: Arc<dyn RetryThrottle> = Arc::new(Throttle::new(10, 0.1)?);
/// throttle.on_call();
/// throttle.on_failure();
/// assert!(throttle.allows_retry());
/// # Ok::<(), tower_retry_hedge::error::BuildError>(())
/// ```
pub trait RetryThrottle: fmt::Debug + Send + Sync {
    /// A logical call started (a budget deposits here; the A6 bucket ignores it).
    ///
    /// The default does nothing.
    fn on_call(&self) {}

    /// A call succeeded (A6: tokens += tokenRatio, capped at maxTokens).
    fn on_success(&self);

    /// An attempt failed in a way that counts (A6: tokens -= 1, floored at 0).
    fn on_failure(&self);

    /// An attempt ended with a failure that does not count against the throttle: the server
    /// answered (a fatal status), so it took the request. An adaptive throttle counts it as
    /// an accept; the A6 bucket ignores it.
    ///
    /// The default does nothing.
    fn on_fatal(&self) {}

    /// May a retry or a hedge be sent now? (A6: tokens > maxTokens / 2.)
    ///
    /// A budget withdraws here, so call it only when an attempt would otherwise be sent.
    fn allows_retry(&self) -> bool;

    /// What the throttle holds now, for dashboards and debugging; reading it changes
    /// nothing.
    ///
    /// The default says [`ThrottleState::Unknown`].
    fn state(&self) -> ThrottleState {
        ThrottleState::Unknown
    }
}

/// What a throttle holds at one moment: [`RetryThrottle::state`], or
/// [`Policies::throttle_state`](crate::Policies::throttle_state) for the table's.
///
/// ```
/// use tower_retry_hedge::throttle::{RetryThrottle, Throttle, ThrottleState};
///
/// let throttle = Throttle::new(10, 0.1)?;
/// throttle.on_failure();
/// assert_eq!(
///     throttle.state(),
///     ThrottleState::Bucket { tokens: 9.0, max_tokens: 10, threshold: 5.0, token_ratio: 0.1 }
/// );
/// assert!(throttle.state().allows_retry().unwrap_or(true));
/// # Ok::<(), tower_retry_hedge::error::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum ThrottleState {
    /// The gRFC A6 token bucket ([`Throttle`]): retries and hedges are sent only while
    /// `tokens > threshold` (`max_tokens / 2`).
    Bucket {
        /// The tokens now.
        tokens: f64,
        /// `maxTokens`.
        max_tokens: u32,
        /// `maxTokens / 2`: the tokens must be above it.
        threshold: f64,
        /// `tokenRatio` as applied (truncated to three decimals).
        token_ratio: f64,
    },
    /// A [`RetryBudget`].
    Budget {
        /// Retries it would still allow now.
        remaining: u64,
    },
    /// An [`AdaptiveThrottle`], over its window.
    Adaptive {
        /// Answers counted.
        requests: u64,
        /// Answers the servers accepted (successes and fatal answers).
        accepts: u64,
        /// The probability that a retry asked for now is rejected.
        rejection_probability: f64,
    },
    /// A throttle that does not report its state.
    Unknown,
}

impl ThrottleState {
    /// Whether a retry would be allowed now, where the state alone says: `Some` for a bucket
    /// and a budget, `None` for an adaptive throttle (a random draw decides) or an unknown
    /// one.
    pub fn allows_retry(&self) -> Option<bool> {
        match *self {
            ThrottleState::Bucket {
                tokens, threshold, ..
            } => Some(tokens > threshold),
            ThrottleState::Budget { remaining } => Some(remaining > 0),
            ThrottleState::Adaptive { .. } | ThrottleState::Unknown => None,
        }
    }
}

impl<T: RetryThrottle + ?Sized> RetryThrottle for Arc<T> {
    fn on_call(&self) {
        (**self).on_call();
    }

    fn on_success(&self) {
        (**self).on_success();
    }

    fn on_failure(&self) {
        (**self).on_failure();
    }

    fn on_fatal(&self) {
        (**self).on_fatal();
    }

    fn allows_retry(&self) -> bool {
        (**self).allows_retry()
    }

    fn state(&self) -> ThrottleState {
        (**self).state()
    }
}

/// A throttle that a [`ThrottleRegistry`] can give each authority a copy of: a new throttle
/// with the same settings and none of the state.
///
/// Implemented by [`Throttle`], [`AdaptiveThrottle`] and [`RetryBudget`].
pub trait AuthorityThrottle: RetryThrottle + Clone + 'static {
    /// A new throttle with the same settings, sharing nothing with `self` (a full bucket, an
    /// empty window).
    fn fresh(&self) -> Self;
}

/// The largest `maxTokens` gRFC A6 allows.
pub(crate) const MAX_TOKENS_LIMIT: u32 = 1000;

/// Thousandths per token: gRFC A6 keeps three decimal places of `tokenRatio`.
const MILLI: u32 = 1000;

/// The gRFC A6 token bucket.
///
/// Cheap to clone (an [`Arc`] inside); clones share the tokens, so one `Throttle` per server
/// can be handed to every policy that talks to it. See the [module docs](self) for the rule.
///
/// ```
/// use tower_retry_hedge::throttle::{RetryThrottle, Throttle};
///
/// let throttle = Throttle::new(4, 0.5)?;
/// let clone = throttle.clone();
/// clone.on_failure();
/// clone.on_failure();
/// assert_eq!(throttle.tokens(), 2.0);
/// assert!(!throttle.allows_retry()); // 2 is not above 4 / 2
/// # Ok::<(), tower_retry_hedge::error::BuildError>(())
/// ```
#[derive(Clone)]
pub struct Throttle {
    bucket: Arc<Bucket>,
}

struct Bucket {
    /// Current tokens in thousandths, always within `[0, max_milli]`.
    tokens_milli: AtomicU32,
    max_tokens: u32,
    /// `max_tokens * 1000`, at most 1,000,000: doubling it cannot overflow a `u32`.
    max_milli: u32,
    /// The truncated ratio in thousandths, in `[1, max_milli]`.
    ratio_milli: u32,
}

impl Throttle {
    /// A full bucket of `max_tokens` tokens that earns `token_ratio` per success.
    ///
    /// Validation follows gRFC A6:
    ///
    /// - `max_tokens` must be in `(0, 1000]`;
    /// - `token_ratio` must be finite and greater than 0. Digits past the third decimal are
    ///   dropped, as in gRPC (`0.5009` acts as `0.5`), so a ratio that truncates to `0.000`
    ///   (such as `0.0009`) is an error.
    ///
    /// A ratio above `max_tokens` is accepted, as gRFC A6 sets no upper bound and grpc-go,
    /// grpc-java and gRPC C-core all accept one; it behaves exactly like `max_tokens` (one
    /// success refills the bucket), and is stored and reported as `max_tokens`.
    ///
    /// ```
    /// use tower_retry_hedge::throttle::Throttle;
    ///
    /// let throttle = Throttle::new(10, 0.5466)?;
    /// assert_eq!(throttle.token_ratio_milli(), 546);
    ///
    /// let err = Throttle::new(1001, 0.1).unwrap_err();
    /// assert_eq!(err.to_string(), "max_tokens: must be an integer in (0, 1000]");
    /// let err = Throttle::new(10, 0.0009).unwrap_err();
    /// assert_eq!(err.field(), "token_ratio");
    /// # Ok::<(), tower_retry_hedge::error::BuildError>(())
    /// ```
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<Throttle, BuildError> {
        let (max_milli, ratio_milli) = validate(max_tokens, token_ratio)?;
        Ok(Throttle {
            bucket: Arc::new(Bucket {
                tokens_milli: AtomicU32::new(max_milli),
                max_tokens,
                max_milli,
                ratio_milli,
            }),
        })
    }

    /// `maxTokens`: the capacity of the bucket, and the number of tokens it starts with.
    pub fn max_tokens(&self) -> u32 {
        self.bucket.max_tokens
    }

    /// `tokenRatio` in thousandths, after truncation (and the cap at `max_tokens`).
    pub fn token_ratio_milli(&self) -> u32 {
        self.bucket.ratio_milli
    }

    /// `tokenRatio` as applied, after truncation (and the cap at `max_tokens`).
    pub fn token_ratio(&self) -> f64 {
        f64::from(self.bucket.ratio_milli) / f64::from(MILLI)
    }

    /// The tokens in the bucket now.
    pub fn tokens(&self) -> f64 {
        f64::from(self.tokens_milli()) / f64::from(MILLI)
    }

    /// The tokens in the bucket now, in thousandths.
    pub fn tokens_milli(&self) -> u32 {
        // Relaxed suffices: the bucket is one independent counter that orders nothing else.
        self.bucket.tokens_milli.load(Ordering::Relaxed)
    }
}

impl RetryThrottle for Throttle {
    fn on_success(&self) {
        let Bucket {
            max_milli,
            ratio_milli,
            ..
        } = *self.bucket;
        // `None` (already full) skips the write; the result only says whether one happened.
        let _ =
            self.bucket
                .tokens_milli
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                    (tokens < max_milli).then(|| tokens.saturating_add(ratio_milli).min(max_milli))
                });
    }

    fn on_failure(&self) {
        let _ =
            self.bucket
                .tokens_milli
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                    (tokens > 0).then(|| tokens.saturating_sub(MILLI))
                });
    }

    fn allows_retry(&self) -> bool {
        // Strictly above half: `max_milli <= 1_000_000`, so doubling cannot overflow.
        self.tokens_milli().saturating_mul(2) > self.bucket.max_milli
    }

    fn state(&self) -> ThrottleState {
        ThrottleState::Bucket {
            tokens: self.tokens(),
            max_tokens: self.max_tokens(),
            threshold: f64::from(self.max_tokens()) / 2.0,
            token_ratio: self.token_ratio(),
        }
    }
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("max_tokens", &self.max_tokens())
            .field("token_ratio", &self.token_ratio())
            .field("tokens", &self.tokens())
            .finish()
    }
}

fn validate(max_tokens: u32, token_ratio: f64) -> Result<(u32, u32), BuildError> {
    if max_tokens == 0 || max_tokens > MAX_TOKENS_LIMIT {
        return Err(BuildError::new(
            "max_tokens",
            "must be an integer in (0, 1000]",
        ));
    }
    if !token_ratio.is_finite() {
        return Err(BuildError::new(
            "token_ratio",
            "must be a finite number greater than 0",
        ));
    }
    if token_ratio <= 0.0 {
        return Err(BuildError::new("token_ratio", "must be greater than 0"));
    }
    let max_milli = max_tokens * MILLI;
    let ratio_milli = truncate_to_milli(token_ratio).min(max_milli);
    if ratio_milli == 0 {
        return Err(BuildError::new(
            "token_ratio",
            "rounds to zero: digits past the third decimal are dropped",
        ));
    }
    Ok((max_milli, ratio_milli))
}

/// Truncates a positive finite `value` to thousandths, saturating at `u32::MAX`.
///
/// `floor(value * 1000.0)` would be wrong for ratios such as `0.57`, whose nearest `f64`
/// times 1000 is `569.999…`. gRPC truncates the decimal text of the JSON number instead;
/// the shortest decimal that round-trips to the same `f64` (what `Display` prints, never in
/// exponent form) is that text, so its digits are read here as they are formatted, with
/// no allocation.
fn truncate_to_milli(value: f64) -> u32 {
    use fmt::Write as _;

    #[derive(Default)]
    struct Milli {
        whole: u32,
        fraction: u32,
        fraction_digits: u32,
        after_point: bool,
    }

    impl fmt::Write for Milli {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            for byte in s.bytes() {
                match byte {
                    b'.' => self.after_point = true,
                    b'0'..=b'9' if !self.after_point => {
                        self.whole = self
                            .whole
                            .saturating_mul(10)
                            .saturating_add(u32::from(byte - b'0'));
                    }
                    b'0'..=b'9' if self.fraction_digits < 3 => {
                        self.fraction = self.fraction * 10 + u32::from(byte - b'0');
                        self.fraction_digits += 1;
                    }
                    _ => {}
                }
            }
            Ok(())
        }
    }

    let mut milli = Milli::default();
    // Writing into `Milli` cannot fail.
    let _ = write!(milli, "{value}");
    let scale = 10u32.pow(3 - milli.fraction_digits);
    milli
        .whole
        .saturating_mul(MILLI)
        .saturating_add(milli.fraction * scale)
}

impl AuthorityThrottle for Throttle {
    /// A new, full bucket with the same settings.
    fn fresh(&self) -> Throttle {
        let Bucket {
            max_tokens,
            max_milli,
            ratio_milli,
            ..
        } = *self.bucket;
        Throttle {
            bucket: Arc::new(Bucket {
                tokens_milli: AtomicU32::new(max_milli),
                max_tokens,
                max_milli,
                ratio_milli,
            }),
        }
    }
}

/// A throttle handle alone on its cache lines (128 bytes: the adjacent-line prefetcher pairs
/// them), forwarding to the throttle it holds. A driver's service clone takes its reference
/// counts on one of these, not on the table's handle that every core shares (see
/// `retry::call::handles` for the figures).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Padded(pub(crate) Arc<dyn RetryThrottle>);

impl RetryThrottle for Padded {
    fn on_call(&self) {
        self.0.on_call();
    }

    fn on_success(&self) {
        self.0.on_success();
    }

    fn on_failure(&self) {
        self.0.on_failure();
    }

    fn on_fatal(&self) {
        self.0.on_fatal();
    }

    fn allows_retry(&self) -> bool {
        self.0.allows_retry()
    }

    fn state(&self) -> ThrottleState {
        self.0.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throttle::registry::MAX_AUTHORITY_LEN;

    /// Plays one call with `max_attempts` whose every attempt fails, as the retry layer
    /// does: the first attempt is always sent; after each failure the throttle is debited,
    /// then a retry is made only if it allows one and attempts remain. Returns the attempts.
    fn failing_call(throttle: &impl RetryThrottle, max_attempts: u32) -> u32 {
        throttle.on_call();
        let mut attempts = 1;
        loop {
            throttle.on_failure();
            if attempts < max_attempts && throttle.allows_retry() {
                attempts += 1;
            } else {
                return attempts;
            }
        }
    }

    #[test]
    fn failing_calls_make_3_2_1_then_1_attempts() {
        let throttle = Throttle::new(10, 0.1).unwrap();
        assert_eq!(failing_call(&throttle, 3), 3);
        assert_eq!(throttle.tokens_milli(), 7_000);
        assert_eq!(failing_call(&throttle, 3), 2);
        assert_eq!(throttle.tokens_milli(), 5_000);
        for expected in [4_000, 3_000, 2_000, 1_000, 0, 0, 0] {
            assert_eq!(failing_call(&throttle, 3), 1);
            assert_eq!(throttle.tokens_milli(), expected);
        }
    }

    #[test]
    fn sixty_one_successes_reopen_a_drained_bucket() {
        let throttle = Throttle::new(10, 0.1).unwrap();
        for _ in 0..20 {
            throttle.on_failure();
        }
        assert_eq!(throttle.tokens_milli(), 0);
        for _ in 0..60 {
            throttle.on_success();
        }
        assert_eq!(throttle.tokens_milli(), 6_000);
        assert_eq!(failing_call(&throttle.fresh_copy(), 3), 1);

        throttle.on_success();
        assert_eq!(throttle.tokens_milli(), 6_100);
        assert_eq!(failing_call(&throttle, 3), 2);
    }

    impl Throttle {
        fn same_bucket(&self, other: &Throttle) -> bool {
            Arc::ptr_eq(&self.bucket, &other.bucket)
        }

        /// A separate bucket with the same settings and the same tokens.
        fn fresh_copy(&self) -> Throttle {
            let copy = self.fresh();
            copy.bucket
                .tokens_milli
                .store(self.tokens_milli(), Ordering::Relaxed);
            copy
        }
    }

    #[test]
    fn tokens_stay_within_bounds() {
        let throttle = Throttle::new(3, 0.7).unwrap();
        for _ in 0..10 {
            throttle.on_success();
        }
        assert_eq!(throttle.tokens_milli(), 3_000);
        throttle.on_failure();
        throttle.on_success();
        assert_eq!(throttle.tokens_milli(), 2_700);
        for _ in 0..10 {
            throttle.on_failure();
        }
        assert_eq!(throttle.tokens_milli(), 0);
        throttle.on_success();
        assert_eq!(throttle.tokens_milli(), 700);
    }

    #[test]
    fn threshold_is_strictly_above_half() {
        // Odd maxTokens: the threshold is 1.5 tokens.
        let throttle = Throttle::new(3, 0.5).unwrap();
        throttle.on_failure(); // 2.0
        assert!(throttle.allows_retry());
        throttle.on_failure(); // 1.0
        assert!(!throttle.allows_retry());
        throttle.on_success(); // 1.5
        assert!(!throttle.allows_retry());
        throttle.on_success(); // 2.0
        assert!(throttle.allows_retry());

        let one = Throttle::new(1, 0.001).unwrap();
        assert!(one.allows_retry());
        one.on_failure();
        for _ in 0..500 {
            one.on_success();
        }
        assert_eq!(one.tokens_milli(), 500);
        assert!(!one.allows_retry());
        one.on_success();
        assert!(one.allows_retry());
    }

    #[test]
    fn ratio_truncates_to_three_decimals() {
        let cases = [
            (0.5009, 500),
            (0.5466, 546),
            (0.1, 100),
            (0.57, 570),
            (0.29, 290),
            (1.0, 1_000),
            (0.001, 1),
            (0.0019, 1),
            (2.5, 2_500),
            (9.999_999, 9_999),
        ];
        for (ratio, milli) in cases {
            let throttle = Throttle::new(10, ratio).unwrap();
            assert_eq!(throttle.token_ratio_milli(), milli, "{ratio}");
        }
        assert_eq!(Throttle::new(10, 0.5009).unwrap().token_ratio(), 0.5);
    }

    #[test]
    fn truncation_reads_the_shortest_decimal() {
        // Every ratio with at most three decimals survives the f64 round trip exactly.
        for milli in 1..=20_000u32 {
            let ratio = f64::from(milli) / 1000.0;
            assert_eq!(truncate_to_milli(ratio), milli, "{ratio}");
        }
        assert_eq!(truncate_to_milli(1e-7), 0);
        assert_eq!(truncate_to_milli(1e300), u32::MAX);
        assert_eq!(truncate_to_milli(f64::MAX), u32::MAX);
        assert_eq!(truncate_to_milli(4_294_967.295), u32::MAX);
        assert_eq!(truncate_to_milli(4_294_967.294_9), 4_294_967_294);
    }

    #[test]
    fn ratio_above_max_tokens_is_capped() {
        let throttle = Throttle::new(10, 1e9).unwrap();
        assert_eq!(throttle.token_ratio_milli(), 10_000);
        assert_eq!(throttle.token_ratio(), 10.0);
        for _ in 0..10 {
            throttle.on_failure();
        }
        throttle.on_success();
        assert_eq!(throttle.tokens_milli(), 10_000);
        assert!(Throttle::new(1000, f64::MAX).is_ok());
    }

    #[test]
    fn invalid_settings_are_rejected() {
        let rule = |result: Result<Throttle, BuildError>| {
            let err = result.unwrap_err();
            (err.field(), err.rule())
        };
        let max_tokens = ("max_tokens", "must be an integer in (0, 1000]");
        assert_eq!(rule(Throttle::new(0, 0.1)), max_tokens);
        assert_eq!(rule(Throttle::new(1001, 0.1)), max_tokens);
        assert!(Throttle::new(1, 0.1).is_ok());
        assert!(Throttle::new(1000, 0.1).is_ok());
        for ratio in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(
                rule(Throttle::new(10, ratio)),
                ("token_ratio", "must be a finite number greater than 0")
            );
        }
        for ratio in [0.0, -0.0, -0.1, -1e300, f64::MIN] {
            assert_eq!(
                rule(Throttle::new(10, ratio)),
                ("token_ratio", "must be greater than 0")
            );
        }
        for ratio in [0.0009, 1e-300, f64::MIN_POSITIVE, 5e-324] {
            let (field, rule) = rule(Throttle::new(10, ratio));
            assert_eq!(field, "token_ratio");
            assert!(rule.starts_with("rounds to zero"), "{rule}");
        }
    }

    #[test]
    fn errors_name_the_field_and_the_rule() {
        let messages = [
            (
                Throttle::new(0, 0.1).unwrap_err(),
                "max_tokens: must be an integer in (0, 1000]",
            ),
            (
                Throttle::new(10, f64::NAN).unwrap_err(),
                "token_ratio: must be a finite number greater than 0",
            ),
            (
                Throttle::new(10, -1.5).unwrap_err(),
                "token_ratio: must be greater than 0",
            ),
            (
                Throttle::new(10, 0.0009).unwrap_err(),
                "token_ratio: rounds to zero: digits past the third decimal are dropped",
            ),
        ];
        for (err, message) in messages {
            assert_eq!(err.to_string(), message);
        }
    }

    #[test]
    fn debug_shows_the_state() {
        let throttle = Throttle::new(10, 0.1).unwrap();
        throttle.on_failure();
        assert_eq!(
            format!("{throttle:?}"),
            "Throttle { max_tokens: 10, token_ratio: 0.1, tokens: 9.0 }"
        );
    }

    #[test]
    fn arc_dyn_throttle_forwards() {
        let throttle = Throttle::new(10, 0.1).unwrap();
        let shared: Arc<dyn RetryThrottle> = Arc::new(throttle.clone());
        assert_eq!(failing_call(&shared, 3), 3);
        shared.on_success();
        assert_eq!(throttle.tokens_milli(), 7_100);
    }

    #[test]
    fn registry_keys_ignore_ascii_case_only() {
        let registry = ThrottleRegistry::new(10, 0.1).unwrap();
        assert!(registry.is_empty());
        let a = registry.get("Example.COM:443");
        assert!(a.same_bucket(&registry.get("example.com:443")));
        assert!(!a.same_bucket(&registry.get("example.com")));
        assert!(!a.same_bucket(&registry.get("example.com:8443")));
        assert_eq!(registry.len(), 3);
        assert!(!registry.is_overflow(&a));
    }

    #[test]
    fn registry_overflow_past_the_cap() {
        let registry = ThrottleRegistry::new(10, 0.1)
            .unwrap()
            .with_max_authorities(3);
        let kept: Vec<_> = (0..3).map(|i| registry.get(&format!("h{i}:1"))).collect();
        let late = registry.get("late:1");
        assert!(registry.is_overflow(&late));
        assert!(registry.is_overflow(&registry.get("later:1")));
        // Hosts admitted before the cap keep their own buckets.
        for (i, throttle) in kept.iter().enumerate() {
            assert!(throttle.same_bucket(&registry.get(&format!("H{i}:1"))));
            assert!(!registry.is_overflow(throttle));
        }
        assert_eq!(registry.len(), 3);

        let long = "a".repeat(MAX_AUTHORITY_LEN + 1);
        let fresh = ThrottleRegistry::new(10, 0.1).unwrap();
        assert!(fresh.is_overflow(&fresh.get(&long)));
        assert!(fresh.is_empty());
        assert!(!fresh.is_overflow(&fresh.get(&long[..MAX_AUTHORITY_LEN])));

        let none = ThrottleRegistry::new(10, 0.1)
            .unwrap()
            .with_max_authorities(0);
        assert!(none.is_overflow(&none.get("a:1")));
        assert!(none.is_empty());
    }

    #[test]
    fn registry_buckets_use_the_settings() {
        let registry = ThrottleRegistry::new(7, 0.3333).unwrap();
        let throttle = registry.get("a:1");
        assert_eq!(throttle.max_tokens(), 7);
        assert_eq!(throttle.token_ratio_milli(), 333);
        assert_eq!(throttle.tokens_milli(), 7_000);
        let err = ThrottleRegistry::new(10, 0.0).unwrap_err();
        assert_eq!(err.to_string(), "token_ratio: must be greater than 0");
        assert_eq!(
            format!("{registry:?}"),
            "ThrottleRegistry { overflow: Throttle { max_tokens: 7, token_ratio: 0.333, tokens: 7.0 }, \
             authorities: 1, max_authorities: 4096 }"
        );
    }
}
