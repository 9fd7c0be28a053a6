//! gRFC A96's per-call retry metrics on an OpenTelemetry meter (the API only; the user's SDK
//! aggregates and exports them), with gRFC A108's optional custom label.

use std::fmt;
use std::sync::Arc;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::{KeyValue, StringValue, Value};

use crate::stats::CallCounts;

/// `grpc.client.call.retries`: counted attempts after the first that were not hedges.
pub(crate) const RETRIES: &str = "grpc.client.call.retries";
/// `grpc.client.call.transparent_retries`: transparent retries.
pub(crate) const TRANSPARENT_RETRIES: &str = "grpc.client.call.transparent_retries";
/// `grpc.client.call.hedges`: hedges.
pub(crate) const HEDGES: &str = "grpc.client.call.hedges";
/// `grpc.client.call.retry_delay`: seconds with no attempt in flight before a later one.
pub(crate) const RETRY_DELAY: &str = "grpc.client.call.retry_delay";

/// `tower_retry_hedge.hedges_over_budget`: hedges not sent because their policy's
/// [`HedgeBudget`](crate::throttle::HedgeBudget) was spent (a counter; beyond A96).
pub(crate) const HEDGES_OVER_BUDGET: &str = "tower_retry_hedge.hedges_over_budget";

/// The bucket boundaries of [`RETRIES`] and [`HEDGES`], as grpc-java gives them for A96.
pub(crate) const RETRY_BUCKETS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];
/// The bucket boundaries of [`TRANSPARENT_RETRIES`], as grpc-java gives them for A96.
pub(crate) const TRANSPARENT_RETRY_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0];
/// The bucket boundaries of [`RETRY_DELAY`]: gRFC A66's latency buckets, in seconds.
pub(crate) const RETRY_DELAY_BUCKETS: [f64; 41] = [
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// `grpc.client.call.custom`: gRFC A108's label, whose value each call brings in a
/// [`CustomLabel`] extension, recorded when [`RetryMetrics::custom_label`] turns it on.
pub(crate) const CUSTOM_LABEL_KEY: &str = "grpc.client.call.custom";

/// The label value A66 records for what it will not name.
const OTHER: &str = "other";

/// A call's value of gRFC A108's `grpc.client.call.custom` label: put it in the request's
/// extensions, and [`RetryMetrics`] built with [`custom_label(true)`](RetryMetrics::custom_label)
/// record the call's A96 instruments under it. A dimension the application defines (a
/// tenant tier, a feature, a caller), not a raw id: each value is a series of its own.
///
/// ```
/// use tower_retry_hedge::telemetry::CustomLabel;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(CustomLabel::from_static("checkout"));
/// // Or a value known at run time: the copy each attempt gets shares it.
/// let tier = String::from("premium");
/// request.extensions_mut().insert(CustomLabel::new(tier));
/// assert_eq!(request.extensions().get::<CustomLabel>().unwrap().as_str(), "premium");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CustomLabel(StringValue);

impl CustomLabel {
    /// The label `value`, kept behind an `Arc`: the layers copy a request's extensions to
    /// every attempt, and a clone then costs no allocation.
    pub fn new(value: impl Into<Arc<str>>) -> CustomLabel {
        CustomLabel(StringValue::from(value.into()))
    }

    /// The label `value`, with no allocation at all.
    pub fn from_static(value: &'static str) -> CustomLabel {
        CustomLabel(StringValue::from(value))
    }

    /// The value.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for CustomLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The instruments of gRFC A96, made on a [`Meter`], for
/// [`PoliciesBuilder::metrics`](crate::policy::PoliciesBuilder::metrics): see the
/// [module docs](crate::telemetry#metrics) for what each call records.
///
/// Cheap to clone: the instruments are handles.
///
/// ```
/// use opentelemetry::metrics::MeterProvider as _;
/// use opentelemetry_sdk::metrics::SdkMeterProvider;
/// use tower_retry_hedge::telemetry::RetryMetrics;
/// use tower_retry_hedge::Policies;
///
/// let provider = SdkMeterProvider::builder().build();
/// let metrics = RetryMetrics::new(&provider.meter("tower-retry-hedge"))
///     .target("dns:///greeter.example.com:443");
/// let policies = Policies::builder().metrics(metrics).build();
/// # let _ = policies;
/// ```
#[derive(Clone)]
pub struct RetryMetrics {
    retries: Histogram<u64>,
    transparent: Histogram<u64>,
    hedges: Histogram<u64>,
    delay: Histogram<f64>,
    over_budget: Counter<u64>,
    target: Option<Arc<str>>,
    custom_label: bool,
}

impl RetryMetrics {
    /// The four histograms, and the crate's counter of hedges over budget, made on `meter` with A96's names, units and bucket advice.
    pub fn new(meter: &Meter) -> RetryMetrics {
        let counts = |name: &'static str, unit: &'static str, description, buckets: &[f64]| {
            meter
                .u64_histogram(name)
                .with_unit(unit)
                .with_description(description)
                .with_boundaries(buckets.to_vec())
                .build()
        };
        RetryMetrics {
            retries: counts(
                RETRIES,
                "{retry}",
                "Number of retries during the client call. If there were no retries, 0 is not reported.",
                &RETRY_BUCKETS,
            ),
            transparent: counts(
                TRANSPARENT_RETRIES,
                "{transparent_retry}",
                "Number of transparent retries during the client call. If there were no transparent retries, 0 is not reported.",
                &TRANSPARENT_RETRY_BUCKETS,
            ),
            hedges: counts(
                HEDGES,
                "{hedge}",
                "Number of hedges during the client call. If there were no hedges, 0 is not reported.",
                &RETRY_BUCKETS,
            ),
            delay: meter
                .f64_histogram(RETRY_DELAY)
                .with_unit("s")
                .with_description(
                    "Total time of delay while there is no active attempt during the client call.",
                )
                .with_boundaries(RETRY_DELAY_BUCKETS.to_vec())
                .build(),
            over_budget: meter
                .u64_counter(HEDGES_OVER_BUDGET)
                .with_unit("{hedge}")
                .with_description("Hedges not sent because their policy's hedge budget was spent.")
                .build(),
            target: None,
            custom_label: false,
        }
    }

    /// The `grpc.target` of every call: the channel's target as gRFC A66 defines it, such
    /// as `dns:///greeter.example.com:443`. Without it, each request's authority is used.
    pub fn target(mut self, target: impl Into<String>) -> RetryMetrics {
        self.target = Some(Arc::from(target.into()));
        self
    }

    /// Whether each call's values also carry gRFC A108's `grpc.client.call.custom` label
    /// (default `false`): the value of the request's [`CustomLabel`] extension, or the empty
    /// string for a request without one, as A108 says. A108 leaves the label off unless the
    /// application turns it on, since every value makes series of its own. Off, no call
    /// looks for the extension.
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use opentelemetry_sdk::metrics::SdkMeterProvider;
    /// use tower_retry_hedge::telemetry::{CustomLabel, RetryMetrics};
    /// use tower_retry_hedge::Policies;
    ///
    /// let provider = SdkMeterProvider::builder().build();
    /// let metrics = RetryMetrics::new(&provider.meter("tower-retry-hedge")).custom_label(true);
    /// let policies = Policies::builder().metrics(metrics).build();
    /// // Calls of this request record `grpc.client.call.custom = "batch"`.
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert(CustomLabel::from_static("batch"));
    /// # let _ = (policies, request);
    /// ```
    pub fn custom_label(mut self, on: bool) -> RetryMetrics {
        self.custom_label = on;
        self
    }

    /// Whether calls are to read their [`CustomLabel`] for these metrics.
    pub(crate) fn records_custom_label(&self) -> bool {
        self.custom_label
    }

    /// Records one call that made more than one attempt.
    pub(crate) fn record(&self, extra: &CallCounts, labels: &Labels) {
        let target = match &self.target {
            Some(target) => Value::from(Arc::clone(target)),
            None => labels.authority.clone(),
        };
        let attributes = [
            KeyValue::new("grpc.method", labels.method.clone()),
            KeyValue::new("grpc.target", target),
            KeyValue::new(
                CUSTOM_LABEL_KEY,
                labels.custom.clone().unwrap_or(Value::from("")),
            ),
        ];
        // A108's label only when the metrics record it: off, it is no label at all.
        let attributes = match labels.custom {
            Some(_) => &attributes[..],
            None => &attributes[..2],
        };
        if extra.hedges_over_budget > 0 {
            self.over_budget
                .add(u64::from(extra.hedges_over_budget), attributes);
        }
        if extra.retries + extra.hedges + extra.transparent == 0 {
            // Only a hedge refused: no attempt after the first, no retry delay to report.
            return;
        }
        // A96: "If there were no retries, 0 is not reported", and so for the others.
        for (histogram, count) in [
            (&self.retries, extra.retries),
            (&self.transparent, extra.transparent),
            (&self.hedges, extra.hedges),
        ] {
            if count > 0 {
                histogram.record(u64::from(count), attributes);
            }
        }
        self.delay.record(extra.delay.as_secs_f64(), attributes);
    }
}

impl From<&Meter> for RetryMetrics {
    fn from(meter: &Meter) -> RetryMetrics {
        RetryMetrics::new(meter)
    }
}

impl fmt::Debug for RetryMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryMetrics")
            .field("target", &self.target)
            .field("custom_label", &self.custom_label)
            .finish_non_exhaustive()
    }
}

