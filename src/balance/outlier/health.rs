//! What the balancer learns of each backend from its answers: the counts of the current
//! interval (gRFC A50's call counter), the run of consecutive failures, and recent failures
//! and successes that fade with time, which weigh the power-of-two choice.
//!
//! A [`Health`] is shared by the balancer (which reads it to pick and to eject) and by the
//! response futures and bodies of the attempts sent to its backend (which record into it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use crate::classify::{
    AttemptResult, Classify, Code, GrpcCodes, HttpStatuses, Outcome, header_status,
    is_grpc_content_type,
};

/// How an attempt's answer counts for its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Score {
    Success,
    Failure,
}

impl Score {
    /// How the crate's classification of an answer counts for the backend that gave it: a
    /// failure in the classifier's set (retryable), or an attempt that never reached the
    /// backend's application (not sent, refused), is the backend's failure; a success, or a
    /// fatal answer (which speaks of the request, not of the backend), is not.
    fn of(outcome: Outcome) -> Score {
        match outcome {
            Outcome::Success | Outcome::Fatal(_) => Score::Success,
            Outcome::Retryable(_) | Outcome::NotSent | Outcome::Refused => Score::Failure,
        }
    }
}

/// What a response's head says, before its body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadScore {
    /// The head decides: a status in the headers (Trailers-Only), an HTTP status, or a
    /// response that is not gRPC.
    Settled(Score),
    /// A gRPC response that has begun: its status comes in the trailers.
    Trailers,
}

/// The crate's classifiers, as the balancer reads its backends' answers with them: the gRPC
/// classifier ([`GrpcCodes`]) over the failure codes for gRPC answers and errors, and the
/// HTTP classifier ([`HttpStatuses`]) over 5xx and 429 for answers that are not gRPC.
#[derive(Debug, Clone)]
pub(crate) struct Failures {
    grpc: GrpcCodes,
    http: HttpStatuses,
}

impl Failures {
    pub(crate) fn new(codes: GrpcCodes) -> Failures {
        let server_errors = (500..600).filter_map(|code| StatusCode::from_u16(code).ok());
        let http = server_errors
            .chain([StatusCode::TOO_MANY_REQUESTS])
            .fold(HttpStatuses::none(), HttpStatuses::with);
        Failures { grpc: codes, http }
    }

    /// Classifies a response head: a gRPC answer (a `grpc-status` in the headers, or a gRPC
    /// content type) with the gRPC classifier, which reads the status of a Trailers-Only
    /// response, or the gRPC mapping of a non-200 one; a gRPC response that has begun (status
    /// 200, no `grpc-status`) waits for its trailers; any other answer with the HTTP
    /// classifier.
    pub(crate) fn head(&self, status: StatusCode, headers: &HeaderMap) -> HeadScore {
        let result = AttemptResult::Response { status, headers };
        if header_status(headers).is_none() {
            if !is_grpc_content_type(headers.get(http::header::CONTENT_TYPE)) {
                // 425 Too Early is a refusal to the layers (resent as it is), but it speaks of
                // the request's early data, not of the backend: only 5xx and 429 fail.
                let score = match self.http.classify(result) {
                    Outcome::Refused => Score::Success,
                    outcome => Score::of(outcome),
                };
                return HeadScore::Settled(score);
            }
            if status == StatusCode::OK {
                return HeadScore::Trailers;
            }
        }
        HeadScore::Settled(Score::of(self.grpc.classify(result)))
    }

    /// Classifies the trailers of a gRPC response as the gRPC classifier reads a
    /// Trailers-Only response: none counts as a success (nothing says the backend failed).
    pub(crate) fn trailers(&self, trailers: &HeaderMap) -> Score {
        let result = AttemptResult::Response {
            status: StatusCode::OK,
            headers: trailers,
        };
        Score::of(self.grpc.classify(result))
    }

    /// Classifies an error of the endpoint's service with the gRPC classifier: not sent or
    /// refused, or else `UNAVAILABLE`.
    pub(crate) fn error(&self, error: &(dyn std::error::Error + Send + Sync + 'static)) -> Score {
        Score::of(self.grpc.classify(AttemptResult::Error(error)))
    }

    /// Classifies a body that broke off before its trailers: `UNAVAILABLE`, as the gRPC
    /// classifier reads an error that proves nothing more.
    pub(crate) fn broken_body(&self) -> Score {
        let result = AttemptResult::Status {
            code: Code::Unavailable,
            pushback: None,
        };
        Score::of(self.grpc.classify(result))
    }
}

/// What every backend's [`Health`] of one balancer shares: the settings the recording side
/// needs, and the flag that tells the balancer a backend reached its run of failures.
#[derive(Debug)]
pub(crate) struct HealthRules {
    /// Set when a backend's run of consecutive failures reaches the limit.
    tripped: AtomicBool,
    /// The run of consecutive failures that trips a backend; `None`: never.
    consecutive_failures: Option<u32>,
    /// The half-life of recent failures and successes, in seconds.
    half_life_secs: f64,
    /// How answers are classified.
    pub(crate) failures: Failures,
}

impl HealthRules {
    pub(crate) fn new(
        consecutive_failures: Option<u32>,
        half_life: Duration,
        failure_codes: GrpcCodes,
    ) -> HealthRules {
        HealthRules {
            tripped: AtomicBool::new(false),
            consecutive_failures,
            half_life_secs: half_life.as_secs_f64(),
            failures: Failures::new(failure_codes),
        }
    }

