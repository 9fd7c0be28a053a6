//! `ReplayBody`: one scripted source, several readers (clones) polled in any order, any
//! limits, readers cloned, dropped and committed at any time.
//!
//! Checked after every step:
//! - what each reader has sent is a prefix of the source's bytes; a reader that reaches its
//!   end has sent exactly the source's bytes, then its trailers (if it had any);
//! - only `NotReplayable` and the source's own error come out, the source's error to at most
//!   one reader; a reader that has ended stays ended;
//! - `size_hint` is exact for a reader still reading an exact source, and never contradicts
//!   what is left; `is_end_stream` is never true before the last frame;
//! - the budget never holds more than the total, nor more than one call's limit for this
//!   call;
//!
//! and at the end, with the source left free to run: no reader waits for a wake-up that never
//! comes; readers of a call that was never committed all finish, as does the one a call was
//! committed to, and every reader of a call committed when the record held the whole body;
//! the reader a call was committed to holds no bytes once it has finished, unless the record
//! was whole at the commit (then it is kept for the other readers); once every reader is
//! dropped, the budget is back to 0.

#![no_main]

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use libfuzzer_sys::fuzz_target;
use tower_retry_hedge::body::{BoxError, BufferLimits, NotReplayable, ReplayBody};

/// At most this many readers live at once.
const MAX_READERS: usize = 8;
/// Polls allowed in the final drain before the body is declared stuck in a loop.
const MAX_DRAIN_POLLS: usize = 100_000;

#[derive(Arbitrary, Clone, Debug)]
enum Step {
    Data(Vec<u8>),
    /// `Pending` until the test opens the gate once.
    Wait,
    /// `Pending`, waking the poller at once.
    Yield,
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Eos,
    Trailers,
    Fail,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Poll(u8),
    Clone(u8),
    Drop(u8),
    Commit(u8),
    Open,
    Inspect(u8),
}

#[derive(Arbitrary, Debug)]
struct Case {
    steps: Vec<Step>,
    end: End,
    /// The source reports an exact size hint and its end; else it knows nothing of itself.
    exact: bool,
    per_call: u16,
    total: u16,
    /// Bytes another call sharing the budget records first.
    other: u16,
    ops: Vec<Op>,
}

/// Small limits are where the rules bite; large ones are the everyday case.
fn limit(raw: u16) -> usize {
    match raw >> 14 {
        0 => usize::from(raw & 0x3f),
        1 => usize::from(raw & 0x3ff),
        _ => 1 << 20,
    }
}

#[derive(Debug, PartialEq, Eq)]
struct SourceError;

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("scripted source failure")
    }
}

impl std::error::Error for SourceError {}

#[derive(Default)]
struct Gate {
    opened: usize,
    always: bool,
    waker: Option<Waker>,
}

enum Item {
    Step(Step),
    End(End),
}

/// The source body: plays the steps, then the end.
struct Script {
    items: VecDeque<Item>,
    gate: Arc<Mutex<Gate>>,
    exact: bool,
    remaining: u64,
    ended: bool,
    /// Set once the body knows the source ended whole (Eos or trailers): it gave its end,
    /// or its last bytes while saying it had ended (`is_end_stream`), which the body checks
    /// after recording them.
    whole: Arc<AtomicBool>,
    /// Set once the script says it has ended (`is_end_stream`).
    at_end: Arc<AtomicBool>,
}

fn trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers
}

impl Body for Script {
    type Data = Bytes;
    type Error = SourceError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SourceError>>> {
        assert!(!self.ended, "the source was polled after its end");
        let polled = self.play(cx);
        // The body may learn of this end without polling again, from `is_end_stream`.
        if self.is_end_stream() {
            self.at_end.store(true, Ordering::SeqCst);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.exact
            && (self.ended
                || self
                    .items
                    .iter()
                    .all(|item| matches!(item, Item::End(End::Eos))))
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.remaining)
        } else {
            SizeHint::default()
        }
    }
}

