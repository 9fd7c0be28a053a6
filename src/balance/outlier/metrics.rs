//! The balancer's outlier detection on an OpenTelemetry meter (features `balance` and
//! `opentelemetry`): the two counters of gRFC A91.

use std::fmt;
use std::sync::Arc;

use opentelemetry::metrics::{Counter, Meter};
use opentelemetry::{KeyValue, Value};

use super::EjectionReason;

/// `grpc.lb.outlier_detection.ejections_enforced`: outliers ejected, by detection method.
pub(crate) const EJECTIONS_ENFORCED: &str = "grpc.lb.outlier_detection.ejections_enforced";
/// `grpc.lb.outlier_detection.ejections_unenforced`: outliers found and left in rotation, by
/// detection method and reason.
pub(crate) const EJECTIONS_UNENFORCED: &str = "grpc.lb.outlier_detection.ejections_unenforced";

/// The label of how an outlier was found (A91's values, and this crate's for a run of
/// consecutive failures).
const DETECTION_METHOD: &str = "grpc.lb.outlier_detection.detection_method";
/// The label of why an outlier was not ejected, on [`EJECTIONS_UNENFORCED`] only.
const UNENFORCED_REASON: &str = "grpc.lb.outlier_detection.unenforced_reason";

/// Why an outlier stayed in rotation, as A91's `unenforced_reason` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unenforced {
    /// The draw against the algorithm's `enforcement_percentage` said no.
    EnforcementPercentage,
    /// The most backends that may be ejected (`max_ejection_percent`, never all) were.
    MaxEjectionOverflow,
}

impl Unenforced {
    fn as_str(self) -> &'static str {
        match self {
            Unenforced::EnforcementPercentage => "enforcement_percentage",
            Unenforced::MaxEjectionOverflow => "max_ejection_overflow",
        }
    }
}

/// The counters of gRFC A91 (gRPC's outlier-detection metrics), made on a [`Meter`], for
/// [`OutlierDetectionBuilder::metrics`](super::OutlierDetectionBuilder::metrics):
///
/// | instrument | unit | counts | labels |
/// |---|---|---|---|
/// | `grpc.lb.outlier_detection.ejections_enforced` | `{ejection}` | backends ejected | `grpc.target`, `grpc.lb.backend_service`, `grpc.lb.outlier_detection.detection_method` |
/// | `grpc.lb.outlier_detection.ejections_unenforced` | `{ejection}` | outliers found and not ejected | the same, and `grpc.lb.outlier_detection.unenforced_reason` |
///
/// - `grpc.target`: the channel's target given to [`target`](Self::target), else `other`
///   (A91 requires the label; `other` is what gRFC A66 records for a target it does not name).
/// - `grpc.lb.backend_service` (gRFC A89): only when [`backend_service`](Self::backend_service)
///   gives one.
/// - `grpc.lb.outlier_detection.detection_method`: A91's `success_rate` or
///   `failure_percentage`, or `consecutive_failures` for this crate's run of consecutive
///   failures, which A91 does not know ([`EjectionReason::as_str`], as the `tracing` events
///   have it).
/// - `grpc.lb.outlier_detection.unenforced_reason`: A91's `enforcement_percentage` (the draw
///   against the algorithm's enforcement percentage said no) or `max_ejection_overflow` (the
///   most backends that may be ejected were; never all of them).
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
///     .target("dns:///greeter.example.com:443")
///     .backend_service("greeter-backend");
/// let detection = OutlierDetection::builder().metrics(metrics).build()?;
/// # let _ = detection;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct OutlierMetrics {
    enforced: Counter<u64>,
    unenforced: Counter<u64>,
    target: Value,
    backend_service: Option<Value>,
}

impl OutlierMetrics {
    /// The two counters, made on `meter` with A91's names and unit (`{ejection}`).
    pub fn new(meter: &Meter) -> OutlierMetrics {
        let counter = |name: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit("{ejection}")
                .with_description(description)
                .build()
        };
        OutlierMetrics {
            enforced: counter(
                EJECTIONS_ENFORCED,
                "Enforced outlier ejections by ejection reason",
            ),
            unenforced: counter(
                EJECTIONS_UNENFORCED,
                "Unenforced outlier ejections due to either max ejection percentage or enforcement_percentage",
            ),
            target: Value::from("other"),
            backend_service: None,
        }
    }

    /// The `grpc.target` on every count: the channel's target as gRFC A66 defines it, such as
    /// `dns:///greeter.example.com:443`.
    pub fn target(mut self, target: impl Into<String>) -> OutlierMetrics {
        self.target = Value::from(Arc::<str>::from(target.into()));
        self
    }

    /// The optional `grpc.lb.backend_service` on every count: the backend service the
    /// balanced traffic goes to, as gRFC A89 defines it (an xDS cluster's name in gRPC).
    pub fn backend_service(mut self, backend_service: impl Into<String>) -> OutlierMetrics {
        self.backend_service = Some(Value::from(Arc::<str>::from(backend_service.into())));
        self
    }

    /// A backend ejected as an outlier found by `method`.
    pub(crate) fn ejected(&self, method: EjectionReason) {
        self.enforced.add(1, &self.attributes(method, None));
    }

    /// An outlier found by `method` left in rotation, for the reason `why`.
    pub(crate) fn unenforced(&self, method: EjectionReason, why: Unenforced) {
        self.unenforced.add(1, &self.attributes(method, Some(why)));
    }

    /// The labels of one count, made per count: ejections are rare.
    fn attributes(&self, method: EjectionReason, why: Option<Unenforced>) -> Vec<KeyValue> {
        let mut attributes = Vec::with_capacity(4);
        attributes.push(KeyValue::new("grpc.target", self.target.clone()));
        if let Some(backend_service) = &self.backend_service {
            attributes.push(KeyValue::new(
                "grpc.lb.backend_service",
                backend_service.clone(),
            ));
        }
        attributes.push(KeyValue::new(DETECTION_METHOD, method.as_str()));
        if let Some(why) = why {
            attributes.push(KeyValue::new(UNENFORCED_REASON, why.as_str()));
        }
        attributes
    }
}

impl fmt::Debug for OutlierMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutlierMetrics")
            .field("target", &self.target)
            .field("backend_service", &self.backend_service)
            .finish_non_exhaustive()
    }
}
