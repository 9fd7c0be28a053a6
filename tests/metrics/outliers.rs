//! gRFC A91's two outlier-detection counters, read back from the in-memory exporter: a
//! `balance::Balance` over mock backends that answer at once, on the paused clock, so each
//! interval's judgement sees the answers of the calls made before it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;

use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PendingRequests};
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceExt};
use tower_retry_hedge::balance::{
    Balance, EjectionReason, FailurePercentageEjection, OutlierDetection, OutlierDetectionBuilder,
    OutlierMetrics, Outliers,
};

use super::{Recorded, Req, http_request};

type Backend =
    PendingRequests<BoxService<Req, http::Response<http_body_util::Empty<Bytes>>, BoxError>>;

/// A91's instruments, by the names gRPC gives them.
const ENFORCED: &str = "grpc.lb.outlier_detection.ejections_enforced";
const UNENFORCED: &str = "grpc.lb.outlier_detection.ejections_unenforced";
const METHOD: &str = "grpc.lb.outlier_detection.detection_method";
const REASON: &str = "grpc.lb.outlier_detection.unenforced_reason";

/// The names of the earlier draft of A91, which the crate no longer emits.
const OLD_NAMES: [&str; 6] = [
    "grpc.lb.outlier_detection.ejections_enforced_total",
    "grpc.lb.outlier_detection.ejections_overflow",
    "grpc.lb.outlier_detection.ejections_enforced_success_rate",
    "grpc.lb.outlier_detection.ejections_detected_success_rate",
    "grpc.lb.outlier_detection.ejections_enforced_failure_percentage",
    "grpc.lb.outlier_detection.ejections_detected_failure_percentage",
];

/// A backend answering HTTP `status` with no gRPC status: 503 is a failure, 200 a success.
fn backend(status: u16) -> Backend {
    let service = tower::service_fn(move |_: Req| async move {
        Ok::<_, BoxError>(
            http::Response::builder()
                .status(status)
                .body(http_body_util::Empty::new())
                .expect("valid response"),
        )
    });
    PendingRequests::new(BoxService::new(service), CompleteOnResponse::default())
}

/// Detection by failure percentage alone (an A91 method), on three backends and 3 answers
/// (the balancer draws a backend that fails every call seldom, so few answers come from it),
/// an outlier ejected with probability `enforcement_percentage` %.
fn failure_percentage(enforcement_percentage: u32) -> OutlierDetectionBuilder {
    OutlierDetection::builder()
        .consecutive_failures(None)
        .failure_percentage(Some(FailurePercentageEjection {
            enforcement_percentage,
            minimum_hosts: 3,
            request_volume: 3,
            ..FailurePercentageEjection::default()
        }))
}

