//! Outlier detection: which backends are ejected, and when they come back (gRFC A50, with a
//! run of consecutive failures as Envoy has it). The balancer owns one [`Detector`] and runs
//! it on each `poll_ready`, on tokio's clock: no timer task, so a balancer nobody calls does
//! no work, and a paused clock drives it as it drives the rest.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::health::{Health, HealthRules, IntervalCounts};
use super::{FailurePercentageEjection, OutlierDetection, SuccessRateEjection};
use crate::metadata::BackendId;

/// Why a backend was ejected.
///
/// ```
/// use tower_retry_hedge::balance::EjectionReason;
///
/// assert_eq!(EjectionReason::FailurePercentage.as_str(), "failure_percentage");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EjectionReason {
    /// Its run of consecutive failures reached
    /// [`consecutive_failures`](super::OutlierDetectionBuilder::consecutive_failures).
    ConsecutiveFailures,
    /// Its failure percentage over an interval was above the threshold (gRFC A50).
    FailurePercentage,
    /// Its success rate over an interval was a statistical outlier (gRFC A50).
    SuccessRate,
}

impl EjectionReason {
    /// A short name: `consecutive_failures`, `failure_percentage` or `success_rate`.
    pub fn as_str(self) -> &'static str {
        match self {
            EjectionReason::ConsecutiveFailures => "consecutive_failures",
            EjectionReason::FailurePercentage => "failure_percentage",
            EjectionReason::SuccessRate => "success_rate",
        }
    }
}

impl fmt::Display for EjectionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend out of rotation, as [`Outliers::ejected`] lists it.
///
/// ```
/// use tower_retry_hedge::balance::Outliers;
///
/// fn report(outliers: &Outliers) {
///     for ejection in outliers.ejected() {
///         println!(
///             "{} out since {:?} until {:?} ({}, {:.0} % failed, ejection number {})",
///             ejection.key,
///             ejection.at,
///             ejection.until,
///             ejection.reason,
///             ejection.failure_rate * 100.0,
///             ejection.times,
///         );
///     }
/// }
/// # let _ = report;
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Ejection {
    /// The backend's id in the calls' records.
    pub id: BackendId,
    /// The backend's discovery key, as `Debug` writes it (for `BalancedChannel`, its URI).
    pub key: String,
    /// Why.
    pub reason: EjectionReason,
    /// The share of failures that got it ejected: of its recent answers for a run of
    /// failures, of the interval's for the interval algorithms.
    pub failure_rate: f64,
    /// How many times in a row it was ejected, this one included (the ejection time's
    /// multiplier; it fades by one each interval the backend stays in rotation).
    pub times: u32,
    /// When it was ejected, on tokio's clock.
    pub at: Instant,
    /// When it comes back: at the balancer's first call from then on.
    pub until: Instant,
}

/// A view of a balancer's outlier detection: the backends ejected now, and how many
/// ejections and returns there were. Clones share the view; the balancer updates it when it
/// ejects or brings back a backend.
///
/// ```
/// use tower::discover::ServiceList;
/// use tower::load::{CompleteOnResponse, PendingRequests};
/// use tower_retry_hedge::balance::Balance;
///
/// # type Req = http::Request<String>;
/// let backend = || {
///     let service = tower::service_fn(|_: Req| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     });
///     PendingRequests::new(service, CompleteOnResponse::default())
/// };
/// let balance: Balance<_, Req> = Balance::new(ServiceList::new([backend(), backend()]));
/// let outliers = balance.outliers();
/// assert!(outliers.ejected().is_empty());
/// assert_eq!(outliers.ejections(), 0);
/// ```
#[derive(Clone, Default)]
pub struct Outliers(Arc<View>);

#[derive(Default)]
struct View {
    ejected: Mutex<Vec<Ejection>>,
    ejections: AtomicU64,
    returns: AtomicU64,
}

