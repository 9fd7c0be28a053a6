//! What the balancer learns of each backend from its answers, read with the crate's
//! classifiers: the counts of the current interval (gRFC A50's call counter) and the run of
//! consecutive failures.
//!
//! A [`Health`] is shared by the balancer (which reads it to pick and to eject) and by the
//! response futures and bodies of the attempts sent to its backend (which record into it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http::{HeaderMap, StatusCode};

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
    /// How answers are classified.
    pub(crate) failures: Failures,
}

impl HealthRules {
    pub(crate) fn new(consecutive_failures: Option<u32>, failure_codes: GrpcCodes) -> HealthRules {
        HealthRules {
            tripped: AtomicBool::new(false),
            consecutive_failures,
            failures: Failures::new(failure_codes),
        }
    }

    /// Whether a backend tripped since the last call; clears the flag.
    pub(crate) fn take_tripped(&self) -> bool {
        // Checked first without a write: the flag is almost always clear.
        self.tripped.load(Ordering::Relaxed) && self.tripped.swap(false, Ordering::AcqRel)
    }
}

/// One backend's record, shared by the balancer and the attempts in flight on it.
#[derive(Debug)]
pub(crate) struct Health {
    stats: Mutex<Tally>,
    /// Written by the balancer only; read by the picker.
    ejected: AtomicBool,
    shared: Arc<HealthRules>,
}

#[derive(Debug, Default)]
struct Tally {
    /// The answers of the current interval (A50's active bucket).
    counts: IntervalCounts,
    /// Failures since the last success.
    consecutive: u32,
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
    pub(crate) fn new(shared: Arc<HealthRules>) -> Health {
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

    /// Records an attempt's answer.
    pub(crate) fn record(&self, verdict: Score) {
        let mut stats = self.lock();
        match verdict {
            Score::Success => {
                stats.counts.successes += 1;
                stats.consecutive = 0;
            }
            Score::Failure => {
                stats.counts.failures += 1;
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

    /// The share of failures among the answers of the current interval (0 without any).
    pub(crate) fn failure_ratio(&self) -> f64 {
        let counts = self.lock().counts;
        if counts.failures > 0 {
            counts.failures as f64 / counts.volume() as f64
        } else {
            0.0
        }
    }

    /// Whether its successes in the current interval outnumber its failures.
    pub(crate) fn does_well(&self) -> bool {
        let counts = self.lock().counts;
        counts.successes > counts.failures
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
        std::mem::take(&mut self.lock().counts)
    }

    pub(crate) fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Ejects the backend: its run of failures starts again.
    pub(crate) fn eject(&self) {
        self.ejected.store(true, Ordering::Relaxed);
        self.lock().consecutive = 0;
    }

    /// Brings the backend back into rotation.
    pub(crate) fn un_eject(&self) {
        self.lock().consecutive = 0;
        self.ejected.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(consecutive: Option<u32>) -> Health {
        Health::new(Arc::new(HealthRules::new(
            consecutive,
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
    fn a_run_of_failures_trips_the_shared_flag_once_per_failure_at_the_limit() {
        let health = health(Some(3));
        health.record(Score::Failure);
        health.record(Score::Failure);
        health.record(Score::Success);
        health.record(Score::Failure);
        health.record(Score::Failure);
        assert!(!health.shared.take_tripped());
        health.record(Score::Failure);
        assert!(health.is_tripped());
        assert!(health.shared.take_tripped());
        assert!(!health.shared.take_tripped(), "taken once");
        // Ejected, its run starts again; its failures do not trip the flag meanwhile.
        health.eject();
        assert!(!health.is_tripped());
        for _ in 0..5 {
            health.record(Score::Failure);
        }
        assert!(!health.shared.take_tripped());
        assert_eq!(health.failure_ratio(), 10.0 / 11.0);
        assert!(!health.does_well());
        assert_eq!(
            health.swap_counts(),
            IntervalCounts {
                successes: 1,
                failures: 10
            }
        );
        assert_eq!(health.swap_counts(), IntervalCounts::default());
        assert_eq!(health.failure_ratio(), 0.0);
        // Back in rotation, its run starts again.
        health.un_eject();
        assert!(!health.is_ejected());
        assert_eq!(health.consecutive_failures(), 0);
        health.record(Score::Success);
        assert!(health.does_well());
    }
}
