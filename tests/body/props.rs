//! Property tests: random bodies, limits, readers and interleavings of polls.

use crate::support::*;
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, SizeHint};
use http_body_util::Full;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::sync::Arc;
use std::task::{Poll, Waker};
use tower_retry_hedge::body::{BufferLimits, NotReplayable, ReplayBody};

/// At most this many readers (attempts) live at once, besides the template.
const MAX_READERS: usize = 5;

#[derive(Clone, Debug)]
enum Op {
    /// Poll reader `n % live` (woken or not: polls may come at any time).
    Poll(usize),
    /// Clone reader `n % live`, or the template when `n % (live + 1) == live`.
    Clone(usize),
    /// Drop reader `n % live` (its record of what it sent is kept).
    Drop(usize),
    /// Let the source past one `Wait` step.
    Open,
    /// Commit the call, from the template: by `n % 3`, to live reader `n / 3 % live`, to
    /// dropped reader `n / 3 % dropped`, or to a reader id the body never gave out.
    Commit(usize),
}

#[derive(Clone, Debug)]
struct Case {
    chunks: Vec<Vec<u8>>,
    /// Before each chunk (and before the end): 0 nothing, 1 `Wait`, 2 `Yield`.
    pauses: Vec<u8>,
    trailers: bool,
    fail: bool,
    exact: bool,
    per_call: usize,
    total: usize,
    /// Bytes another call of the same layer holds in the budget.
    other: usize,
    ops: Vec<Op>,
}

fn limit() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..64, 0usize..400, Just(1 << 20)]
}

fn case(fail: bool) -> impl Strategy<Value = Case> {
    let op = prop_oneof![
        6 => any::<usize>().prop_map(Op::Poll),
        1 => any::<usize>().prop_map(Op::Clone),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => Just(Op::Open),
        1 => any::<usize>().prop_map(Op::Commit),
    ];
    (
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 0..10),
        prop::collection::vec(0u8..3, 11),
        any::<bool>(),
        any::<bool>(),
        limit(),
        limit(),
        0usize..64,
        prop::collection::vec(op, 0..120),
    )
        .prop_map(
            move |(chunks, pauses, trailers, exact, per_call, total, other, ops)| Case {
                chunks,
                pauses,
                trailers: trailers && !fail,
                fail,
                exact,
                per_call,
                total,
                other,
                ops,
            },
        )
}

impl Case {
    fn steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        let pause = |steps: &mut Vec<Step>, at: usize| match self.pauses.get(at) {
            Some(1) => steps.push(Step::Wait),
            Some(2) => steps.push(Step::Yield),
            _ => {}
        };
        for (at, chunk) in self.chunks.iter().enumerate() {
            pause(&mut steps, at);
            steps.push(Step::Data(Bytes::from(chunk.clone())));
        }
        pause(&mut steps, self.chunks.len());
        if self.trailers {
            steps.push(Step::Trailers(trailers("0")));
        }
        if self.fail {
            steps.push(Step::Fail("boom"));
        }
        steps
    }

    fn body(&self) -> Vec<u8> {
        self.chunks.concat()
    }

    fn trailers(&self) -> Option<HeaderMap> {
        self.trailers.then(|| trailers("0"))
    }
}

#[derive(Debug)]
enum Outcome {
    Open,
    Ended,
    SourceFailed,
    NotReplayable(NotReplayable),
}

struct Reader {
    /// The body, until the reader is dropped.
    body: Option<ReplayBody<Script>>,
    id: u64,
    woken: Arc<Count>,
    waker: Waker,
    /// Wakes seen when it was last polled.
    seen: usize,
    /// Its last poll was `Pending`.
    waiting: bool,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
    outcome: Outcome,
    /// (bytes sent so far, size hint) before each poll.
    hints: Vec<(usize, SizeHint)>,
}

impl Reader {
    fn new(body: ReplayBody<Script>) -> Reader {
        let (woken, waker) = counting_waker();
        Reader {
            id: body.reader_id(),
            body: Some(body),
            woken,
            waker,
            seen: 0,
            waiting: false,
            data: Vec::new(),
            trailers: None,
            outcome: Outcome::Open,
            hints: Vec::new(),
        }
    }

    fn runnable(&self) -> bool {
        matches!(self.outcome, Outcome::Open) && (!self.waiting || self.woken.get() > self.seen)
    }