impl Script {
    fn play(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, SourceError>>> {
        loop {
            let Some(item) = self.items.pop_front() else {
                self.ended = true;
                self.whole.store(true, Ordering::SeqCst);
                return Poll::Ready(None);
            };
            match item {
                Item::Step(Step::Data(data)) => {
                    self.remaining -= data.len() as u64;
                    if !data.is_empty() && self.is_end_stream() {
                        self.whole.store(true, Ordering::SeqCst);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(data)))));
                }
                Item::Step(Step::Wait) => {
                    let mut gate = self.gate.lock().unwrap();
                    if gate.always {
                        continue;
                    }
                    if gate.opened > 0 {
                        gate.opened -= 1;
                        continue;
                    }
                    gate.waker = Some(cx.waker().clone());
                    drop(gate);
                    self.items.push_front(Item::Step(Step::Wait));
                    return Poll::Pending;
                }
                Item::Step(Step::Yield) => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Item::End(End::Eos) => {}
                Item::End(End::Trailers) => {
                    self.ended = true;
                    self.whole.store(true, Ordering::SeqCst);
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers()))));
                }
                Item::End(End::Fail) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(SourceError)));
                }
            }
        }
    }
}

#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Reading,
    Completed,
    NotReplayable,
    SourceFailed,
}

struct Reader {
    body: ReplayBody<Script>,
    woken: Arc<Flag>,
    waker: Waker,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
    status: Status,
    /// The last poll returned `Pending`.
    pending: bool,
}

impl Reader {
    fn new(body: ReplayBody<Script>) -> Reader {
        let woken = Arc::new(Flag::default());
        let waker = Waker::from(Arc::clone(&woken));
        Reader {
            body,
            woken,
            waker,
            data: Vec::new(),
            trailers: None,
            status: Status::Reading,
            pending: false,
        }
    }

    fn woken(&self) -> bool {
        self.woken.0.load(Ordering::SeqCst)
    }
}

/// What the source sends, and the checks every reader is held to.
struct Expected {
    data: Vec<u8>,
    end: End,
    exact: bool,
    source_errors: usize,
}

impl Expected {
    fn check_hint(&self, reader: &Reader) {
        let hint = reader.body.size_hint();
        if let Some(upper) = hint.upper() {
            assert!(hint.lower() <= upper, "size hint {hint:?}");
        }
        assert_eq!(reader.body.bytes_read(), reader.data.len() as u64);
        let excluded = reader
            .body
            .committed_reader()
            .is_some_and(|id| id != reader.body.reader_id());
        if reader.status != Status::Reading || excluded {
            return;
        }
        let left = (self.data.len() - reader.data.len()) as u64;
        if self.exact {
            assert_eq!(
                hint.exact(),
                Some(left),
                "size hint {hint:?}, {left} bytes left"
            );
        } else {
            assert!(
                hint.lower() <= left,
                "size hint {hint:?}, {left} bytes left"
            );
            assert!(hint.upper().is_none_or(|upper| upper >= left));
        }
    }

