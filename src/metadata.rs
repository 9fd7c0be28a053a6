//! Attempt metadata: what the layers tell the server, the client and the balancer.
//!
//! - Requests: every attempt after the first carries `grpc-previous-rpc-attempts: N` (gRPC
//!   requests), and gRPC attempts carry the call's *remaining* time in `grpc-timeout`.
//!   Every attempt after the first carries an [`AttemptInfo`] extension (the first carries
//!   none, so the success path allocates nothing for it). With
//!   [`track_backends`](crate::policy::HedgePolicyBuilder::track_backends), every attempt of
//!   a hedged call carries a shared [`TriedBackends`] list for the load balancer.
//! - Responses: a call that made more than one attempt returns an [`Attempts`] extension
//!   and, for gRPC, `grpc-previous-rpc-attempts` in the response headers (tonic exposes them
//!   as response metadata). Like that header, the extension is absent after a single attempt,
//!   which keeps the success path free of allocations; [`Attempts::of`] reads both cases.
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
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

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

    /// The attempts behind an error of the layers: an [`Attempted`](crate::error::Attempted)
    /// error's, or for a `tonic::Status`, its `grpc-previous-rpc-attempts` metadata (plus
    /// one); a single attempt otherwise (the layers mark only calls of several attempts).
    pub fn of_error(error: &(dyn std::error::Error + 'static)) -> Attempts {
        if let Some(attempted) = error.downcast_ref::<crate::error::Attempted>() {
            return attempted.attempts();
        }
        #[cfg(feature = "tonic")]
        if let Some(status) = error.downcast_ref::<tonic::Status>()
            && let Some(previous) = status
                .metadata()
                .get(GRPC_PREVIOUS_RPC_ATTEMPTS)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u32>().ok())
        {
            return Attempts::new(previous.saturating_add(1), 0);
        }
        Attempts::new(1, 0)
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

/// The maximum number of backends a [`TriedBackends`] list keeps.
pub const MAX_TRIED_BACKENDS: usize = 16;

/// The backends a hedged call has already used: a request extension on every attempt of a
/// hedged call whose policy asks for it
/// ([`track_backends`](crate::policy::HedgePolicyBuilder::track_backends)).
///
/// gRFC A6 asks that hedges go to distinct backends where possible. The layer cannot know
/// which backend an attempt reaches, so the list is shared by all attempts of a call: a load
/// balancer under the layer records the backend it picks for each attempt, and avoids the
/// ones already listed when it picks for a later hedge.
///
/// ```
/// use tower_retry_hedge::metadata::TriedBackends;
///
/// let tried = TriedBackends::default();
/// let seen_by_a_later_hedge = tried.clone();
/// tried.record("10.0.0.1:443");
/// assert!(seen_by_a_later_hedge.contains("10.0.0.1:443"));
/// assert_eq!(seen_by_a_later_hedge.list(), vec!["10.0.0.1:443".to_string()]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct TriedBackends(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl TriedBackends {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a backend; past [`MAX_TRIED_BACKENDS`] entries, further ones are dropped.
    pub fn record(&self, backend: impl Into<String>) {
        let mut list = self.lock();
        if list.len() < MAX_TRIED_BACKENDS {
            list.push(backend.into());
        }
    }

    /// Whether the call has used this backend.
    pub fn contains(&self, backend: &str) -> bool {
        self.lock().iter().any(|b| b == backend)
    }

    /// The backends used so far, in order.
    pub fn list(&self) -> Vec<String> {
        self.lock().clone()
    }
}
