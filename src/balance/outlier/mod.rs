//! The balancer's outlier detection (gRFC A50), apart from the balancer:
//!
//! - the settings ([`OutlierDetection`]): A50's knobs, in code or from the JSON of gRPC's
//!   `outlier_detection_experimental` policy (read by the `config` module, with the service
//!   config's readers and errors), and the balancer's own (a run of consecutive failures, how
//!   fast failures fade, which codes fail);
//! - `health`: what each backend's answers say, read as the layers read them;
//! - `detector`: which backends are ejected, and when they come back;
//! - `metrics`: the ejections on OpenTelemetry instruments.
//!
//! The balancer sees a narrow seam: it makes a [`Detector`] from the settings, gives each
//! backend a [`Health`] that its attempts record into, runs the detector on `poll_ready`, and
//! asks it which backends may be picked.

use std::fmt;
use std::time::Duration;

use crate::classify::{Code, GrpcCodes};
use crate::error::BuildError;

mod detector;
pub(super) mod health;
#[cfg(feature = "opentelemetry")]
mod metrics;

pub(super) use self::detector::Detector;
pub use self::detector::{Ejection, EjectionReason, Outliers};
pub(super) use self::health::Health;
#[cfg(feature = "opentelemetry")]
pub use self::metrics::OutlierMetrics;

/// The outlier detection of a [`Balance`](super::Balance) or
/// [`BalancedChannel`](super::BalancedChannel): which backends it ejects, for how long, and
/// how recent failures weigh the choice between two backends. See the
/// [module docs](super#outlier-detection).
///
/// [`OutlierDetection::default()`] is what a balancer uses unless told otherwise:
///
/// | knob | default | gRFC A50's default |
/// |---|---|---|
/// | [`interval`](OutlierDetectionBuilder::interval) | 1 s | 10 s |
/// | [`base_ejection_time`](OutlierDetectionBuilder::base_ejection_time) | 30 s | 30 s |
/// | [`max_ejection_time`](OutlierDetectionBuilder::max_ejection_time) | 300 s | 300 s |
/// | [`max_ejection_percent`](OutlierDetectionBuilder::max_ejection_percent) | 10 (at least one backend) | 10 |
/// | [`consecutive_failures`](OutlierDetectionBuilder::consecutive_failures) | 5 | (not in A50) |
/// | [`failure_percentage`](OutlierDetectionBuilder::failure_percentage) | threshold 85, enforcement 100, minimum hosts 3, request volume 10 | off (when on: 85, 100, 5, 50) |
/// | [`success_rate`](OutlierDetectionBuilder::success_rate) | off | off (when on: stdev factor 1900, 100, 5, 100) |
/// | [`failure_half_life`](OutlierDetectionBuilder::failure_half_life) | 2 s | (not in A50) |
/// | [`failure_codes`](OutlierDetectionBuilder::failure_codes) | the codes whose HTTP mapping is a 5xx or 429 | (A50: every code but `OK`) |
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::balance::{FailurePercentageEjection, OutlierDetection};
///
/// // The defaults.
/// let defaults = OutlierDetection::default();
/// assert_eq!(defaults.interval(), Duration::from_secs(1));
/// assert_eq!(defaults.consecutive_failures(), Some(5));
///
/// // In code.
/// let custom = OutlierDetection::builder()
///     .interval(Duration::from_secs(10))
///     .base_ejection_time(Duration::from_secs(10))
///     .max_ejection_percent(50)
///     .failure_percentage(Some(FailurePercentageEjection { threshold: 50, ..Default::default() }))
///     .build()?;
/// assert_eq!(custom.max_ejection_percent(), 50);
///
/// // From gRPC's load-balancing config.
/// let from_json = OutlierDetection::from_json(
///     r#"{"interval": "10s", "failurePercentageEjection": {"threshold": 90}}"#,
/// )?;
/// assert_eq!(from_json.failure_percentage().map(|f| f.threshold), Some(90));
///
/// // None at all.
/// assert!(!OutlierDetection::disabled().is_enabled());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct OutlierDetection {
    pub(crate) enabled: bool,
    pub(crate) interval: Duration,
    pub(crate) base_ejection_time: Duration,
    pub(crate) max_ejection_time: Duration,
    pub(crate) max_ejection_percent: u32,
    pub(crate) success_rate: Option<SuccessRateEjection>,
    pub(crate) failure_percentage: Option<FailurePercentageEjection>,
    pub(crate) consecutive_failures: Option<u32>,
    pub(crate) failure_half_life: Duration,
    pub(crate) weigh_failures: bool,
    pub(crate) failure_codes: GrpcCodes,
    #[cfg(feature = "opentelemetry")]
    pub(crate) metrics: Option<OutlierMetrics>,
}

