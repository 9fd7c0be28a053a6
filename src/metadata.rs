//! Attempt metadata: what the layers tell the server, the client and the balancer.
//!
//! - Requests: every attempt after the first carries `grpc-previous-rpc-attempts: N` (gRPC
//!   requests), and gRPC attempts carry the call's *remaining* time in `grpc-timeout`.
//!   Every attempt after the first carries an [`AttemptInfo`] extension. Every call keeps a
//!   shared [`TriedBackends`] list for the load balancer (the `balance` module reads and
//!   fills it) when its hedging policy says so
//!   ([`HedgePolicyBuilder::track_backends`](crate::policy::HedgePolicyBuilder::track_backends),
//!   on by default: A6 sends hedges to distinct backends), or when its table does
//!   ([`PoliciesBuilder::track_backends(true)`](crate::policy::PoliciesBuilder::track_backends),
//!   off by default, since the list costs every call 7 allocations, which a retry policy's
//!   calls would pay though most never retry).
//! - Responses: a call that made more than one attempt returns an [`Attempts`] extension
//!   and, for gRPC, `grpc-previous-rpc-attempts` in the response headers (tonic exposes them
//!   as response metadata): the retry attempts made, A6's "number of retry attempts made",
//!   which is every attempt but one, transparent retries excluded as on the request. For a
//!   hedged call this counts the hedges still in flight when another won, as
//!   [`Attempts::counted`] does; grpc-java gives the winning attempt's own count instead.
//!   Like that header, the extension is absent after a single attempt, which keeps the
//!   success path free of allocations; [`Attempts::of`] reads both cases. Errors carry the
//!   count in [`Attempted`](crate::error::Attempted), always.
//!
//! ```
//! use tower_retry_hedge::metadata::Attempts;
//!
//! let mut response = http::Response::new(());
//! response.extensions_mut().insert(Attempts::new(3, 1));
//! let attempts = Attempts::of(&response);
//! assert_eq!(attempts.sent(), 3);
//! assert_eq!(attempts.transparent(), 1);
//! assert_eq!(attempts.counted(), 2);
//! ```

/// The header that tells a server how many attempts preceded this one (gRFC A6).
pub(crate) const GRPC_PREVIOUS_RPC_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// [`GRPC_PREVIOUS_RPC_ATTEMPTS`] as a header name: inserting by `&str` parses it each time.
pub(crate) const GRPC_PREVIOUS_RPC_ATTEMPTS_NAME: http::HeaderName =
    http::HeaderName::from_static(GRPC_PREVIOUS_RPC_ATTEMPTS);

/// How many attempts a call made: a response extension, present when more than one attempt
/// was sent. Its [`Default`] is a single attempt, so with tonic's extensions:
/// `response.extensions().get::<Attempts>().copied().unwrap_or_default()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    sent: u32,
    transparent: u32,
}

impl Default for Attempts {
    /// A single attempt.
    fn default() -> Attempts {
        Attempts::new(1, 0)
    }
}

impl Attempts {
    /// `sent` attempts in all, of which `transparent` were transparent retries.
    pub fn new(sent: u32, transparent: u32) -> Attempts {
        Attempts {
            sent,
            transparent: transparent.min(sent),
        }
    }

    /// Every attempt sent, including the first and transparent retries.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// Transparent retries among them (never sent, or refused before processing).
    pub fn transparent(&self) -> u32 {
        self.transparent
    }

    /// Attempts that count toward `maxAttempts`.
    pub fn counted(&self) -> u32 {
        self.sent - self.transparent
    }

    /// The attempts behind a response of the layers: its extension, or a single attempt when
    /// it has none (the layers add it only after more than one).
    ///
    /// ```
    /// use tower_retry_hedge::metadata::Attempts;
    ///
    /// let response = http::Response::new(());
    /// assert_eq!(Attempts::of(&response), Attempts::new(1, 0));
    /// ```
    pub fn of<B>(response: &http::Response<B>) -> Attempts {
        response
            .extensions()
            .get::<Attempts>()
            .copied()
            .unwrap_or(Attempts::new(1, 0))
    }
}

