//! Per-method retry statistics, as gRFC A6 defines them.
//!
//! For each method, three figures: the retry attempts made, the retry attempts that failed,
//! and a histogram in which the k-th retry of a call lands in exactly one bucket of
//! `>=1, >=2, >=3, >=4, >=5, >=10, >=100, >=1000`. For hedged calls the first attempt is the
//! original and every later hedge counts as a retry.
//!
//! The success path of a call that needs no retry touches none of this: the counters are
//! looked up only when a retry is sent.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use std::time::Duration;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_retry_hedge::backoff::Constant;
//! use tower_retry_hedge::classify::{Code, GrpcCodes};
//! use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy};
//!
//! let policy = RetryPolicy::builder()
//!     .max_attempts(3)
//!     .backoff(Constant::new(Duration::from_millis(1)))
//!     .retryable(GrpcCodes::from([Code::Unavailable]))
//!     .build()?;
//! let policies = Policies::builder().method("helloworld.Greeter/SayHello", policy).build();
//!
//! // A server that answers UNAVAILABLE twice, then OK.
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let server = service_fn(move |_: http::Request<Full<Bytes>>| {
//!     let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     let status = if n < 2 { "14" } else { "0" };
//!     async move {
//!         let response = http::Response::builder()
//!             .header("content-type", "application/grpc")
//!             .header("grpc-status", status)
//!             .body(http_body_util::Empty::<Bytes>::new())?;
//!         Ok::<_, http::Error>(response)
//!     }
//! });
//! let request = http::Request::post("/helloworld.Greeter/SayHello")
//!     .header("content-type", "application/grpc")
//!     .body(Full::new(Bytes::new()))?;
//! RetryLayer::new(policies.clone()).layer(server).oneshot(request).await?;
//!
//! let snapshot = policies.stats().snapshot();
//! let greeter = &snapshot.methods["/helloworld.Greeter/SayHello"];
//! assert_eq!(greeter.retry_attempts, 2);
//! assert_eq!(greeter.retry_failures, 1);
//! assert_eq!(greeter.histogram, [1, 1, 0, 0, 0, 0, 0, 0]);
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// What one call did beyond its first attempt, for gRFC A96's per-call metrics.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CallCounts {
    /// Counted attempts after the first that were not hedges.
    pub(crate) retries: u32,
    /// Counted attempts sent while earlier ones might still be in flight.
    pub(crate) hedges: u32,
    pub(crate) transparent: u32,
    /// The time no attempt was in flight before a later one was sent.
    pub(crate) delay: std::time::Duration,
    /// Hedges not sent because the policy's hedge budget was spent.
    pub(crate) hedges_over_budget: u32,
}

/// What a call did that its method's statistics count, not yet added to them: the engine
/// keeps these as it decides, and a driver adds them with [`MethodStats::add`], so that both
/// drivers count by the same rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Records {
    /// Retry attempts sent (hedges after the first included), by histogram bucket.
    retries: [u32; 8],
    /// Retry attempts that failed (A6: "retry attempts which failed").
    retry_failures: u32,
    /// Hedges not sent because the policy's hedge budget was spent.
    hedges_over_budget: u32,
}

impl Records {
    /// The `k`-th retry of the call (1 for the first retry) was sent.
    pub(crate) fn retry(&mut self, k: u32) {
        self.retries[bucket(k)] += 1;
    }

    /// A retry attempt failed.
    pub(crate) fn retry_failure(&mut self) {
        self.retry_failures += 1;
    }

    /// A hedge was not sent: its budget was spent.
    pub(crate) fn hedge_over_budget(&mut self) {
        self.hedges_over_budget += 1;
    }

    pub(crate) fn is_empty(&self) -> bool {
        *self == Records::default()
    }
}

/// Distinct methods tracked before further ones share one overflow entry, so a client that
/// sees arbitrary paths cannot grow the table without bound.
pub(crate) const MAX_METHODS: usize = 1024;