    fn poll(&mut self) -> Result<(), TestCaseError> {
        let Some(body) = self.body.as_mut() else {
            return Ok(());
        };
        if !matches!(self.outcome, Outcome::Open) {
            return Ok(());
        }
        let hint = body.size_hint();
        let ended = body.is_end_stream();
        self.hints.push((self.data.len(), hint));
        self.seen = self.woken.get();
        let polled = poll(body, &self.waker);
        self.waiting = polled.is_pending();
        if ended {
            prop_assert!(
                matches!(polled, Poll::Ready(None)),
                "is_end_stream() said the end, the poll gave {polled:?}"
            );
        }
        match polled {
            Poll::Pending => {}
            Poll::Ready(None) => self.outcome = Outcome::Ended,
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => self.data.extend_from_slice(&data),
                Err(frame) => {
                    prop_assert!(self.trailers.is_none(), "trailers twice");
                    self.trailers = frame.into_trailers().ok();
                }
            },
            Poll::Ready(Some(Err(error))) => {
                self.outcome = match error.downcast::<NotReplayable>() {
                    Ok(error) => Outcome::NotReplayable(*error),
                    Err(error) => {
                        prop_assert_eq!(
                            error.downcast_ref::<SourceError>(),
                            Some(&SourceError("boom"))
                        );
                        Outcome::SourceFailed
                    }
                }
            }
        }
        prop_assert_eq!(body.bytes_read(), self.data.len() as u64);
        Ok(())
    }
}