/// What one attempt is: a request extension on every attempt after the first (its absence
/// means the first attempt).
///
/// A load balancer under the layers can read it, for example to send a hedge to a backend
/// that the call has not tried yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptInfo {
    /// The attempt's number, 1 for the first.
    pub number: u32,
    /// Whether it was sent as a hedge (in parallel with earlier attempts) rather than after
    /// the previous attempt failed.
    pub hedge: bool,
}

/// An absolute deadline for a call: a request extension the layers honour beside the
/// request's `grpc-timeout` and the method's `timeout` (the earliest of them wins), for
/// callers that track deadlines across several calls.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::metadata::Deadline;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Deadline::after(Duration::from_secs(2)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(tokio::time::Instant);

impl Deadline {
    /// A deadline `timeout` from now (on tokio's clock, so paused-clock tests see it).
    pub fn after(timeout: std::time::Duration) -> Deadline {
        let now = tokio::time::Instant::now();
        Deadline(
            now.checked_add(timeout)
                .unwrap_or(now + std::time::Duration::from_secs(86_400 * 365 * 30)),
        )
    }

    /// A deadline at `at`.
    pub fn at_instant(at: tokio::time::Instant) -> Deadline {
        Deadline(at)
    }

    /// When the call must end.
    pub fn at(&self) -> tokio::time::Instant {
        self.0
    }
}

/// The maximum number of backends a [`TriedBackends`] list keeps, of each kind (names and
/// [`BackendId`]s).
pub(crate) const MAX_TRIED_BACKENDS: usize = 16;

/// A backend as a balancer records it in [`TriedBackends`]: a 64-bit digest of the key under
/// which the balancer knows the endpoint (its `Discover` key).
///
/// Equal keys give equal ids, in every balancer of the process, so an endpoint that is
/// removed and added again under the same key is still the one the call tried. Two different
/// keys give the same id with a chance of about 2⁻⁶⁴ per pair; then a balancer would pass
/// over the second as if it had been tried, never the other way round.
///
/// ```
/// use tower_retry_hedge::metadata::BackendId;
///
/// assert_eq!(BackendId::of("10.0.0.1:443"), BackendId::of("10.0.0.1:443"));
/// assert_ne!(BackendId::of("10.0.0.1:443"), BackendId::of("10.0.0.2:443"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackendId(u64);

impl BackendId {
    /// The id of the endpoint known by `key`.
    pub fn of<K: std::hash::Hash + ?Sized>(key: &K) -> BackendId {
        use std::hash::BuildHasher;
        // A fixed seed: the same key gives the same id in every balancer and every call.
        BackendId(foldhash::quality::FixedState::with_seed(0x7472_6965_645f_6964).hash_one(key))
    }
}

/// The backends a call has already used: a request extension shared by every attempt of the
/// call, in which a load balancer under the layers records the backend it picks for each
/// attempt and reads the ones to avoid.
///
/// gRFC A6 asks that hedges go to distinct backends where possible, and a retry after a
/// failure is better sent elsewhere too. The layers cannot know which backend an attempt
/// reaches, so the list is shared by all attempts of a call (clones share one list):
/// `balance::Balance` (feature `balance`) records a [`BackendId`]
/// per attempt and picks, for a later attempt, an endpoint whose id is not listed yet. A
/// balancer of your own may do the same, or record names ([`record`](Self::record)).
///
/// The layers add it to every call when the table asks for it
/// ([`PoliciesBuilder::track_backends`](crate::policy::PoliciesBuilder::track_backends)), and
/// to hedged calls whose policy does
/// ([`HedgePolicyBuilder::track_backends`](crate::policy::HedgePolicyBuilder::track_backends)). A request that
/// already carries one keeps it for all of its attempts, since the layers copy a request's
/// extensions to every attempt: inserting a fresh `TriedBackends::default()` into each request
/// above the layers turns the record on for any call.
///
/// ```
/// use tower_retry_hedge::metadata::{BackendId, TriedBackends};
///
/// let tried = TriedBackends::default();
/// let seen_by_a_later_hedge = tried.clone();
/// tried.record("10.0.0.1:443");
/// assert!(seen_by_a_later_hedge.contains("10.0.0.1:443"));
/// assert_eq!(seen_by_a_later_hedge.list(), vec!["10.0.0.1:443".to_string()]);
///
/// // What a balancer records: ids, kept apart from the names.
/// tried.record_id(BackendId::of("10.0.0.2:443"));
/// assert!(seen_by_a_later_hedge.contains_id(BackendId::of("10.0.0.2:443")));
/// assert_eq!(seen_by_a_later_hedge.ids(), vec![BackendId::of("10.0.0.2:443")]);
/// assert_eq!(seen_by_a_later_hedge.list().len(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct TriedBackends(std::sync::Arc<std::sync::Mutex<Tried>>);

