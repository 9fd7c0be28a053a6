//! [`ThrottleRegistry`]: one throttle per authority, bounded against untrusted names.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

#[cfg(doc)]
use super::AdaptiveThrottle;
use super::{AuthorityThrottle, RetryThrottle, Throttle, ThrottleState};
use crate::error::BuildError;

/// How many authorities a [`ThrottleRegistry`] gives their own bucket by default.
pub(crate) const DEFAULT_MAX_AUTHORITIES: usize = 4096;

/// Authorities longer than this share the overflow bucket: no DNS name (253 bytes) with a
/// port, nor any IP literal, is this long, and it bounds what one entry can cost.
pub(crate) const MAX_AUTHORITY_LEN: usize = 512;

/// One shared throttle per authority (`host:port`), for clients that talk to many hosts.
///
/// gRFC A6 throttles per server name. Authorities are compared ASCII case-insensitively
/// (`API.example.com:443` is `api.example.com:443`); nothing else is normalised, so
/// `example.com` and `example.com:443` are different keys: pass authorities in one form.
///
/// The throttles are A6 buckets ([`ThrottleRegistry::new`]) or copies of any
/// [`AuthorityThrottle`], such as an [`AdaptiveThrottle`]
/// ([`ThrottleRegistry::from_template`]).
///
/// # Bounded growth
///
/// Authorities may come from untrusted input (redirects, user-supplied URLs), so the number
/// of throttles is capped (4 096, or
/// [`with_max_authorities`](ThrottleRegistry::with_max_authorities)). Once the cap is
/// reached, every new authority, and every authority longer than 512 bytes,
/// shares one overflow throttle. Existing throttles are never evicted: evicting one would
/// hand its host a full bucket again, so a flood of names could reset the throttle of a
/// failing server. Sharing errs the other way: failures of one overflow host can only hold
/// back retries to the others, never allow more.
///
/// The map sits behind a lock, taken for reading on every [`get`](ThrottleRegistry::get):
/// look a throttle up once per call or per connection, not per attempt. The A6 buckets
/// themselves are lock-free.
///
/// ```
/// use tower_retry_hedge::throttle::{RetryThrottle, ThrottleRegistry};
///
/// let registry = ThrottleRegistry::new(10, 0.1)?.with_max_authorities(2);
/// registry.get("a.test:443");
/// registry.get("b.test:443");
/// let c = registry.get("c.test:443"); // past the cap: the overflow bucket
/// let d = registry.get("d.test:443"); // shares it
/// c.on_failure();
/// assert_eq!(d.tokens(), 9.0);
/// assert_eq!(registry.len(), 2);
/// # Ok::<(), tower_retry_hedge::error::BuildError>(())
/// ```
///
/// An adaptive throttle per authority:
///
/// ```
/// use tower_retry_hedge::throttle::{AdaptiveThrottle, RetryThrottle, ThrottleRegistry};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let registry = ThrottleRegistry::from_template(AdaptiveThrottle::default());
/// registry.get("api.example.com:443").on_failure();
/// assert_eq!(registry.get("API.example.com:443").requests(), 1);
/// assert_eq!(registry.get("auth.example.com:443").requests(), 0);
/// # }
/// ```
pub struct ThrottleRegistry<T = Throttle> {
    shared: Arc<Registry<T>>,
}