    fn poll(&mut self, reader: &mut Reader) {
        self.check_hint(reader);
        let ended = reader.body.is_end_stream();
        if ended && reader.status == Status::Reading {
            // Nothing may be left to send: no bytes, and no trailers.
            assert_eq!(reader.data, self.data, "is_end_stream before the last byte");
            assert!(
                self.end == End::Eos || reader.trailers.is_some(),
                "is_end_stream before the trailers"
            );
        }
        reader.woken.0.store(false, Ordering::SeqCst);
        let mut cx = Context::from_waker(&reader.waker);
        let polled = Pin::new(&mut reader.body).poll_frame(&mut cx);
        reader.pending = polled.is_pending();
        if ended {
            assert!(
                matches!(polled, Poll::Ready(None)),
                "is_end_stream was true, then the body sent {polled:?}"
            );
        }
        match polled {
            Poll::Pending => assert_eq!(reader.status, Status::Reading, "pending after the end"),
            Poll::Ready(None) => {
                if reader.status == Status::Reading {
                    assert_ne!(self.end, End::Fail, "a reader finished a failed source");
                    assert_eq!(reader.data, self.data, "a reader finished early");
                    assert_eq!(
                        reader.trailers.is_some(),
                        self.end == End::Trailers,
                        "trailers missing or unexpected"
                    );
                    reader.status = Status::Completed;
                }
            }
            Poll::Ready(Some(frame)) => {
                assert_eq!(
                    reader.status,
                    Status::Reading,
                    "a frame after the end: {frame:?}"
                );
                assert!(
                    reader.trailers.is_none(),
                    "a frame after the trailers: {frame:?}"
                );
                match frame {
                    Ok(frame) => match frame.into_data() {
                        Ok(data) => {
                            reader.data.extend_from_slice(&data);
                            assert!(
                                self.data.starts_with(&reader.data),
                                "a reader sent bytes the source did not"
                            );
                        }
                        Err(frame) => {
                            let Ok(trailers) = frame.into_trailers() else {
                                panic!("a frame neither data nor trailers");
                            };
                            assert_eq!(self.end, End::Trailers, "trailers the source did not send");
                            assert_eq!(reader.data, self.data, "trailers before the last byte");
                            assert_eq!(trailers, self::trailers());
                            reader.trailers = Some(trailers);
                        }
                    },
                    Err(error) => self.failed(reader, error),
                }
            }
        }
    }

    fn failed(&mut self, reader: &mut Reader, error: BoxError) {
        if error.is::<NotReplayable>() {
            reader.status = Status::NotReplayable;
        } else if error.is::<SourceError>() {
            assert_eq!(
                self.end,
                End::Fail,
                "a source error from a source that did not fail"
            );
            assert_eq!(
                reader.data, self.data,
                "the source error before the last byte"
            );
            self.source_errors += 1;
            assert_eq!(
                self.source_errors, 1,
                "the source error reached two readers"
            );
            reader.status = Status::SourceFailed;
        } else {
            panic!("an error of an unknown kind: {error}");
        }
    }
}

fn check_budget(limits: &BufferLimits, other: usize) {
    let in_use = limits.in_use();
    assert!(
        in_use <= limits.total(),
        "{in_use} in use over a total of {}",
        limits.total()
    );
    assert!(
        in_use <= other + limits.per_call(),
        "{in_use} in use: more than {other} + one call's {}",
        limits.per_call()
    );
}

fn pick(readers: &[Reader], n: u8) -> Option<usize> {
    (!readers.is_empty()).then(|| usize::from(n) % readers.len())
}