    /// Whether a backend tripped since the last call; clears the flag.
    pub(crate) fn take_tripped(&self) -> bool {
        // Checked first without a write: the flag is almost always clear.
        self.tripped.load(Ordering::Relaxed) && self.tripped.swap(false, Ordering::AcqRel)
    }
}

/// The longest run of failures that lowers a backend's weight: 1/100 at most. A backend that
/// cannot be ejected keeps a little traffic from its run, so that a recovery shows; its
/// recent failures, which fade, weigh it down further while it keeps failing.
pub(crate) const MAX_RUN_WEIGHED: u32 = 9;

/// One backend's record, shared by the balancer and the attempts in flight on it.
#[derive(Debug)]
pub(crate) struct Health {
    stats: Mutex<Tally>,
    /// Written by the balancer only; read by the picker.
    ejected: AtomicBool,
    shared: std::sync::Arc<HealthRules>,
}

#[derive(Debug, Default)]
struct Tally {
    /// The answers of the current interval (A50's active bucket).
    successes: u64,
    failures: u64,
    /// Failures since the last success.
    consecutive: u32,
    /// Recent successes and failures, each fading by half every half-life, as of `at`.
    recent_successes: f64,
    recent_failures: f64,
    at: Option<Instant>,
}

impl Tally {
    /// How much of what was recorded by `at` is left at `now`.
    fn fade(&self, now: Instant, half_life_secs: f64) -> f64 {
        match self.at {
            Some(at) if now > at => (-(now - at).as_secs_f64() / half_life_secs).exp2(),
            _ => 1.0,
        }
    }

    /// The recent counts as of `now`, faded.
    fn recent(&self, now: Instant, half_life_secs: f64) -> (f64, f64) {
        let fade = self.fade(now, half_life_secs);
        (self.recent_successes * fade, self.recent_failures * fade)
    }

    fn fade_to(&mut self, now: Instant, half_life_secs: f64) {
        let (successes, failures) = self.recent(now, half_life_secs);
        self.recent_successes = successes;
        self.recent_failures = failures;
        self.at = Some(self.at.map_or(now, |at| at.max(now)));
    }
}

/// A backend's answers in one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IntervalCounts {
    pub(crate) successes: u64,
    pub(crate) failures: u64,
}

impl IntervalCounts {
    pub(crate) fn volume(self) -> u64 {
        self.successes + self.failures
    }
}