impl Outliers {
    /// The backends out of rotation now, in the order the balancer learned of them.
    pub fn ejected(&self) -> Vec<Ejection> {
        self.0
            .ejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many ejections there were so far.
    pub fn ejections(&self) -> u64 {
        self.0.ejections.load(Ordering::Relaxed)
    }

    /// How many ejected backends came back so far.
    pub fn returns(&self) -> u64 {
        self.0.returns.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Outliers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outliers")
            .field("ejected", &self.ejected())
            .field("ejections", &self.ejections())
            .field("returns", &self.returns())
            .finish()
    }
}

/// A known backend.
struct KnownBackend {
    id: BackendId,
    key: Arc<str>,
    health: Arc<Health>,
    /// While ejected: the ejection.
    ejection: Option<Ejection>,
    /// gRFC A50's ejection time multiplier: ejections in a row, fading while in rotation.
    times: u32,
}

/// The longest an ejection lasts when the clock cannot represent its end.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

pub(crate) struct Detector {
    config: OutlierDetection,
    shared: Arc<HealthRules>,
    records: Vec<KnownBackend>,
    ejected: usize,
    /// When the interval algorithms run next; unset until the first poll.
    next_tick: Option<Instant>,
    /// Whether the ticks were started (an interval too long for the clock never ticks).
    started: bool,
    /// The earliest return of an ejected backend.
    next_return: Option<Instant>,
    /// A backend's run of failures waits for another backend to do well.
    unvouched: bool,
    /// Tokio's clock at the last poll.
    now: Option<Instant>,
    view: Outliers,
}

impl Detector {
    /// A detector with these settings; `None` when they are disabled.
    pub(crate) fn new(config: OutlierDetection) -> Option<Detector> {
        if !config.enabled {
            return None;
        }
        let shared = Arc::new(HealthRules::new(
            config.consecutive_failures,
            config.failure_half_life,
            config.failure_codes,
        ));
        Some(Detector {
            config,
            shared,
            records: Vec::new(),
            ejected: 0,
            next_tick: None,
            started: false,
            next_return: None,
            unvouched: false,
            now: None,
            view: Outliers::default(),
        })
    }

    pub(crate) fn view(&self) -> &Outliers {
        &self.view
    }

    /// The clock as of the last poll.
    pub(crate) fn now(&self) -> Instant {
        self.now.unwrap_or_else(Instant::now)
    }

    /// Whether recent failures weigh the pick.
    pub(crate) fn weighs_failures(&self) -> bool {
        self.config.weigh_failures
    }

    pub(crate) fn any_ejected(&self) -> bool {
        self.ejected > 0
    }

    /// The record of the backend `id`, made if new; `key` names it in events.
    pub(crate) fn insert(&mut self, id: BackendId, key: impl FnOnce() -> String) -> Arc<Health> {
        if let Some(record) = self.records.iter().find(|r| r.id == id) {
            return Arc::clone(&record.health);
        }
        let health = Arc::new(Health::new(Arc::clone(&self.shared)));
        self.records.push(KnownBackend {
            id,
            key: key().into(),
            health: Arc::clone(&health),
            ejection: None,
            times: 0,
        });
        health
    }

    /// Forgets the backend `id` (discovery removed it, or it failed to get ready).
    pub(crate) fn remove(&mut self, id: BackendId) {
        let Some(index) = self.records.iter().position(|r| r.id == id) else {
            return;
        };
        let record = self.records.remove(index);
        if record.ejection.is_some() {
            self.ejected -= 1;
            self.publish();
        }
    }

    /// Runs what is due at `now`: the interval algorithms, returns, and the ejection of
    /// backends whose run of failures reached the limit.
    pub(crate) fn poll(&mut self, now: Instant, rng: &mut impl Rng) {
        self.now = Some(now);
        if !self.started {
            self.started = true;
            self.next_tick = now.checked_add(self.config.interval);
        }
        if let Some(next) = self.next_tick
            && now >= next
        {
            self.ticks(next, now, rng);
        }
        if let Some(next) = self.next_return
            && now >= next
        {
            self.returns(now);
        }
        if self.shared.take_tripped() || self.unvouched {
            self.trips(now);
        }
    }