fn run(case: Case) -> Result<(), TestCaseError> {
    let limits = BufferLimits::new(case.per_call, case.total);
    let original = case.body();
    let original_len = original.len();

    // Another call of the same layer, holding part of the total budget.
    let other = ReplayBody::try_new(Full::new(Bytes::from(vec![7u8; case.other])), &limits)
        .ok()
        .map(|mut other| {
            let _ = drain(&mut other);
            other
        });
    let held_by_other = limits.in_use();
    let room = case.per_call.min(case.total - held_by_other);

    let (script, gate) = Script::new(case.steps(), case.exact);
    let template = match ReplayBody::try_new(script, &limits) {
        Ok(template) => template,
        Err(mut script) => {
            prop_assert!(case.exact && original_len > room, "rejected for no reason");
            // Given back untouched.
            let mut sent = Vec::new();
            while let Poll::Ready(Some(Ok(frame))) = poll_script(&mut script, &gate) {
                if let Ok(data) = frame.into_data() {
                    sent.extend_from_slice(&data);
                }
            }
            prop_assert_eq!(sent, original);
            return Ok(());
        }
    };
    prop_assert!(!case.exact || original_len <= room);

    let mut readers = vec![Reader::new(template.clone())];
    let mut finished: Vec<Reader> = Vec::new();
    // The reader the test committed the call to, and the bytes recorded by then.
    let mut chosen: Option<(u64, usize)> = None;
    // The call committed with the whole body recorded (the source had ended): the record is
    // kept for every reader, until the last is dropped.
    let mut kept = false;
    let check_budget = |limits: &BufferLimits,
                        readers: &[Reader],
                        finished: &[Reader],
                        chosen: Option<(u64, usize)>,
                        kept: bool|
     -> Result<(), TestCaseError> {
        prop_assert!(limits.in_use() <= case.total);
        prop_assert!(limits.in_use() <= held_by_other + room);
        let held = limits.in_use() - held_by_other;
        let sent_most = readers
            .iter()
            .chain(finished)
            .map(|reader| reader.data.len())
            .max()
            .unwrap_or(0);
        match (template.committed_reader(), chosen) {
            // Everything pulled from the source is recorded, and nothing is freed.
            (None, _) => prop_assert_eq!(held, sent_most),
            // The whole body: kept as it was.
            (Some(_), Some((_, recorded))) if kept => prop_assert_eq!(held, recorded),
            // Only what the chosen reader has yet to send is held.
            (Some(_), Some((id, recorded))) => {
                // Dropped, the chosen reader needs nothing more.
                let rest = readers
                    .iter()
                    .chain(finished)
                    .find(|reader| reader.id == id && reader.body.is_some())
                    .map_or(0, |reader| recorded.saturating_sub(reader.data.len()));
                prop_assert_eq!(held, rest, "held after a commit to reader {}", id);
            }
            (Some(_), None) => {}
        }
        Ok(())
    };

    for op in &case.ops {
        match *op {
            Op::Poll(n) if !readers.is_empty() => {
                let at = n % readers.len();
                readers[at].poll()?;
            }
            Op::Clone(n) if readers.len() < MAX_READERS => {
                let at = n % (readers.len() + 1);
                let body = match readers.get(at).and_then(|reader| reader.body.as_ref()) {
                    Some(body) => body.clone(),
                    None => template.clone(),
                };
                readers.push(Reader::new(body));
            }
            Op::Drop(n) if !readers.is_empty() => {
                let at = n % readers.len();
                let mut reader = readers.swap_remove(at);
                reader.body = None;
                finished.push(reader);
            }
            Op::Open => gate.open(),
            Op::Commit(n) => {
                let pick = |from: &[Reader]| {
                    let at = n / 3 % from.len().max(1);
                    from.get(at).map(|reader| reader.id)
                };
                let target = match n % 3 {
                    0 => pick(&readers),
                    1 => pick(&finished),
                    _ => None,
                };
                let before = template.committed_reader();
                match target {
                    Some(id) => {
                        let committed = template.commit_to(id);
                        prop_assert_eq!(committed, before.is_none_or(|reader| reader == id));
                        if before.is_none() {
                            let recorded = readers
                                .iter()
                                .chain(&finished)
                                .map(|reader| reader.data.len())
                                .max()
                                .unwrap_or(0);
                            chosen = Some((id, recorded));
                            // The record holds the whole body once the source has ended
                            // (and is gone): a reader saw its end, or it said it had ended
                            // with its last frame.
                            kept = !gate.source_alive();
                        }
                    }
                    None => {
                        prop_assert!(!template.commit_to(u64::MAX), "no such reader");
                        prop_assert_eq!(template.committed_reader(), before);
                    }
                }
            }
            _ => {}
        }
        check_budget(&limits, &readers, &finished, chosen, kept)?;
    }

    // Drive every live reader to its end as an executor would: poll only readers that were
    // woken, and open the source when no one can run. A lost wake-up leaves a reader open.
    for _ in 0..10_000 {
        if let Some(reader) = readers.iter_mut().find(|reader| reader.runnable()) {
            reader.poll()?;
            check_budget(&limits, &readers, &finished, chosen, kept)?;
        } else if gate.is_waiting() {
            gate.open();
        } else {
            break;
        }
    }
    for reader in &readers {
        prop_assert!(
            !matches!(reader.outcome, Outcome::Open),
            "reader {} was never woken",
            reader.id
        );
    }

    let committed = template.committed_reader();
    prop_assert_eq!(template.is_committed(), committed.is_some());
    let over_limit = original_len > room;
    let mut source_errors = 0;
    for reader in readers.iter().chain(&finished) {
        prop_assert!(
            original.starts_with(&reader.data),
            "sent bytes that are not the body's"
        );
        match &reader.outcome {
            Outcome::Open => {}
            Outcome::Ended => {
                prop_assert!(!case.fail);
                prop_assert_eq!(&reader.data, &original);
                prop_assert_eq!(&reader.trailers, &case.trailers());
                // Each size hint was right about what came after it.
                for (sent, hint) in &reader.hints {
                    let rest = (original_len - sent) as u64;
                    prop_assert!(hint.lower() <= rest, "{hint:?} over {rest}");
                    prop_assert!(hint.upper().is_none_or(|upper| rest <= upper));
                    if case.exact {
                        prop_assert_eq!(hint.exact(), Some(rest));
                    }
                }
            }
            Outcome::SourceFailed => {
                source_errors += 1;
                prop_assert!(case.fail);
                prop_assert_eq!(reader.data.len(), original_len);
            }
            Outcome::NotReplayable(error) => {
                prop_assert!(committed.is_some());
                prop_assert_ne!(committed, Some(reader.id));
                if error.is_over_limit() {
                    prop_assert!(over_limit, "failed with the body inside the limits");
                } else if error.is_source_failure() {
                    prop_assert!(case.fail);
                } else {
                    prop_assert!(chosen.is_some(), "excluded with no commit chosen");
                }
            }
        }
    }
    prop_assert!(
        source_errors <= 1,
        "the source error went to one reader only"
    );
    if source_errors == 1 {
        prop_assert_eq!(
            limits.in_use(),
            held_by_other,
            "the record is freed on error"
        );
    }
    if committed.is_some() && !case.fail {
        prop_assert!(
            over_limit || chosen.is_some(),
            "committed with the body inside the limits"
        );
        if !kept {
            prop_assert_eq!(
                limits.in_use(),
                held_by_other,
                "the record is freed on commit"
            );
        }
    }

    drop(readers);
    drop(finished);
    drop(template);
    prop_assert_eq!(limits.in_use(), held_by_other);
    drop(other);
    prop_assert_eq!(limits.in_use(), 0);
    prop_assert!(!gate.source_alive());
    Ok(())
}

fn poll_script(
    script: &mut Script,
    gate: &Gate,
) -> Poll<Option<Result<http_body::Frame<Bytes>, SourceError>>> {
    loop {
        if script.is_end_stream() {
            return Poll::Ready(None);
        }
        let polled = std::pin::Pin::new(&mut *script)
            .poll_frame(&mut std::task::Context::from_waker(Waker::noop()));
        match polled {
            Poll::Pending if gate.is_waiting() => gate.open(),
            Poll::Pending => {}
            other => return other,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        // Beside this file, not in a `proptest-regressions/` shared with other test targets.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/body/proptest-regressions.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_reader_sends_the_body_or_fails_for_a_reason(case in case(false)) {
        run(case)?;
    }

    #[test]
    fn a_failing_source_fails_every_reader_once(case in case(true)) {
        run(case)?;
    }
}