/// The key under which methods past [`MAX_METHODS`] are counted.
pub(crate) const OVERFLOW_KEY: &str = "(other)";

/// The index of the histogram bucket for the `k`-th retry (`k >= 1`).
fn bucket(k: u32) -> usize {
    MethodSnapshot::HISTOGRAM_BOUNDS
        .iter()
        .rposition(|&bound| k >= bound)
        .unwrap_or(0)
}

/// Counters of one method. Updated with relaxed atomics: each counter is exact, and a
/// snapshot taken while calls run may see one counter a step ahead of another.
#[derive(Debug, Default)]
pub(crate) struct MethodStats {
    retry_attempts: AtomicU64,
    retry_failures: AtomicU64,
    histogram: [AtomicU64; 8],
    hedges_over_budget: AtomicU64,
    attempts_let_finish: AtomicU64,
    resets_over_limit: AtomicU64,
    let_finish_cut_short: AtomicU64,
    reset_guard_failures: AtomicU64,
}

impl MethodStats {
    /// Adds what a call did, as its engine recorded it.
    pub(crate) fn add(&self, records: &Records) {
        let add = |counter: &AtomicU64, n: u32| {
            if n > 0 {
                counter.fetch_add(u64::from(n), Ordering::Relaxed);
            }
        };
        add(&self.retry_attempts, records.retries.iter().sum());
        for (counter, &n) in self.histogram.iter().zip(&records.retries) {
            add(counter, n);
        }
        add(&self.retry_failures, records.retry_failures);
        add(&self.hedges_over_budget, records.hedges_over_budget);
    }

    /// Records an attempt the call no longer needed that was let finish.
    pub(crate) fn record_let_finish(&self) {
        self.attempts_let_finish.fetch_add(1, Ordering::Relaxed);
    }

    /// Records an attempt the call no longer needed that was reset over the table's limit.
    pub(crate) fn record_reset_over_limit(&self) {
        self.resets_over_limit.fetch_add(1, Ordering::Relaxed);
    }

    /// Records that an attempt let finish ran past its bounds and was reset after all.
    pub(crate) fn record_finish_cut_short(&self) {
        self.let_finish_cut_short.fetch_add(1, Ordering::Relaxed);
    }

    /// Records that an attempt failed because an HTTP/2 reset guard closed its connection.
    pub(crate) fn record_reset_guard_failure(&self) {
        self.reset_guard_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The current values.
    pub(crate) fn snapshot(&self) -> MethodSnapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MethodSnapshot {
            retry_attempts: load(&self.retry_attempts),
            retry_failures: load(&self.retry_failures),
            histogram: std::array::from_fn(|i| load(&self.histogram[i])),
            hedges_over_budget: load(&self.hedges_over_budget),
            attempts_let_finish: load(&self.attempts_let_finish),
            resets_over_limit: load(&self.resets_over_limit),
            let_finish_cut_short: load(&self.let_finish_cut_short),
            reset_guard_failures: load(&self.reset_guard_failures),
        }
    }
}

/// The figures of one method at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MethodSnapshot {
    /// Retry attempts made (hedges after the first count here).
    pub retry_attempts: u64,
    /// Retry attempts that did not succeed.
    pub retry_failures: u64,
    /// Retry attempts by bucket; bucket `i` counts the k-th retries with
    /// `HISTOGRAM_BOUNDS[i] <= k < HISTOGRAM_BOUNDS[i + 1]`
    /// ([`HISTOGRAM_BOUNDS`](Self::HISTOGRAM_BOUNDS)).
    pub histogram: [u64; 8],
    /// Hedges not sent because the policy's hedge budget was spent (beyond A6).
    pub hedges_over_budget: u64,
    /// Attempts the call no longer needed (hedges that lost, attempts cut off or past the
    /// deadline) that were let finish, their answers dropped, instead of having their
    /// HTTP/2 streams reset: the table's rate of resets was reached (see
    /// [`PoliciesBuilder::resets_per_second`](crate::policy::PoliciesBuilder::resets_per_second)).
    pub attempts_let_finish: u64,
    /// Attempts no longer needed that were reset although the table's rate of resets was
    /// reached: they could not be let finish (256 were already, their request could not be
    /// sent whole, or no tokio runtime was there to run them).
    pub resets_over_limit: u64,
    /// Attempts let finish that ran past their bounds (1 MiB of answer, 10 s, or 1 s past
    /// the call's deadline) and were reset after all; each is counted in
    /// [`attempts_let_finish`](Self::attempts_let_finish) too.
    pub let_finish_cut_short: u64,
    /// Attempts that failed because an HTTP/2 rapid-reset guard closed their connection
    /// (`too_many_internal_resets` on the client, `too_many_resets` from the server); each
    /// time, a `WARN` event names the setting.
    pub reset_guard_failures: u64,
}