    /// Runs the interval algorithms once for the intervals that ended by `now` (the first
    /// ended at `next`): the answers since the last run are judged together, and the "times
    /// ejected" of backends in rotation fade by one per interval.
    fn ticks(&mut self, next: Instant, now: Instant, rng: &mut impl Rng) {
        let interval = self.config.interval.as_nanos();
        let behind = (now - next).as_nanos();
        let intervals = 1 + behind / interval;
        let into_current = Duration::from_nanos((behind % interval) as u64);
        self.next_tick = now.checked_add(self.config.interval - into_current);

        let counts: Vec<IntervalCounts> = self
            .records
            .iter()
            .map(|record| record.health.swap_counts())
            .collect();
        if let Some(success_rate) = self.config.success_rate {
            self.success_rate(success_rate, &counts, now, rng);
        }
        if let Some(failure_percentage) = self.config.failure_percentage {
            self.failure_percentage(failure_percentage, &counts, now, rng);
        }
        let fade = u32::try_from(intervals).unwrap_or(u32::MAX);
        for record in &mut self.records {
            if record.ejection.is_none() {
                record.times = record.times.saturating_sub(fade);
            }
        }
    }

    /// gRFC A50's success-rate algorithm over the interval's `counts`.
    fn success_rate(
        &mut self,
        config: SuccessRateEjection,
        counts: &[IntervalCounts],
        now: Instant,
        rng: &mut impl Rng,
    ) {
        let volume = u64::from(config.request_volume.max(1));
        let judged: Vec<(usize, f64)> = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| c.volume() >= volume)
            .map(|(i, c)| (i, c.successes as f64 / c.volume() as f64))
            .collect();
        if judged.len() < config.minimum_hosts as usize || judged.is_empty() {
            return;
        }
        let n = judged.len() as f64;
        let mean = judged.iter().map(|(_, rate)| rate).sum::<f64>() / n;
        let variance = judged
            .iter()
            .map(|(_, rate)| (rate - mean) * (rate - mean))
            .sum::<f64>()
            / n;
        let threshold = mean - variance.sqrt() * (f64::from(config.stdev_factor) / 1000.0);
        for (index, rate) in judged {
            if self.records[index].ejection.is_some() || rate >= threshold {
                continue;
            }
            if !self.can_eject() {
                self.overflow(index, super::EjectionReason::SuccessRate);
                return;
            }
            if rng.random_range(0..100) < config.enforcement_percentage {
                self.eject(index, super::EjectionReason::SuccessRate, 1.0 - rate, now);
            } else {
                self.not_enforced(super::EjectionReason::SuccessRate);
            }
        }
    }

    /// gRFC A50's failure-percentage algorithm over the interval's `counts`.
    fn failure_percentage(
        &mut self,
        config: FailurePercentageEjection,
        counts: &[IntervalCounts],
        now: Instant,
        rng: &mut impl Rng,
    ) {
        if self.records.len() < config.minimum_hosts as usize {
            return;
        }
        let volume = u64::from(config.request_volume.max(1));
        for (index, count) in counts.iter().enumerate() {
            if self.records[index].ejection.is_some() || count.volume() < volume {
                continue;
            }
            if count.failures * 100 <= u64::from(config.threshold) * count.volume() {
                continue;
            }
            if !self.can_eject() {
                self.overflow(index, super::EjectionReason::FailurePercentage);
                return;
            }
            if rng.random_range(0..100) < config.enforcement_percentage {
                let rate = count.failures as f64 / count.volume() as f64;
                self.eject(index, super::EjectionReason::FailurePercentage, rate, now);
            } else {
                self.not_enforced(super::EjectionReason::FailurePercentage);
            }
        }
    }

    /// Ejects the backends whose run of failures reached the limit, if another backend in
    /// rotation does well, its recent successes outnumbering its failures (a run of failures
    /// everywhere is not an outlier). A run no backend vouches for is looked at again at each
    /// poll, until one does or a success ends the run.
    fn trips(&mut self, now: Instant) {
        self.unvouched = false;
        for index in 0..self.records.len() {
            let record = &self.records[index];
            if record.ejection.is_some() || !record.health.is_tripped() {
                continue;
            }
            let vouched = self.records.iter().enumerate().any(|(other, record)| {
                other != index && record.ejection.is_none() && record.health.does_well(now)
            });
            if !vouched {
                tracing::trace!(
                    backend = %record.key,
                    id = ?record.id,
                    failures = record.health.consecutive_failures(),
                    "balance: failures in a row, but no backend in rotation does well; not ejected"
                );
                self.unvouched = true;
                continue;
            }
            if !self.can_eject() {
                self.overflow(index, super::EjectionReason::ConsecutiveFailures);
                return;
            }
            let rate = self.records[index].health.failure_ratio(now);
            self.eject(index, super::EjectionReason::ConsecutiveFailures, rate, now);
        }
    }