/// A call's `grpc.method`, its authority for `grpc.target`, and its
/// `grpc.client.call.custom` when the metrics record it.
pub(crate) struct Labels {
    method: Value,
    authority: Value,
    custom: Option<Value>,
}

impl Labels {
    /// The labels of a call to `path` on `authority`, which took the route named `route`
    /// if any. `extensions`, the request's, are given only when the metrics record A108's
    /// custom label, so a table without it never looks the extension up.
    pub(crate) fn of(
        path: &str,
        grpc: bool,
        authority: Option<&str>,
        route: Option<&Arc<str>>,
        extensions: Option<&http::Extensions>,
    ) -> Labels {
        let method = match route {
            Some(route) => Value::from(Arc::clone(route)),
            None if grpc && crate::grpc_path::split(path).is_some() => {
                Value::from(path[1..].to_owned())
            }
            None => Value::from(OTHER),
        };
        let authority = match authority {
            Some(authority) if !authority.is_empty() => Value::from(authority.to_owned()),
            _ => Value::from(OTHER),
        };
        let custom = extensions.map(|extensions| match extensions.get::<CustomLabel>() {
            Some(label) => Value::String(label.0.clone()),
            // A108: "When not specified, the value will be empty string."
            None => Value::from(""),
        });
        Labels {
            method,
            authority,
            custom,
        }
    }
}
