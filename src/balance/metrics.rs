//! The balancer's ejections on an OpenTelemetry meter (features `balance` and
//! `opentelemetry`), with the names gRFC A91 proposes for gRPC's outlier detection.

use std::fmt;
use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Meter};

use super::EjectionReason;

/// `grpc.lb.outlier_detection.ejections_enforced_total`: every ejection, whatever the reason.
///
/// ```
/// use tower_retry_hedge::balance::EJECTIONS_ENFORCED_TOTAL;
///
/// assert!(EJECTIONS_ENFORCED_TOTAL.starts_with("grpc.lb.outlier_detection."));
/// ```
pub const EJECTIONS_ENFORCED_TOTAL: &str = "grpc.lb.outlier_detection.ejections_enforced_total";
/// `grpc.lb.outlier_detection.ejections_overflow`: outliers not ejected because the most
/// backends that may be ejected were.
pub const EJECTIONS_OVERFLOW: &str = "grpc.lb.outlier_detection.ejections_overflow";
/// `grpc.lb.outlier_detection.ejections_enforced_success_rate`.
pub const EJECTIONS_ENFORCED_SUCCESS_RATE: &str =
    "grpc.lb.outlier_detection.ejections_enforced_success_rate";
/// `grpc.lb.outlier_detection.ejections_detected_success_rate`: outliers found, ejected or
/// not.
pub const EJECTIONS_DETECTED_SUCCESS_RATE: &str =
    "grpc.lb.outlier_detection.ejections_detected_success_rate";
/// `grpc.lb.outlier_detection.ejections_enforced_failure_percentage`.
pub const EJECTIONS_ENFORCED_FAILURE_PERCENTAGE: &str =
    "grpc.lb.outlier_detection.ejections_enforced_failure_percentage";
/// `grpc.lb.outlier_detection.ejections_detected_failure_percentage`: outliers found, ejected
/// or not.
pub const EJECTIONS_DETECTED_FAILURE_PERCENTAGE: &str =
    "grpc.lb.outlier_detection.ejections_detected_failure_percentage";

/// The counters of gRFC A91 (gRPC's proposed outlier-detection metrics), made on a
/// [`Meter`], for [`OutlierDetectionBuilder::metrics`](super::OutlierDetectionBuilder::metrics).
/// An ejection for a run of consecutive failures (not an A50 algorithm) counts in
/// [`EJECTIONS_ENFORCED_TOTAL`] only. Each carries `grpc.target` when
/// [`target`](Self::target) gives one.
///
/// Cheap to clone: the instruments are handles.
///
/// ```
/// use opentelemetry::metrics::MeterProvider as _;
/// use opentelemetry_sdk::metrics::SdkMeterProvider;
/// use tower_retry_hedge::balance::{OutlierDetection, OutlierMetrics};
///
/// let provider = SdkMeterProvider::builder().build();
/// let metrics = OutlierMetrics::new(&provider.meter("tower-retry-hedge"))
///     .target("dns:///greeter.example.com:443");
/// let detection = OutlierDetection::builder().metrics(metrics).build()?;
/// # let _ = detection;
/// # Ok::<(), tower_retry_hedge::balance::OutlierDetectionError>(())
/// ```
#[derive(Clone)]
pub struct OutlierMetrics {
    enforced_total: Counter<u64>,
    overflow: Counter<u64>,
    enforced_success_rate: Counter<u64>,
    detected_success_rate: Counter<u64>,
    enforced_failure_percentage: Counter<u64>,
    detected_failure_percentage: Counter<u64>,
    attributes: Arc<[KeyValue]>,
}

impl OutlierMetrics {
    /// The six counters, made on `meter` with A91's names and unit (`{ejection}`).
    pub fn new(meter: &Meter) -> OutlierMetrics {
        let counter = |name: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit("{ejection}")
                .with_description(description)
                .build()
        };
        OutlierMetrics {
            enforced_total: counter(
                EJECTIONS_ENFORCED_TOTAL,
                "Total enforced ejections due to any outlier type",
            ),
            overflow: counter(
                EJECTIONS_OVERFLOW,
                "Number of ejections aborted due to max ejection percentage",
            ),
            enforced_success_rate: counter(
                EJECTIONS_ENFORCED_SUCCESS_RATE,
                "Enforced success rate outlier ejections",
            ),
            detected_success_rate: counter(
                EJECTIONS_DETECTED_SUCCESS_RATE,
                "Detected (even if unenforced) success rate outlier ejections",
            ),
            enforced_failure_percentage: counter(
                EJECTIONS_ENFORCED_FAILURE_PERCENTAGE,
                "Enforced failure percentage outlier ejections",
            ),
            detected_failure_percentage: counter(
                EJECTIONS_DETECTED_FAILURE_PERCENTAGE,
                "Detected (even if unenforced) failure percentage outlier ejections",
            ),
            attributes: Arc::from([]),
        }
    }

    /// The `grpc.target` on every count: the channel's target as gRFC A66 defines it, such as
    /// `dns:///greeter.example.com:443`.
    pub fn target(mut self, target: impl Into<String>) -> OutlierMetrics {
        self.attributes = Arc::from([KeyValue::new("grpc.target", target.into())]);
        self
    }

    pub(crate) fn ejected(&self, reason: EjectionReason) {
        self.enforced_total.add(1, &self.attributes);
        match reason {
            EjectionReason::SuccessRate => self.enforced_success_rate.add(1, &self.attributes),
            EjectionReason::FailurePercentage => {
                self.enforced_failure_percentage.add(1, &self.attributes)
            }
            EjectionReason::ConsecutiveFailures => {}
        }
    }

    pub(crate) fn detected(&self, reason: EjectionReason) {
        match reason {
            EjectionReason::SuccessRate => self.detected_success_rate.add(1, &self.attributes),
            EjectionReason::FailurePercentage => {
                self.detected_failure_percentage.add(1, &self.attributes)
            }
            EjectionReason::ConsecutiveFailures => {}
        }
    }

    pub(crate) fn overflow(&self) {
        self.overflow.add(1, &self.attributes);
    }
}

impl fmt::Debug for OutlierMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutlierMetrics")
            .field("attributes", &self.attributes)
            .finish_non_exhaustive()
    }
}