impl Health {
    pub(crate) fn new(shared: std::sync::Arc<HealthRules>) -> Health {
        Health {
            stats: Mutex::new(Tally::default()),
            ejected: AtomicBool::new(false),
            shared,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Tally> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How this backend's answers are classified.
    pub(crate) fn failures(&self) -> &Failures {
        &self.shared.failures
    }

    /// Records an attempt's answer, at tokio's `now`.
    pub(crate) fn record(&self, verdict: Score) {
        self.record_at(verdict, Instant::now());
    }

    pub(crate) fn record_at(&self, verdict: Score, now: Instant) {
        let mut stats = self.lock();
        stats.fade_to(now, self.shared.half_life_secs);
        match verdict {
            Score::Success => {
                stats.successes += 1;
                stats.recent_successes += 1.0;
                stats.consecutive = 0;
            }
            Score::Failure => {
                stats.failures += 1;
                stats.recent_failures += 1.0;
                stats.consecutive = stats.consecutive.saturating_add(1);
                let tripped = self
                    .shared
                    .consecutive_failures
                    .is_some_and(|limit| stats.consecutive >= limit);
                if tripped && !self.is_ejected() {
                    self.shared.tripped.store(true, Ordering::Release);
                }
            }
        }
    }

    /// The weight of this backend in a draw it would win on load, in (0, 1]: the lower of
    /// `((s + 1) / (f + s + 1))²`, of its recent successes `s` and failures `f`, and
    /// `1 / (1 + r)²`, of its run `r` of failures since the last success (counted up to
    /// [`MAX_RUN_WEIGHED`]); all three fade with time. 1 with no recent failure; 1/4 just
    /// after one failure; 1/36 just after five in a row, however many successes came before.
    pub(crate) fn weight(&self, now: Instant) -> f64 {
        let stats = self.lock();
        if stats.recent_failures == 0.0 && stats.consecutive == 0 {
            return 1.0;
        }
        let fade = stats.fade(now, self.shared.half_life_secs);
        let (successes, failures) = (stats.recent_successes * fade, stats.recent_failures * fade);
        let run = f64::from(stats.consecutive.min(MAX_RUN_WEIGHED)) * fade;
        drop(stats);
        let share = (successes + 1.0) / (failures + successes + 1.0);
        let run_share = 1.0 / (1.0 + run);
        let share = share.min(run_share);
        share * share
    }

    /// The share of failures among recent answers (0 without any).
    pub(crate) fn failure_ratio(&self, now: Instant) -> f64 {
        let (successes, failures) = self.lock().recent(now, self.shared.half_life_secs);
        if failures > 0.0 {
            failures / (failures + successes)
        } else {
            0.0
        }
    }

    /// Whether its recent successes outnumber its recent failures.
    pub(crate) fn does_well(&self, now: Instant) -> bool {
        let (successes, failures) = self.lock().recent(now, self.shared.half_life_secs);
        successes > failures
    }

    /// Failures since the last success.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.lock().consecutive
    }

    /// Whether the run of consecutive failures reached the limit.
    pub(crate) fn is_tripped(&self) -> bool {
        let consecutive = self.consecutive_failures();
        self.shared
            .consecutive_failures
            .is_some_and(|limit| consecutive >= limit)
    }

    /// The counts of the interval that ends, and a fresh interval (A50's bucket swap).
    pub(crate) fn swap_counts(&self) -> IntervalCounts {
        let mut stats = self.lock();
        let counts = IntervalCounts {
            successes: stats.successes,
            failures: stats.failures,
        };
        stats.successes = 0;
        stats.failures = 0;
        counts
    }

    pub(crate) fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Ejects the backend: its run of failures starts again.
    pub(crate) fn eject(&self) {
        self.ejected.store(true, Ordering::Relaxed);
        self.lock().consecutive = 0;
    }

    /// Brings the backend back on probation: as if it had just failed once, and nothing
    /// else, so that it wins a quarter of the draws it would win on load until it answers
    /// well (or the failure fades).
    pub(crate) fn un_eject(&self, now: Instant) {
        let mut stats = self.lock();
        stats.consecutive = 0;
        stats.recent_successes = 0.0;
        stats.recent_failures = 1.0;
        stats.at = Some(now);
        drop(stats);
        self.ejected.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn health(consecutive: Option<u32>) -> Health {
        Health::new(Arc::new(HealthRules::new(
            consecutive,
            Duration::from_secs(1),
            GrpcCodes::from([Code::Unavailable, Code::Internal]),
        )))
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, http::HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn answers_are_classified_as_the_layers_classify_attempts() {
        let failures = Failures::new(GrpcCodes::from([Code::Unavailable]));
        let grpc = ("content-type", "application/grpc");
        let head = |status: u16, pairs: &[(&'static str, &'static str)]| {
            failures.head(StatusCode::from_u16(status).unwrap(), &headers(pairs))
        };
        let failed = HeadScore::Settled(Score::Failure);
        let succeeded = HeadScore::Settled(Score::Success);
        // Trailers-Only: the status in the headers decides, by the failure codes.
        assert_eq!(head(200, &[grpc, ("grpc-status", "14")]), failed);
        assert_eq!(head(200, &[grpc, ("grpc-status", "5")]), succeeded);
        assert_eq!(head(200, &[grpc, ("grpc-status", "0")]), succeeded);
        assert_eq!(head(200, &[("grpc-status", "14")]), failed);
        // A begun gRPC response waits for its trailers.
        assert_eq!(head(200, &[grpc]), HeadScore::Trailers);
        assert_eq!(
            head(200, &[("content-type", "application/grpc+proto")]),
            HeadScore::Trailers
        );
        // A gRPC response of another HTTP status: gRPC's mapping (503 is UNAVAILABLE, 500
        // UNKNOWN, 404 UNIMPLEMENTED), by the failure codes.
        assert_eq!(head(503, &[grpc]), failed);
        assert_eq!(head(500, &[grpc]), succeeded);
        assert_eq!(head(404, &[grpc]), succeeded);
        let wider = Failures::new(GrpcCodes::from([Code::Unknown, Code::Unimplemented]));
        let status = |status: u16| StatusCode::from_u16(status).unwrap();
        assert_eq!(wider.head(status(500), &headers(&[grpc])), failed);
        assert_eq!(wider.head(status(404), &headers(&[grpc])), failed);
        // The content type is tested as the layers test a request's: `application/grpc-web`
        // (whose status comes in the body) and look-alikes are not gRPC.
        assert_eq!(
            head(200, &[("content-type", "application/grpc-web")]),
            succeeded
        );
        assert_eq!(
            head(200, &[("content-type", "application/grpcx")]),
            succeeded
        );
        // Not gRPC: 5xx and 429 fail, anything else succeeds.
        assert_eq!(head(503, &[]), failed);
        assert_eq!(head(500, &[]), failed);
        assert_eq!(head(599, &[]), failed);
        assert_eq!(head(429, &[]), failed);
        assert_eq!(head(425, &[]), succeeded);
        assert_eq!(head(404, &[]), succeeded);
        assert_eq!(head(200, &[]), succeeded);
        // The trailers of a begun response.
        let trailers = |pairs: &[(&'static str, &'static str)]| failures.trailers(&headers(pairs));
        assert_eq!(trailers(&[("grpc-status", "14")]), Score::Failure);
        assert_eq!(trailers(&[("grpc-status", "0")]), Score::Success);
        assert_eq!(trailers(&[]), Score::Success);
        // An unparseable status is UNKNOWN.
        assert_eq!(
            wider.trailers(&headers(&[("grpc-status", "x")])),
            Score::Failure
        );
        // Errors: a connection refused is not sent, and fails whatever the codes; any other
        // error, and a broken body, is UNAVAILABLE.
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(failures.error(&refused), Score::Failure);
        assert_eq!(wider.error(&refused), Score::Failure);
        assert_eq!(failures.error(&reset), Score::Failure);
        assert_eq!(wider.error(&reset), Score::Success);
        assert_eq!(failures.broken_body(), Score::Failure);
        assert_eq!(wider.broken_body(), Score::Success);
    }

    #[test]
    fn the_weight_falls_with_failures_and_comes_back_with_successes_and_time() {
        let health = health(None);
        let now = Instant::now();
        assert_eq!(health.weight(now), 1.0);
        health.record_at(Score::Failure, now);
        assert_eq!(health.weight(now), 0.25);
        for _ in 0..4 {
            health.record_at(Score::Failure, now);
        }
        assert!((health.weight(now) - 1.0 / 36.0).abs() < 1e-12);
        // Successes bring it back.
        for _ in 0..50 {
            health.record_at(Score::Success, now);
        }
        assert!(health.weight(now) > 0.8, "{}", health.weight(now));
        // A run of failures weighs at once, whatever came before it...
        for _ in 0..5 {
            health.record_at(Score::Failure, now);
        }
        assert!((health.weight(now) - 1.0 / 36.0).abs() < 1e-12);
        // ... down to 1/100 for the run alone.
        let fresh = self::health(None);
        for _ in 0..1_000 {
            fresh.record_at(Score::Success, now);
        }
        for _ in 0..30 {
            fresh.record_at(Score::Failure, now);
        }
        assert!(
            (fresh.weight(now) - 0.01).abs() < 1e-12,
            "{}",
            fresh.weight(now)
        );
        // So does time: ten half-lives later, the failures weigh almost nothing.
        let health = self::health(None);
        health.record_at(Score::Failure, now);
        let later = now + Duration::from_secs(10);
        assert!(health.weight(later) > 0.99, "{}", health.weight(later));
        // The ratio of what is left is still all failures; it does not do well.
        assert_eq!(health.failure_ratio(later), 1.0);
        assert!(!health.does_well(later));
        health.record_at(Score::Success, later);
        assert!(health.does_well(later));
    }

    #[test]
    fn a_run_of_failures_trips_the_shared_flag_once_per_failure_at_the_limit() {
        let health = health(Some(3));
        let now = Instant::now();
        health.record_at(Score::Failure, now);
        health.record_at(Score::Failure, now);
        health.record_at(Score::Success, now);
        health.record_at(Score::Failure, now);
        health.record_at(Score::Failure, now);
        assert!(!health.shared.take_tripped());
        health.record_at(Score::Failure, now);
        assert!(health.is_tripped());
        assert!(health.shared.take_tripped());
        assert!(!health.shared.take_tripped(), "taken once");
        // Ejected, its run starts again; its failures do not trip the flag meanwhile.
        health.eject();
        assert!(!health.is_tripped());
        for _ in 0..5 {
            health.record_at(Score::Failure, now);
        }
        assert!(!health.shared.take_tripped());
        assert_eq!(
            health.swap_counts(),
            IntervalCounts {
                successes: 1,
                failures: 10
            }
        );
        assert_eq!(health.swap_counts(), IntervalCounts::default());
    }

    #[test]
    fn a_backend_back_from_ejection_is_on_probation() {
        let health = health(Some(3));
        let now = Instant::now();
        health.eject();
        assert!(health.is_ejected());
        health.un_eject(now);
        assert!(!health.is_ejected());
        assert_eq!(health.weight(now), 0.25);
        health.record_at(Score::Success, now);
        assert!(health.weight(now) > 0.25);
    }
}