impl<T> Clone for ThrottleRegistry<T> {
    fn clone(&self) -> Self {
        ThrottleRegistry {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Each throttle sits in an `Arc` of its own, so that the layers can hold it as an
/// `Arc<dyn RetryThrottle>` without an allocation per call.
struct Registry<T> {
    max_authorities: usize,
    throttles: RwLock<HashMap<String, Arc<T>>>,
    overflow: Arc<T>,
}

impl ThrottleRegistry<Throttle> {
    /// A registry whose buckets each hold `max_tokens` and earn `token_ratio` per success,
    /// validated as in [`Throttle::new`].
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<Self, BuildError> {
        Ok(ThrottleRegistry::from_template(Throttle::new(
            max_tokens,
            token_ratio,
        )?))
    }
}

impl<T: AuthorityThrottle> ThrottleRegistry<T> {
    /// A registry that gives each authority a [`fresh`](AuthorityThrottle::fresh) copy of
    /// `template` (whose own state is not used).
    pub fn from_template(template: T) -> Self {
        ThrottleRegistry::with_overflow(DEFAULT_MAX_AUTHORITIES, template.fresh())
    }

    fn with_overflow(max_authorities: usize, overflow: T) -> Self {
        ThrottleRegistry {
            shared: Arc::new(Registry {
                max_authorities,
                throttles: RwLock::new(HashMap::new()),
                overflow: Arc::new(overflow),
            }),
        }
    }

    /// Sets how many authorities get a throttle of their own (default
    /// 4 096); `0` sends every authority to the overflow throttle.
    ///
    /// Meant for building: the registry returned is a new, empty one, not shared with
    /// clones of `self`.
    #[must_use]
    pub fn with_max_authorities(self, max_authorities: usize) -> Self {
        ThrottleRegistry::with_overflow(max_authorities, self.shared.overflow.fresh())
    }

    /// The throttle for `authority`: the same shared one every time for the same
    /// authority (ASCII case-insensitively), or the overflow throttle past the cap.
    pub fn get(&self, authority: &str) -> T {
        T::clone(&self.shared.get(authority))
    }
}

impl<T: AuthorityThrottle> Registry<T> {
    fn get(&self, authority: &str) -> Arc<T> {
        if authority.len() > MAX_AUTHORITY_LEN {
            return Arc::clone(&self.overflow);
        }
        let key = if authority.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(authority.to_ascii_lowercase())
        } else {
            Cow::Borrowed(authority)
        };

        // A panic elsewhere while a lock was held cannot leave the map inconsistent (every
        // update is one insert), so a poisoned lock is used as it is.
        let throttles = self
            .throttles
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(throttle) = throttles.get(key.as_ref()) {
            return Arc::clone(throttle);
        }
        drop(throttles);

        let mut throttles = self
            .throttles
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(throttle) = throttles.get(key.as_ref()) {
            return Arc::clone(throttle);
        }
        if throttles.len() >= self.max_authorities {
            return Arc::clone(&self.overflow);
        }
        let throttle = Arc::new(self.overflow.fresh());
        throttles.insert(key.into_owned(), Arc::clone(&throttle));
        throttle
    }
}

impl<T> ThrottleRegistry<T> {
    /// The number of authorities with a throttle of their own (the overflow throttle is not
    /// counted); never more than the cap.
    pub fn len(&self) -> usize {
        self.shared
            .throttles
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no authority has a throttle of its own yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many authorities may get a throttle of their own.
    pub fn max_authorities(&self) -> usize {
        self.shared.max_authorities
    }
}

impl<T: RetryThrottle> ThrottleRegistry<T> {
    /// The state of every authority's throttle, by authority (lower-case), without making
    /// any; the overflow throttle is not listed.
    ///
    /// ```
    /// use tower_retry_hedge::throttle::{RetryThrottle, ThrottleRegistry, ThrottleState};
    ///
    /// let registry = ThrottleRegistry::new(10, 0.1)?;
    /// registry.get("API.example.com:443").on_failure();
    /// let states = registry.states();
    /// assert!(matches!(
    ///     states["api.example.com:443"],
    ///     ThrottleState::Bucket { tokens: 9.0, .. }
    /// ));
    /// # Ok::<(), tower_retry_hedge::error::BuildError>(())
    /// ```
    pub fn states(&self) -> BTreeMap<String, ThrottleState> {
        self.shared.states()
    }
}

impl<T: RetryThrottle> Registry<T> {
    fn states(&self) -> BTreeMap<String, ThrottleState> {
        let throttles = self
            .throttles
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        throttles
            .iter()
            .map(|(authority, throttle)| (authority.clone(), throttle.state()))
            .collect()
    }
}

/// A registry of any kind of throttle, as the policy table holds it.
pub(crate) trait AuthorityThrottles: Send + Sync {
    /// The throttle for `authority`, as [`ThrottleRegistry::get`] finds it.
    fn throttle(&self, authority: &str) -> Arc<dyn RetryThrottle>;

    /// Every authority's throttle's state, as [`ThrottleRegistry::states`] reads them.
    fn states(&self) -> BTreeMap<String, ThrottleState>;
}

impl<T: AuthorityThrottle> AuthorityThrottles for Registry<T> {
    fn throttle(&self, authority: &str) -> Arc<dyn RetryThrottle> {
        self.get(authority)
    }

    fn states(&self) -> BTreeMap<String, ThrottleState> {
        Registry::states(self)
    }
}

impl<T: AuthorityThrottle> ThrottleRegistry<T> {
    /// The registry with its kind of throttle erased, for the policy table.
    pub(crate) fn erased(&self) -> Arc<dyn AuthorityThrottles> {
        // Coerced from the `Arc<Registry<T>>` itself: no new allocation.
        self.shared.clone()
    }
}

impl<T: fmt::Debug> fmt::Debug for ThrottleRegistry<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleRegistry")
            .field("overflow", &self.shared.overflow)
            .field("authorities", &self.len())
            .field("max_authorities", &self.shared.max_authorities)
            .finish()
    }
}

#[cfg(test)]
impl ThrottleRegistry {
    /// Whether `throttle` is the overflow bucket.
    pub(super) fn is_overflow(&self, throttle: &Throttle) -> bool {
        Arc::ptr_eq(&throttle.bucket, &self.shared.overflow.bucket)
    }
}