/// The gRPC codes that count as a backend's failure by default: those whose HTTP mapping is a
/// 5xx or 429, as Envoy counts gRPC answers for outlier detection — `UNKNOWN`,
/// `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `UNIMPLEMENTED`, `INTERNAL`, `UNAVAILABLE` and
/// `DATA_LOSS`. Codes that speak of the request (`INVALID_ARGUMENT`, `NOT_FOUND`, …) or of the
/// caller (`CANCELLED`) do not.
///
pub(crate) const DEFAULT_FAILURE_CODES: GrpcCodes = GrpcCodes::empty()
    .with(Code::Unknown)
    .with(Code::DeadlineExceeded)
    .with(Code::ResourceExhausted)
    .with(Code::Unimplemented)
    .with(Code::Internal)
    .with(Code::Unavailable)
    .with(Code::DataLoss);

/// gRFC A50's success-rate ejection: each interval, a backend whose success rate is below
/// `mean − stdev × stdev_factor / 1000` of the backends with at least `request_volume`
/// answers is ejected (with probability `enforcement_percentage` %), when at least
/// `minimum_hosts` backends have that volume.
///
/// [`Default`] is A50's: 1900, 100, 5, 100.
///
/// ```
/// use tower_retry_hedge::balance::SuccessRateEjection;
///
/// let lenient = SuccessRateEjection { stdev_factor: 3000, ..Default::default() };
/// assert_eq!(lenient.request_volume, 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuccessRateEjection {
    /// The factor of the standard deviation, in thousandths (1900 is 1.9).
    pub stdev_factor: u32,
    /// The chance, in percent (at most 100), that a backend found an outlier is ejected.
    pub enforcement_percentage: u32,
    /// How many backends must have `request_volume` answers in the interval.
    pub minimum_hosts: u32,
    /// The answers a backend needs in the interval to count (and at least one).
    pub request_volume: u32,
}

impl Default for SuccessRateEjection {
    fn default() -> Self {
        SuccessRateEjection {
            stdev_factor: 1900,
            enforcement_percentage: 100,
            minimum_hosts: 5,
            request_volume: 100,
        }
    }
}

/// gRFC A50's failure-percentage ejection: each interval, a backend with at least
/// `request_volume` answers, more than `threshold` % of them failures, is ejected (with
/// probability `enforcement_percentage` %), when the balancer knows at least `minimum_hosts`
/// backends.
///
/// [`Default`] is A50's: 85, 100, 5, 50. [`OutlierDetection::default()`] uses 85, 100, 3, 10:
/// three backends are enough to eject one, and its interval is a tenth of A50's.
///
/// ```
/// use tower_retry_hedge::balance::FailurePercentageEjection;
///
/// let a50 = FailurePercentageEjection::default();
/// assert_eq!((a50.threshold, a50.minimum_hosts, a50.request_volume), (85, 5, 50));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailurePercentageEjection {
    /// The failure percentage (at most 100) a backend must exceed.
    pub threshold: u32,
    /// The chance, in percent (at most 100), that a backend found an outlier is ejected.
    pub enforcement_percentage: u32,
    /// How many backends the balancer must know.
    pub minimum_hosts: u32,
    /// The answers a backend needs in the interval to be judged (and at least one).
    pub request_volume: u32,
}

impl Default for FailurePercentageEjection {
    fn default() -> Self {
        FailurePercentageEjection {
            threshold: 85,
            enforcement_percentage: 100,
            minimum_hosts: 5,
            request_volume: 50,
        }
    }
}

impl OutlierDetection {
    /// gRFC A50's defaults, which a JSON config starts from: an interval of 10 s, ejection
    /// times of 30 s and 300 s, 10 %, and neither algorithm nor a run of consecutive failures
    /// (the failure half-life and codes are the balancer's).
    pub(crate) fn a50_defaults() -> OutlierDetection {
        OutlierDetection {
            interval: Duration::from_secs(10),
            max_ejection_percent: 10,
            success_rate: None,
            failure_percentage: None,
            consecutive_failures: None,
            ..OutlierDetection::default()
        }
    }
}