/// 100 calls in each of three intervals (the default 1 s) through a balancer of backends
/// answering `statuses`, with `detection` counting on `metrics`; then the last judgement.
async fn calls(
    statuses: &[u16],
    detection: OutlierDetectionBuilder,
    metrics: OutlierMetrics,
) -> Outliers {
    let detection = detection.metrics(metrics).build().expect("valid settings");
    let backends: Vec<_> = statuses.iter().map(|&status| backend(status)).collect();
    let mut balance =
        Balance::with_seed(ServiceList::new(backends), 3).outlier_detection(detection);
    let outliers = balance.outliers();
    for _ in 0..3 {
        for _ in 0..100 {
            let ready = balance.ready().await.expect("a backend is ready");
            ready
                .call(http_request("http://backends.test/items"))
                .await
                .expect("the backends answer");
        }
        tokio::time::advance(Duration::from_millis(1001)).await;
    }
    balance.ready().await.expect("a backend is ready");
    outliers
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|&(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_ejection_counts_in_ejections_enforced_under_its_detection_method() {
    let recorded = Recorded::new();
    let metrics = OutlierMetrics::new(&recorded.meter())
        .target("dns:///backends.test:443")
        .backend_service("backends");
    let outliers = calls(&[503, 200, 200], failure_percentage(100), metrics).await;

    let ejected = outliers.ejected();
    assert_eq!(ejected.len(), 1, "{ejected:?}");
    assert_eq!(ejected[0].reason, EjectionReason::FailurePercentage);
    assert_eq!(
        recorded.counts(ENFORCED),
        [(
            labels(&[
                ("grpc.target", "dns:///backends.test:443"),
                ("grpc.lb.backend_service", "backends"),
                (METHOD, "failure_percentage"),
            ]),
            1
        )]
    );
    // Nothing was left in rotation, and the earlier draft's names are gone.
    assert_eq!(recorded.names(), BTreeSet::from([ENFORCED.to_owned()]));
    let names = recorded.names();
    assert!(OLD_NAMES.iter().all(|old| !names.contains(*old)));
}

#[tokio::test(start_paused = true)]
async fn an_outlier_over_the_cap_counts_in_ejections_unenforced_as_max_ejection_overflow() {
    let recorded = Recorded::new();
    // No target given: A91's required `grpc.target` is A66's `other`.
    let metrics = OutlierMetrics::new(&recorded.meter());
    // Two failing backends of three: the default cap (10 %) lets one out, never two.
    let outliers = calls(&[503, 503, 200], failure_percentage(100), metrics).await;

    assert_eq!(outliers.ejected().len(), 1);
    let method = [("grpc.target", "other"), (METHOD, "failure_percentage")];
    assert_eq!(recorded.counts(ENFORCED), [(labels(&method), 1)]);
    let unenforced = recorded.counts(UNENFORCED);
    assert_eq!(unenforced.len(), 1, "{unenforced:?}");
    let (unenforced_labels, count) = &unenforced[0];
    let mut expected = labels(&method);
    expected.insert(REASON.to_owned(), "max_ejection_overflow".to_owned());
    assert_eq!(*unenforced_labels, expected);
    // Found again at every judgement while the other is out.
    assert!(*count >= 1);
    let names = recorded.names();
    assert!(OLD_NAMES.iter().all(|old| !names.contains(*old)));
}

#[tokio::test(start_paused = true)]
async fn an_enforcement_percentage_of_0_counts_outliers_in_ejections_unenforced() {
    let recorded = Recorded::new();
    let metrics = OutlierMetrics::new(&recorded.meter()).target("dns:///backends.test:443");
    let outliers = calls(&[503, 200, 200], failure_percentage(0), metrics).await;

    assert!(outliers.ejected().is_empty());
    assert!(recorded.counts(ENFORCED).is_empty());
    let unenforced = recorded.counts(UNENFORCED);
    let expected = labels(&[
        ("grpc.target", "dns:///backends.test:443"),
        (METHOD, "failure_percentage"),
        (REASON, "enforcement_percentage"),
    ]);
    // Each judgement that found it (one per interval where it had the volume) drew no.
    assert_eq!(unenforced.len(), 1, "{unenforced:?}");
    assert_eq!(unenforced[0].0, expected);
    assert!(unenforced[0].1 >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_run_of_consecutive_failures_counts_under_consecutive_failures() {
    let recorded = Recorded::new();
    let metrics = OutlierMetrics::new(&recorded.meter()).target("dns:///backends.test:443");
    let detection = OutlierDetection::builder()
        .consecutive_failures(Some(3))
        .failure_percentage(None);
    let outliers = calls(&[503, 503, 200], detection, metrics).await;

    let ejected = outliers.ejected();
    assert_eq!(ejected.len(), 1, "{ejected:?}");
    assert_eq!(ejected[0].reason, EjectionReason::ConsecutiveFailures);
    let method = [
        ("grpc.target", "dns:///backends.test:443"),
        (METHOD, "consecutive_failures"),
    ];
    assert_eq!(recorded.counts(ENFORCED), [(labels(&method), 1)]);
    // The second failing backend's run trips while the first is out: over the cap.
    let unenforced = recorded.counts(UNENFORCED);
    assert_eq!(unenforced.len(), 1, "{unenforced:?}");
    let mut expected = labels(&method);
    expected.insert(REASON.to_owned(), "max_ejection_overflow".to_owned());
    assert_eq!(unenforced[0].0, expected);
}