    /// Whether one more backend may be ejected: never every backend; one always; more while
    /// the share ejected stays within `max_ejection_percent`.
    fn can_eject(&self) -> bool {
        let total = self.records.len() as u64;
        let ejected = self.ejected as u64;
        if ejected + 1 >= total {
            return false;
        }
        ejected == 0 || (ejected + 1) * 100 <= u64::from(self.config.max_ejection_percent) * total
    }

    fn eject(
        &mut self,
        index: usize,
        reason: super::EjectionReason,
        failure_rate: f64,
        now: Instant,
    ) {
        let record = &mut self.records[index];
        record.times = record.times.saturating_add(1);
        let time = self.config.ejection_time(record.times);
        let until = now
            .checked_add(time)
            .or_else(|| now.checked_add(FAR))
            .unwrap_or(now);
        record.health.eject();
        record.ejection = Some(Ejection {
            id: record.id,
            key: record.key.to_string(),
            reason,
            failure_rate,
            times: record.times,
            at: now,
            until,
        });
        tracing::warn!(
            backend = %record.key,
            id = ?record.id,
            reason = reason.as_str(),
            failure_rate,
            ejection_time = ?time,
            times = record.times,
            "balance: backend ejected"
        );
        self.ejected += 1;
        self.next_return = Some(self.next_return.map_or(until, |next| next.min(until)));
        self.view.0.ejections.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "opentelemetry")]
        if let Some(metrics) = &self.config.metrics {
            metrics.ejected(reason);
        }
        self.publish();
    }

    /// Brings back the backends whose ejection is over.
    fn returns(&mut self, now: Instant) {
        self.next_return = None;
        let mut returned = false;
        for record in &mut self.records {
            let Some(ejection) = &record.ejection else {
                continue;
            };
            if now < ejection.until {
                let until = ejection.until;
                self.next_return = Some(self.next_return.map_or(until, |next| next.min(until)));
                continue;
            }
            tracing::info!(
                backend = %record.key,
                id = ?record.id,
                ejected_for = ?(now - ejection.at),
                times = record.times,
                "balance: backend back in rotation"
            );
            record.ejection = None;
            record.health.un_eject(now);
            self.ejected -= 1;
            self.view.0.returns.fetch_add(1, Ordering::Relaxed);
            returned = true;
        }
        if returned {
            self.publish();
        }
    }

    /// An outlier the draw against the enforcement percentage left in rotation.
    fn not_enforced(&self, _reason: super::EjectionReason) {
        #[cfg(feature = "opentelemetry")]
        if let Some(metrics) = &self.config.metrics {
            metrics.unenforced(_reason, super::metrics::Unenforced::EnforcementPercentage);
        }
    }

    fn overflow(&self, index: usize, reason: super::EjectionReason) {
        let record = &self.records[index];
        tracing::debug!(
            backend = %record.key,
            id = ?record.id,
            reason = reason.as_str(),
            ejected = self.ejected,
            backends = self.records.len(),
            "balance: outlier not ejected: the most backends that may be are"
        );
        #[cfg(feature = "opentelemetry")]
        if let Some(metrics) = &self.config.metrics {
            metrics.unenforced(reason, super::metrics::Unenforced::MaxEjectionOverflow);
        }
    }

    /// Updates the view of the ejected backends.
    fn publish(&self) {
        let ejected: Vec<Ejection> = self
            .records
            .iter()
            .filter_map(|record| record.ejection.clone())
            .collect();
        *self
            .view
            .0
            .ejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = ejected;
    }
}