fn run(case: Case) {
    let limits = BufferLimits::new(limit(case.per_call), limit(case.total));

    // Another call of the same layer, holding part of the budget for the whole run.
    let other_bytes = Bytes::from(vec![7u8; usize::from(case.other % 128)]);
    let mut other_call = ReplayBody::try_new(http_body_util::Full::new(other_bytes), &limits).ok();
    if let Some(other) = other_call.as_mut() {
        let mut cx = Context::from_waker(Waker::noop());
        while let Poll::Ready(Some(_)) = Pin::new(&mut *other).poll_frame(&mut cx) {}
    }
    let other = limits.in_use();

    let mut expected = Expected {
        data: Vec::new(),
        end: case.end,
        exact: case.exact,
        source_errors: 0,
    };
    let mut items = VecDeque::new();
    for step in case.steps {
        if let Step::Data(data) = &step {
            expected.data.extend_from_slice(data);
        }
        items.push_back(Item::Step(step));
    }
    items.push_back(Item::End(case.end));
    let gate = Arc::new(Mutex::new(Gate::default()));
    let whole = Arc::new(AtomicBool::new(false));
    let at_end = Arc::new(AtomicBool::new(false));
    let script = Script {
        items,
        gate: Arc::clone(&gate),
        exact: case.exact,
        remaining: expected.data.len() as u64,
        ended: false,
        whole: Arc::clone(&whole),
        at_end: Arc::clone(&at_end),
    };
    let Ok(first) = ReplayBody::try_new(script, &limits) else {
        // Too large to record: given back untouched, nothing reserved.
        assert!(case.exact);
        assert_eq!(limits.in_use(), other);
        return;
    };
    let mut readers = vec![Reader::new(first)];
    // Whether the call committed when the record held the whole body: every reader may then
    // still send it, and the record is kept until the last reader is dropped. `None` when the
    // harness cannot tell: the source had nothing left but its end, and no reader had polled
    // it since (the body learns of that end at its next poll).
    let mut kept = Some(false);

    for op in case.ops {
        match op {
            Op::Poll(n) => {
                if let Some(i) = pick(&readers, n) {
                    expected.poll(&mut readers[i]);
                }
            }
            Op::Clone(n) => {
                if readers.len() < MAX_READERS
                    && let Some(i) = pick(&readers, n)
                {
                    let clone = readers[i].body.clone();
                    assert_eq!(clone.bytes_read(), 0);
                    readers.push(Reader::new(clone));
                }
            }
            Op::Drop(n) => {
                if let Some(i) = pick(&readers, n) {
                    drop(readers.swap_remove(i));
                }
            }
            Op::Commit(n) => {
                if let Some(i) = pick(&readers, n) {
                    let before = readers[i].body.committed_reader();
                    let mine = readers[i].body.commit();
                    let id = readers[i].body.reader_id();
                    match before {
                        None => {
                            assert!(mine);
                            kept = if whole.load(Ordering::SeqCst) {
                                Some(true)
                            } else if at_end.load(Ordering::SeqCst) {
                                None
                            } else {
                                Some(false)
                            };
                        }
                        Some(committed) => assert_eq!(mine, committed == id),
                    }
                    assert!(readers[i].body.is_committed());
                }
            }
            Op::Open => {
                let waker = {
                    let mut gate = gate.lock().unwrap();
                    gate.opened += 1;
                    gate.waker.take()
                };
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            Op::Inspect(n) => {
                if let Some(i) = pick(&readers, n) {
                    expected.check_hint(&readers[i]);
                    let _ = readers[i].body.is_end_stream();
                }
            }
        }
        check_budget(&limits, other);
    }

    // Let the source run free, and finish every reader, polling only those woken.
    let waker = {
        let mut gate = gate.lock().unwrap();
        gate.always = true;
        gate.waker.take()
    };
    if let Some(waker) = waker {
        waker.wake();
    }
    let mut polls = 0;
    loop {
        let runnable: Vec<usize> = (0..readers.len())
            .filter(|&i| {
                let reader = &readers[i];
                reader.status == Status::Reading && (!reader.pending || reader.woken())
            })
            .collect();
        if runnable.is_empty() {
            let stuck: Vec<u64> = readers
                .iter()
                .filter(|r| r.status == Status::Reading)
                .map(|r| r.body.reader_id())
                .collect();
            assert!(
                stuck.is_empty(),
                "readers {stuck:?} wait for a wake-up that never comes"
            );
            break;
        }
        for i in runnable {
            expected.poll(&mut readers[i]);
            polls += 1;
            assert!(polls < MAX_DRAIN_POLLS, "the body never finishes");
        }
        check_budget(&limits, other);
    }

    let committed = readers.first().and_then(|r| r.body.committed_reader());
    for reader in &readers {
        let id = reader.body.reader_id();
        let must_finish = match committed {
            None => true,
            Some(committed) => kept == Some(true) || committed == id,
        };
        if must_finish && expected.end != End::Fail {
            assert_eq!(
                reader.status,
                Status::Completed,
                "reader {id} did not finish"
            );
        }
    }
    if let Some(committed) = committed
        && kept == Some(false)
        && readers
            .iter()
            .any(|r| r.body.reader_id() == committed && r.status == Status::Completed)
    {
        // The reader the call is committed to has sent everything: nothing is kept for it.
        assert_eq!(
            limits.in_use(),
            other,
            "a finished committed call still holds bytes"
        );
    }
    drop(readers);
    assert_eq!(limits.in_use(), other, "dropped readers still hold bytes");
    drop(other_call);
    assert_eq!(limits.in_use(), 0, "the budget did not return to 0");
}

fuzz_target!(|case: Case| run(case));