impl MethodSnapshot {
    /// The lower bounds of the [`histogram`](Self::histogram)'s buckets: the first, second,
    /// third, fourth and fifth retry each have their own; then 5–9, 10–99, 100–999 and
    /// 1000 on.
    pub const HISTOGRAM_BOUNDS: [u32; 8] = [1, 2, 3, 4, 5, 10, 100, 1000];
}

/// All methods' figures at one moment, by method path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Figures by method path (for gRPC, `/package.Service/Method`).
    pub methods: BTreeMap<String, MethodSnapshot>,
}

/// The statistics of every method seen by the layers that share it. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    methods: Arc<RwLock<HashMap<Box<str>, Arc<MethodStats>>>>,
}

impl Stats {
    /// The counters of `path`, created on first use.
    pub(crate) fn method(&self, path: &str) -> Arc<MethodStats> {
        // A poisoned lock only means another thread panicked while inserting: the map is
        // still a valid map, so keep counting.
        if let Some(found) = self
            .methods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
        {
            return found.clone();
        }
        let mut methods = self.methods.write().unwrap_or_else(|e| e.into_inner());
        let key = if methods.len() >= MAX_METHODS && !methods.contains_key(path) {
            OVERFLOW_KEY
        } else {
            path
        };
        methods.entry(key.into()).or_default().clone()
    }

    /// A copy of every method's figures.
    pub fn snapshot(&self) -> StatsSnapshot {
        let methods = self.methods.read().unwrap_or_else(|e| e.into_inner());
        StatsSnapshot {
            methods: methods
                .iter()
                .map(|(path, stats)| (path.to_string(), stats.snapshot()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_a6() {
        let expect = [
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 3),
            (5, 4),
            (9, 4),
            (10, 5),
            (99, 5),
            (100, 6),
            (999, 6),
            (1000, 7),
            (u32::MAX, 7),
        ];
        for (k, b) in expect {
            assert_eq!(bucket(k), b, "k = {k}");
        }
    }

    #[test]
    fn records_add_up_by_bucket() {
        let stats = MethodStats::default();
        let mut records = Records::default();
        for k in [1, 2, 2, 10] {
            records.retry(k);
        }
        records.retry_failure();
        records.hedge_over_budget();
        records.hedge_over_budget();
        stats.add(&records);
        stats.add(&records);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.retry_attempts, 8);
        assert_eq!(snapshot.retry_failures, 2);
        assert_eq!(snapshot.hedges_over_budget, 4);
        assert_eq!(snapshot.histogram[..6], [2, 4, 0, 0, 0, 2]);
        assert!(Records::default().is_empty() && !records.is_empty());
    }

    #[test]
    fn table_is_bounded() {
        let stats = Stats::default();
        let mut one_retry = Records::default();
        one_retry.retry(1);
        for i in 0..(MAX_METHODS + 10) {
            stats.method(&format!("/s/m{i}")).add(&one_retry);
        }
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.methods.len(), MAX_METHODS + 1);
        assert_eq!(snapshot.methods[OVERFLOW_KEY].retry_attempts, 10);
    }
}