impl Default for OutlierDetection {
    /// The balancer's defaults (see the table on [`OutlierDetection`]).
    fn default() -> Self {
        OutlierDetection {
            enabled: true,
            interval: Duration::from_secs(1),
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_percent: 10,
            success_rate: None,
            failure_percentage: Some(FailurePercentageEjection {
                threshold: 85,
                enforcement_percentage: 100,
                minimum_hosts: 3,
                request_volume: 10,
            }),
            consecutive_failures: Some(5),
            failure_half_life: Duration::from_secs(2),
            weigh_failures: true,
            failure_codes: DEFAULT_FAILURE_CODES,
            #[cfg(feature = "opentelemetry")]
            metrics: None,
        }
    }
}

impl OutlierDetection {
    /// A builder that starts from the [defaults](OutlierDetection::default).
    ///
    /// ```
    /// use tower_retry_hedge::balance::OutlierDetection;
    ///
    /// let detection = OutlierDetection::builder().consecutive_failures(Some(3)).build()?;
    /// assert_eq!(detection.consecutive_failures(), Some(3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder() -> OutlierDetectionBuilder {
        OutlierDetectionBuilder {
            config: OutlierDetection::default(),
        }
    }

    /// No outlier detection: no backend is ejected and failures do not weigh the choice; the
    /// balancer picks as it did before it learned of failures.
    ///
    /// ```
    /// use tower_retry_hedge::balance::OutlierDetection;
    ///
    /// assert!(!OutlierDetection::disabled().is_enabled());
    /// assert!(OutlierDetection::default().is_enabled());
    /// ```
    pub fn disabled() -> OutlierDetection {
        OutlierDetection {
            enabled: false,
            ..OutlierDetection::default()
        }
    }

    /// A builder that starts from these settings (enabled, whatever these were).
    ///
    /// ```
    /// use tower_retry_hedge::balance::OutlierDetection;
    ///
    /// let a50 = OutlierDetection::from_json(r#"{"failurePercentageEjection": {}}"#)?;
    /// // A50's knobs from the JSON, and the balancer's run of consecutive failures on top.
    /// let both = a50.to_builder().consecutive_failures(Some(5)).build()?;
    /// assert_eq!(both.consecutive_failures(), Some(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_builder(&self) -> OutlierDetectionBuilder {
        OutlierDetectionBuilder {
            config: OutlierDetection {
                enabled: true,
                ..self.clone()
            },
        }
    }

    /// Whether the balancer detects outliers at all.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// How often the interval algorithms run.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The first ejection's length; later ones multiply it.
    pub fn base_ejection_time(&self) -> Duration {
        self.base_ejection_time
    }

    /// The longest ejection (or the base ejection time, if longer).
    pub fn max_ejection_time(&self) -> Duration {
        self.max_ejection_time
    }

    /// The largest share of backends ejected at once, in percent.
    pub fn max_ejection_percent(&self) -> u32 {
        self.max_ejection_percent
    }

    /// Success-rate ejection, if on.
    pub fn success_rate(&self) -> Option<SuccessRateEjection> {
        self.success_rate
    }

    /// Failure-percentage ejection, if on.
    pub fn failure_percentage(&self) -> Option<FailurePercentageEjection> {
        self.failure_percentage
    }

    /// The run of consecutive failures that ejects a backend at once, if on.
    pub fn consecutive_failures(&self) -> Option<u32> {
        self.consecutive_failures
    }

    /// The time in which a recent failure (or success) loses half its weight in the choice.
    pub fn failure_half_life(&self) -> Duration {
        self.failure_half_life
    }

    /// Whether recent failures weigh the choice between two backends.
    pub fn weighs_failures(&self) -> bool {
        self.weigh_failures
    }

    /// The gRPC codes that count as failures.
    pub fn failure_codes(&self) -> GrpcCodes {
        self.failure_codes
    }

    /// The ejection time after `times` ejections: `base × times`, at most
    /// `max(base, max_ejection_time)`.
    pub(crate) fn ejection_time(&self, times: u32) -> Duration {
        let cap = self.base_ejection_time.max(self.max_ejection_time);
        self.base_ejection_time.saturating_mul(times).min(cap)
    }
}