impl fmt::Debug for Detector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Detector")
            .field("backends", &self.records.len())
            .field("ejected", &self.ejected)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::outlier::health::Score;
    use crate::balance::{EjectionReason, FailurePercentageEjection, SuccessRateEjection};
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A detector over backends `0..n`, polled once at `start` (which starts its ticks).
    struct Bench {
        detector: Detector,
        healths: Vec<Arc<Health>>,
        rng: SmallRng,
    }

    impl Bench {
        fn new(config: OutlierDetection, n: usize) -> Bench {
            let mut detector = Detector::new(config).expect("enabled");
            let healths = (0..n)
                .map(|i| detector.insert(BackendId::of(&i), || format!("backend-{i}")))
                .collect();
            let mut bench = Bench {
                detector,
                healths,
                rng: SmallRng::seed_from_u64(1),
            };
            bench.poll();
            bench
        }

        fn poll(&mut self) {
            self.detector.poll(Instant::now(), &mut self.rng);
        }

        fn answer(&self, backend: usize, successes: u32, failures: u32) {
            for _ in 0..successes {
                self.healths[backend].record(Score::Success);
            }
            for _ in 0..failures {
                self.healths[backend].record(Score::Failure);
            }
        }

        fn ejected(&self) -> Vec<usize> {
            (0..self.healths.len())
                .filter(|&i| self.healths[i].is_ejected())
                .collect()
        }

        fn times(&self, backend: usize) -> u32 {
            self.detector.records[backend].times
        }
    }

    /// Only failure percentage, A50-style, over one-second intervals.
    fn failure_percentage(minimum_hosts: u32) -> OutlierDetection {
        OutlierDetection::builder()
            .interval(secs(1))
            .base_ejection_time(secs(10))
            .max_ejection_time(secs(25))
            .consecutive_failures(None)
            .failure_percentage(Some(FailurePercentageEjection {
                threshold: 50,
                enforcement_percentage: 100,
                minimum_hosts,
                request_volume: 10,
            }))
            .build()
            .unwrap()
    }

    async fn advance(by: Duration) {
        tokio::time::advance(by).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_interval_algorithms_run_when_an_interval_ends() {
        let mut bench = Bench::new(failure_percentage(3), 3);
        bench.answer(0, 0, 10);
        bench.answer(1, 10, 0);
        bench.answer(2, 10, 0);
        // Within the interval: nothing judged yet.
        advance(Duration::from_millis(999)).await;
        bench.poll();
        assert!(bench.ejected().is_empty());
        advance(Duration::from_millis(1)).await;
        bench.poll();
        assert_eq!(bench.ejected(), [0]);
        let ejection = &bench.detector.view().ejected()[0];
        assert_eq!(ejection.reason, EjectionReason::FailurePercentage);
        assert_eq!(ejection.failure_rate, 1.0);
        assert_eq!(ejection.times, 1);
        assert_eq!(ejection.key, "backend-0");
        assert_eq!(ejection.until - ejection.at, secs(10));
        assert_eq!(bench.detector.view().ejections(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn below_the_volume_or_the_minimum_hosts_nobody_is_judged() {
        let mut bench = Bench::new(failure_percentage(3), 3);
        bench.answer(0, 0, 9);
        advance(secs(1)).await;
        bench.poll();
        assert!(bench.ejected().is_empty(), "9 answers are below the volume");
        let mut bench = Bench::new(failure_percentage(4), 3);
        bench.answer(0, 0, 50);
        advance(secs(1)).await;
        bench.poll();
        assert!(
            bench.ejected().is_empty(),
            "3 backends are below the minimum"
        );
        // The threshold is exceeded, not met: 50 % of failures is not above 50 %.
        let mut bench = Bench::new(failure_percentage(3), 3);
        bench.answer(0, 10, 10);
        advance(secs(1)).await;
        bench.poll();
        assert!(bench.ejected().is_empty());
        bench.answer(0, 10, 11);
        advance(secs(1)).await;
        bench.poll();
        assert_eq!(bench.ejected(), [0]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_ejection_time_multiplies_is_capped_and_fades() {
        let mut bench = Bench::new(failure_percentage(3), 3);
        let mut lengths = Vec::new();
        for _ in 0..4 {
            bench.answer(0, 0, 10);
            // Poll each second until it is ejected, then until it is back.
            loop {
                advance(secs(1)).await;
                bench.poll();
                if bench.healths[0].is_ejected() {
                    break;
                }
            }
            let ejected_at = Instant::now();
            while bench.healths[0].is_ejected() {
                advance(secs(1)).await;
                bench.poll();
            }
            lengths.push((Instant::now() - ejected_at).as_secs());
        }
        // 10 s × 1, × 2, then the 25 s cap; it fails again at once each time it is back.
        assert_eq!(lengths, [10, 20, 25, 25]);
        assert_eq!(bench.times(0), 4);
        // Times ejected fades by one per interval in rotation (A50): 4 intervals to 0.
        for expected in [3, 2, 1, 0, 0] {
            advance(secs(1)).await;
            bench.poll();
            assert_eq!(bench.times(0), expected);
        }
        // So the next ejection is a first one again.
        bench.answer(0, 0, 10);
        advance(secs(1)).await;
        bench.poll();
        assert_eq!(
            bench.detector.view().ejected()[0].until - Instant::now(),
            secs(10)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn intervals_missed_while_idle_fade_the_multiplier_for_each() {
        let mut bench = Bench::new(failure_percentage(3), 3);
        bench.answer(0, 0, 10);
        advance(secs(1)).await;
        bench.poll();
        advance(secs(10)).await;
        bench.poll();
        assert!(bench.ejected().is_empty());
        assert_eq!(bench.times(0), 1, "back, with one interval since");
        // Nobody calls for a minute: 60 intervals, each fading it (down to 0).
        advance(secs(60)).await;
        bench.poll();
        assert_eq!(bench.times(0), 0);
        // The ticks keep their phase.
        assert_eq!(bench.detector.next_tick, Some(Instant::now() + secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_max_share_is_kept_but_one_may_always_be_ejected_and_never_all() {
        // 10 % of 3 backends is less than one: one is ejected anyway.
        let mut bench = Bench::new(failure_percentage(3), 3);
        bench.answer(0, 0, 10);
        bench.answer(1, 0, 10);
        advance(secs(1)).await;
        bench.poll();
        assert_eq!(bench.ejected(), [0]);
        // 50 % of 4: two.
        let config = OutlierDetection::builder()
            .max_ejection_percent(50)
            .consecutive_failures(None)
            .failure_percentage(Some(FailurePercentageEjection {
                minimum_hosts: 1,
                request_volume: 10,
                ..Default::default()
            }))
            .build()
            .unwrap();
        let mut bench = Bench::new(config.clone(), 4);
        for backend in 0..4 {
            bench.answer(backend, 0, 10);
        }
        advance(secs(1)).await;
        bench.poll();
        assert_eq!(bench.ejected(), [0, 1]);
        // 100 % of 3, all failing: never all, two at most.
        let config = config
            .to_builder()
            .max_ejection_percent(100)
            .build()
            .unwrap();
        let mut bench = Bench::new(config.clone(), 3);
        for backend in 0..3 {
            bench.answer(backend, 0, 10);
        }
        advance(secs(1)).await;
        bench.poll();
        assert_eq!(bench.ejected(), [0, 1]);
        // A lone backend is never ejected.
        let mut bench = Bench::new(config, 1);
        bench.answer(0, 0, 100);
        advance(secs(1)).await;
        bench.poll();
        assert!(bench.ejected().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn success_rate_ejects_the_statistical_outlier() {
        let config = OutlierDetection::builder()
            .consecutive_failures(None)
            .failure_percentage(None)
            .max_ejection_percent(50)
            .success_rate(Some(SuccessRateEjection {
                minimum_hosts: 5,
                request_volume: 100,
                ..Default::default()
            }))
            .build()
            .unwrap();
        let mut bench = Bench::new(config.clone(), 6);
        // Five at 99-100 %, one at 80 %: mean 0.963, stdev 0.073, threshold 0.824.
        for backend in 0..5 {
            bench.answer(backend, 100 - backend as u32 % 2, backend as u32 % 2);
        }
        bench.answer(5, 80, 20);
        advance(secs(1)).await;
        bench.poll();
        assert_eq!(bench.ejected(), [5]);
        assert_eq!(
            bench.detector.view().ejected()[0].reason,
            EjectionReason::SuccessRate
        );
        // Everyone equally bad: no outlier.
        let mut bench = Bench::new(config.clone(), 6);
        for backend in 0..6 {
            bench.answer(backend, 50, 50);
        }
        advance(secs(1)).await;
        bench.poll();
        assert!(bench.ejected().is_empty());
        // Fewer than five backends with the volume: not judged.
        let mut bench = Bench::new(config, 6);
        for backend in 0..3 {
            bench.answer(backend, 100, 0);
        }
        bench.answer(5, 0, 100);
        advance(secs(1)).await;
        bench.poll();
        assert!(bench.ejected().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn enforcement_is_a_chance() {
        let config = failure_percentage(3)
            .to_builder()
            .failure_percentage(Some(FailurePercentageEjection {
                threshold: 50,
                enforcement_percentage: 0,
                minimum_hosts: 3,
                request_volume: 10,
            }))
            .build()
            .unwrap();
        let mut bench = Bench::new(config, 3);
        for _ in 0..20 {
            bench.answer(0, 0, 10);
            advance(secs(1)).await;
            bench.poll();
        }
        assert!(bench.ejected().is_empty());
    }

    fn consecutive(limit: u32) -> OutlierDetection {
        OutlierDetection::builder()
            .consecutive_failures(Some(limit))
            .failure_percentage(None)
            .base_ejection_time(secs(30))
            .build()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_of_failures_ejects_at_once_and_the_backend_returns_after_its_time() {
        let mut bench = Bench::new(consecutive(5), 3);
        bench.answer(1, 5, 0);
        bench.answer(0, 0, 4);
        bench.answer(0, 1, 0);
        bench.answer(0, 0, 4);
        bench.poll();
        assert!(bench.ejected().is_empty(), "a success broke the run");
        bench.answer(0, 0, 1);
        bench.poll();
        assert_eq!(bench.ejected(), [0]);
        let ejection = &bench.detector.view().ejected()[0];
        assert_eq!(ejection.reason, EjectionReason::ConsecutiveFailures);
        // Back after exactly its ejection time, at the first poll from then on.
        advance(secs(30) - Duration::from_millis(1)).await;
        bench.poll();
        assert_eq!(bench.ejected(), [0]);
        advance(Duration::from_millis(1)).await;
        bench.poll();
        assert!(bench.ejected().is_empty());
        assert_eq!(bench.detector.view().returns(), 1);
        // On probation: it weighs a quarter until it answers well.
        assert_eq!(bench.healths[0].weight(Instant::now()), 0.25);
        // Failing again, it is ejected again, for twice as long.
        bench.answer(0, 0, 5);
        bench.poll();
        let ejection = &bench.detector.view().ejected()[0];
        assert_eq!(
            (ejection.times, ejection.until - ejection.at),
            (2, secs(60))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_of_failures_everywhere_ejects_nobody() {
        let mut bench = Bench::new(consecutive(5), 3);
        for _ in 0..10 {
            for backend in 0..3 {
                bench.answer(backend, 0, 1);
            }
            bench.poll();
        }
        assert!(bench.ejected().is_empty());
        // One backend recovers: now the others' runs are outliers, and one is ejected at the
        // next poll (the share allows one of three).
        bench.answer(2, 20, 0);
        bench.poll();
        assert_eq!(bench.ejected(), [0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_backend_leaves_its_ejection_and_an_insert_keeps_a_known_record() {
        let mut bench = Bench::new(consecutive(1), 3);
        bench.answer(1, 1, 0);
        bench.answer(0, 0, 1);
        bench.poll();
        assert_eq!(bench.ejected(), [0]);
        // The same key again keeps its record, ejection and all.
        let again = bench
            .detector
            .insert(BackendId::of(&0usize), || unreachable!());
        assert!(Arc::ptr_eq(&again, &bench.healths[0]));
        bench.detector.remove(BackendId::of(&0usize));
        assert!(bench.detector.view().ejected().is_empty());
        assert!(!bench.detector.any_ejected());
        // Two backends left: one may be ejected.
        bench.answer(2, 0, 1);
        bench.poll();
        assert_eq!(bench.detector.view().ejected().len(), 1);
    }

    #[test]
    fn disabled_makes_no_detector() {
        assert!(Detector::new(OutlierDetection::disabled()).is_none());
    }
}