/// What a [`TriedBackends`] list holds: names recorded by [`TriedBackends::record`] and ids
/// recorded by [`TriedBackends::record_id`], each in order.
#[derive(Debug, Default)]
struct Tried {
    names: Vec<String>,
    ids: Vec<BackendId>,
}

impl TriedBackends {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tried> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a backend by name; past 16 names, further ones are dropped.
    pub fn record(&self, backend: impl Into<String>) {
        let mut tried = self.lock();
        if tried.names.len() < MAX_TRIED_BACKENDS {
            tried.names.push(backend.into());
        }
    }

    /// Whether the call has used this backend, as recorded by name.
    pub fn contains(&self, backend: &str) -> bool {
        self.lock().names.iter().any(|b| b == backend)
    }

    /// The backends recorded by name so far, in order.
    pub fn list(&self) -> Vec<String> {
        self.lock().names.clone()
    }

    /// Records a backend by id; past 16 ids, further ones are dropped.
    pub fn record_id(&self, backend: BackendId) {
        self.lock().push_id(backend);
    }

    /// Whether the call has used this backend, as recorded by id.
    pub fn contains_id(&self, backend: BackendId) -> bool {
        self.lock().ids.contains(&backend)
    }

    /// The backends recorded by id so far, in order.
    pub fn ids(&self) -> Vec<BackendId> {
        self.lock().ids.clone()
    }

    /// Runs `pick` over the ids recorded so far and records the id of what it picked, under
    /// one lock: two hedges of a call picking at once cannot both miss the other's pick.
    #[cfg(feature = "balance")]
    pub(crate) fn pick_and_record<T>(
        &self,
        pick: impl FnOnce(&[BackendId]) -> Option<(T, BackendId)>,
    ) -> Option<T> {
        let mut tried = self.lock();
        let (picked, id) = pick(&tried.ids)?;
        tried.push_id(id);
        Some(picked)
    }
}

impl Tried {
    fn push_id(&mut self, backend: BackendId) {
        if self.ids.len() < MAX_TRIED_BACKENDS {
            self.ids.push(backend);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_are_kept_apart_and_capped_each() {
        let tried = TriedBackends::default();
        for i in 0..MAX_TRIED_BACKENDS + 4 {
            tried.record(format!("backend-{i}"));
            tried.record_id(BackendId::of(&i));
        }
        assert_eq!(tried.list().len(), MAX_TRIED_BACKENDS);
        assert_eq!(tried.ids().len(), MAX_TRIED_BACKENDS);
        assert!(tried.contains_id(BackendId::of(&(MAX_TRIED_BACKENDS - 1))));
        assert!(!tried.contains_id(BackendId::of(&MAX_TRIED_BACKENDS)));
        assert!(!tried.contains("backend-16"));
    }

    #[test]
    fn ids_follow_the_key_not_its_type_name() {
        // The same text as `&str` and `String` hashes alike: a key converted on the way to
        // the balancer still matches.
        assert_eq!(BackendId::of("a"), BackendId::of(&String::from("a")));
        assert_ne!(BackendId::of(&1u32), BackendId::of(&2u32));
    }

    #[cfg(feature = "balance")]
    #[test]
    fn a_pick_is_recorded_under_the_same_lock() {
        let tried = TriedBackends::default();
        tried.record_id(BackendId::of("a"));
        let picked = tried.pick_and_record(|ids| {
            assert_eq!(ids, [BackendId::of("a")]);
            Some(("b", BackendId::of("b")))
        });
        assert_eq!(picked, Some("b"));
        assert_eq!(tried.ids(), [BackendId::of("a"), BackendId::of("b")]);
        // Nothing picked: nothing recorded.
        assert_eq!(tried.pick_and_record(|_| None::<((), BackendId)>), None);
        assert_eq!(tried.ids().len(), 2);
    }
}