/// Builds [`OutlierDetection`] from the [defaults](OutlierDetection::default); the values are
/// checked by [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::balance::{OutlierDetection, SuccessRateEjection};
///
/// let detection = OutlierDetection::builder()
///     .interval(Duration::from_secs(5))
///     .max_ejection_percent(20)
///     .success_rate(Some(SuccessRateEjection::default()))
///     .failure_half_life(Duration::from_secs(5))
///     .build()?;
/// assert_eq!(detection.success_rate(), Some(SuccessRateEjection::default()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct OutlierDetectionBuilder {
    config: OutlierDetection,
}

impl OutlierDetectionBuilder {
    /// How often the interval algorithms (success rate, failure percentage) judge the
    /// answers of the interval that ends, and the "times ejected" of backends that stayed in
    /// fades by one. Must be > 0.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.config.interval = interval;
        self
    }

    /// The first ejection's length: a backend ejected for the n-th time in a row stays out
    /// `n × base`, at most [`max_ejection_time`](Self::max_ejection_time).
    pub fn base_ejection_time(mut self, base: Duration) -> Self {
        self.config.base_ejection_time = base;
        self
    }

    /// The longest ejection (the base ejection time, if that is longer).
    pub fn max_ejection_time(mut self, max: Duration) -> Self {
        self.config.max_ejection_time = max;
        self
    }

    /// The largest share of backends ejected at once, in percent (at most 100). One backend
    /// may always be ejected, and never every backend.
    pub fn max_ejection_percent(mut self, percent: u32) -> Self {
        self.config.max_ejection_percent = percent;
        self
    }

    /// Success-rate ejection, or `None` for none.
    pub fn success_rate(mut self, success_rate: Option<SuccessRateEjection>) -> Self {
        self.config.success_rate = success_rate;
        self
    }

    /// Failure-percentage ejection, or `None` for none.
    pub fn failure_percentage(
        mut self,
        failure_percentage: Option<FailurePercentageEjection>,
    ) -> Self {
        self.config.failure_percentage = failure_percentage;
        self
    }

    /// Ejects a backend at once when this many of its answers in a row fail (Envoy's
    /// `consecutive_5xx`), if another backend still in rotation does well; `None` for never.
    /// Must be at least 1.
    pub fn consecutive_failures(mut self, failures: Option<u32>) -> Self {
        self.config.consecutive_failures = failures;
        self
    }

    /// The time in which a recent failure or success loses half its weight in the choice
    /// between two backends. Must be > 0.
    pub fn failure_half_life(mut self, half_life: Duration) -> Self {
        self.config.failure_half_life = half_life;
        self
    }

    /// Whether recent failures weigh the choice between two backends (on by default): with
    /// `false`, the pick is power of two choices on load alone, among the backends in
    /// rotation, and a backend back from an ejection gets its full share at once.
    pub fn weigh_failures(mut self, weigh: bool) -> Self {
        self.config.weigh_failures = weigh;
        self
    }

    /// The gRPC codes that count as a backend's failure. The balancer reads each answer with
    /// the crate's classifiers, as the layers read an attempt: a gRPC answer (a status in a
    /// Trailers-Only response's headers or in the trailers, or gRPC's mapping of a non-200
    /// gRPC response) with [`GrpcCodes`] over these codes, an error of the backend's service
    /// as `UNAVAILABLE` (an attempt that was never sent or was refused always counts), and an
    /// answer that is not gRPC with [`HttpStatuses`](crate::classify::HttpStatuses) over 5xx
    /// and 429. Unless set: `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`,
    /// `UNIMPLEMENTED`, `INTERNAL`, `UNAVAILABLE` and `DATA_LOSS`, the codes whose HTTP mapping
    /// is a 5xx or 429.
    pub fn failure_codes(mut self, codes: GrpcCodes) -> Self {
        self.config.failure_codes = codes;
        self
    }

    /// Counts ejections on OpenTelemetry instruments (feature `opentelemetry`): see
    /// [`OutlierMetrics`](OutlierMetrics).
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn metrics(mut self, metrics: OutlierMetrics) -> Self {
        self.config.metrics = Some(metrics);
        self
    }

    /// Checks the values.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::balance::OutlierDetection;
    ///
    /// let error = OutlierDetection::builder().interval(Duration::ZERO).build().unwrap_err();
    /// assert_eq!(error.field(), "interval");
    /// assert_eq!(error.to_string(), "interval: must be a duration > 0");
    /// ```
    pub fn build(self) -> Result<OutlierDetection, BuildError> {
        let config = self.config;
        if config.interval.is_zero() {
            return Err(BuildError::new("interval", "must be a duration > 0"));
        }
        if config.failure_half_life.is_zero() {
            return Err(BuildError::new(
                "failure_half_life",
                "must be a duration > 0",
            ));
        }
        let mut percentages = vec![("max_ejection_percent", config.max_ejection_percent)];
        if let Some(success_rate) = config.success_rate {
            let enforcement = success_rate.enforcement_percentage;
            percentages.push(("success_rate.enforcement_percentage", enforcement));
        }
        if let Some(failure_percentage) = config.failure_percentage {
            percentages.push(("failure_percentage.threshold", failure_percentage.threshold));
            let enforcement = failure_percentage.enforcement_percentage;
            percentages.push(("failure_percentage.enforcement_percentage", enforcement));
        }
        if let Some((field, _)) = percentages.into_iter().find(|(_, value)| *value > 100) {
            return Err(BuildError::new(field, "must be at most 100"));
        }
        if config.consecutive_failures == Some(0) {
            return Err(BuildError::new(
                "consecutive_failures",
                "must be at least 1 (None turns it off)",
            ));
        }
        Ok(config)
    }
}

impl fmt::Debug for OutlierDetection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("OutlierDetection");
        debug
            .field("enabled", &self.enabled)
            .field("interval", &self.interval)
            .field("base_ejection_time", &self.base_ejection_time)
            .field("max_ejection_time", &self.max_ejection_time)
            .field("max_ejection_percent", &self.max_ejection_percent)
            .field("success_rate", &self.success_rate)
            .field("failure_percentage", &self.failure_percentage)
            .field("consecutive_failures", &self.consecutive_failures)
            .field("failure_half_life", &self.failure_half_life)
            .field("weigh_failures", &self.weigh_failures)
            .field("failure_codes", &self.failure_codes);
        #[cfg(feature = "opentelemetry")]
        debug.field("metrics", &self.metrics.is_some());
        debug.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_checks_its_values() {
        let cases = [
            (
                OutlierDetection::builder().interval(Duration::ZERO),
                "interval",
            ),
            (
                OutlierDetection::builder().failure_half_life(Duration::ZERO),
                "failure_half_life",
            ),
            (
                OutlierDetection::builder().max_ejection_percent(101),
                "max_ejection_percent",
            ),
            (
                OutlierDetection::builder().success_rate(Some(SuccessRateEjection {
                    enforcement_percentage: 101,
                    ..Default::default()
                })),
                "success_rate.enforcement_percentage",
            ),
            (
                OutlierDetection::builder().failure_percentage(Some(FailurePercentageEjection {
                    threshold: 101,
                    ..Default::default()
                })),
                "failure_percentage.threshold",
            ),
            (
                OutlierDetection::builder().failure_percentage(Some(FailurePercentageEjection {
                    enforcement_percentage: 101,
                    ..Default::default()
                })),
                "failure_percentage.enforcement_percentage",
            ),
            (
                OutlierDetection::builder().consecutive_failures(Some(0)),
                "consecutive_failures",
            ),
        ];
        for (builder, field) in cases {
            assert_eq!(builder.build().unwrap_err().field(), field);
        }
        assert!(OutlierDetection::builder().build().is_ok());
    }

    #[test]
    fn the_ejection_time_grows_with_the_times_ejected_up_to_the_cap() {
        let config = OutlierDetection::builder()
            .base_ejection_time(Duration::from_secs(30))
            .max_ejection_time(Duration::from_secs(100))
            .build()
            .unwrap();
        let secs = |times| config.ejection_time(times).as_secs();
        assert_eq!(
            [secs(1), secs(2), secs(3), secs(4), secs(100)],
            [30, 60, 90, 100, 100]
        );
        // A cap below the base: the base.
        let config = OutlierDetection::builder()
            .base_ejection_time(Duration::from_secs(30))
            .max_ejection_time(Duration::from_secs(10))
            .build()
            .unwrap();
        assert_eq!(config.ejection_time(5), Duration::from_secs(30));
        // Huge values saturate instead of overflowing.
        let config = OutlierDetection::from_json(
            r#"{"baseEjectionTime": "315576000000s", "maxEjectionTime": "315576000000s"}"#,
        )
        .unwrap();
        assert_eq!(
            config.ejection_time(u32::MAX),
            Duration::from_secs(315_576_000_000)
        );
    }
}
