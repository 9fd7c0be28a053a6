//! Committing a call to one of its readers from the call's side, and the call learning of a
//! commit the body made itself.

use crate::support::*;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tower_retry_hedge::body::{BufferLimits, Clones, Copies, Recorded, Replay, ReplayBody};

/// The copies a call keeps of a streaming body: a never-polled template (reader 0).
fn recorded<B>(body: B, limits: &BufferLimits) -> Recorded<B, ReplayBody<B>>
where
    B: Body + Unpin,
    B::Data: bytes::Buf,
    B::Error: Into<tower_retry_hedge::body::BoxError>,
{
    let Ok(template) = ReplayBody::try_new(body, limits) else {
        panic!("the body should be accepted");
    };
    template
        .prepare(limits)
        .unwrap_or_else(|_| panic!("a replay body is its own copies"))
}

/// A source fed through a channel by another task, as a client streams a request body.
type Channel = StreamBody<
    futures_util::stream::Map<
        ReceiverStream<Frame<Bytes>>,
        fn(Frame<Bytes>) -> Result<Frame<Bytes>, Infallible>,
    >,
>;

fn channel() -> (mpsc::Sender<Frame<Bytes>>, Channel) {
    let (tx, rx) = mpsc::channel(1);
    let ok: fn(Frame<Bytes>) -> Result<Frame<Bytes>, Infallible> = Ok;
    (tx, StreamBody::new(ReceiverStream::new(rx).map(ok)))
}

/// Chunk `i` of a body: 1000 bytes that tell it from every other chunk.
fn chunk(i: usize) -> Bytes {
    (0..1000).map(|j| (i * 31 + j) as u8).collect()
}

/// Sends chunks `range` into the source, checking the budget after each one.
fn feed(
    tx: mpsc::Sender<Frame<Bytes>>,
    range: std::ops::Range<usize>,
    limits: BufferLimits,
    most: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in range {
            tx.send(Frame::data(chunk(i))).await.unwrap();
            assert!(limits.in_use() <= most, "{} bytes held", limits.in_use());
        }
    })
}

async fn data_frame<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    let frame = body.frame().await.expect("a frame").expect("not an error");
    frame.into_data().expect("a data frame")
}

fn script(chunks: &[&'static [u8]], wait_after: usize) -> (Script, Gate) {
    let mut steps: Vec<Step> = chunks
        .iter()
        .map(|chunk| Step::Data(Bytes::from_static(chunk)))
        .collect();
    steps.insert(wait_after, Step::Wait);
    Script::new(steps, false)
}

fn big() -> BufferLimits {
    BufferLimits::new(1 << 20, 1 << 24)
}

// === commit to a reader ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_from_the_template_frees_what_the_reader_sent_while_it_streams() {
    let limits = big();
    let (tx, source) = channel();
    let copies = recorded(source, &limits);
    let (mut attempt, reader) = copies.first();
    assert_eq!(reader, 1);

    // The transport's task sends the body as the source gives it; after 5 chunks it waits
    // until the call has committed to it.
    let (sent_five, sent_five_rx) = oneshot::channel();
    let (committed, committed_rx) = oneshot::channel::<()>();
    let transport = tokio::spawn({
        let limits = limits.clone();
        async move {
            let mut received = Vec::new();
            for _ in 0..5 {
                received.extend_from_slice(&data_frame(&mut attempt).await);
            }
            sent_five.send(limits.in_use()).unwrap();
            committed_rx.await.unwrap();
            let mut most = 0;
            while let Some(frame) = attempt.frame().await {
                received.extend_from_slice(&frame.unwrap().into_data().unwrap());
                most = most.max(limits.in_use());
            }
            (received, most)
        }
    });

    feed(tx.clone(), 0..5, limits.clone(), 5000).await.unwrap();
    assert_eq!(sent_five_rx.await.unwrap(), 5000);

    assert!(copies.commit(reader));
    assert_eq!(limits.in_use(), 0, "what reader 1 sent is freed at once");
    assert_eq!(copies.committed_reader(), Some(reader));
    assert!(copies.copy().is_none());

    committed.send(()).unwrap();
    feed(tx, 5..55, limits.clone(), 1000).await.unwrap();
    let (received, most) = transport.await.unwrap();
    assert!(
        most <= 1000,
        "{most} bytes held while streaming after the commit"
    );
    assert_eq!(limits.in_use(), 0);
    let expected: Vec<u8> = (0..55).flat_map(|i| chunk(i).to_vec()).collect();
    assert!(received == expected, "the body must arrive intact");
}

#[test]
fn a_commit_to_a_reader_behind_frees_chunks_as_it_sends_them() {
    let (source, gate) = script(&[b"a", b"bb", b"ccc", b"dddd", b"eeeee"], 4);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut ahead, _) = copies.first();
    let (mut behind, reader) = copies.copy().unwrap();
    for _ in 0..4 {
        expect_data(poll_noop(&mut ahead));
    }
    assert_eq!(expect_data(poll_noop(&mut behind)), "a");
    assert_eq!(limits.in_use(), 10);

    assert!(copies.commit(reader));
    assert_eq!(limits.in_use(), 9, "the chunk it has sent is freed at once");
    assert!(!copies.commit(ahead.reader_id()));
    // At the end of the record, the reader cut off waits for how the source goes on.
    assert!(poll_noop(&mut ahead).is_pending());

    for (expected, held) in [("bb", 7), ("ccc", 4), ("dddd", 0)] {
        assert_eq!(expect_data(poll_noop(&mut behind)), expected);
        assert_eq!(limits.in_use(), held);
    }
    // Caught up: it goes on from the source, and nothing more is recorded.
    assert!(poll_noop(&mut behind).is_pending());
    gate.open();
    assert_eq!(expect_data(poll_noop(&mut behind)), "eeeee");
    assert_eq!(limits.in_use(), 0);
    expect_end(poll_noop(&mut behind));
    assert_eq!(behind.bytes_read(), 15);
    // "eeeee" was never recorded: the reader cut off is short of it, and fails.
    let error = expect_not_replayable(poll_noop(&mut ahead));
    assert!(!error.is_over_limit() && !error.is_source_failure());
}

#[test]
fn an_excluded_reader_waiting_for_the_source_is_woken_by_a_commit() {
    let (source, gate) = script(&[b"ab", b"cd"], 1);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut ahead, _) = copies.first();
    let (mut chosen, reader) = copies.copy().unwrap();
    let (woken, waker) = counting_waker();
    expect_data(poll(&mut ahead, &waker));
    assert!(poll(&mut ahead, &waker).is_pending());

    assert!(copies.commit(reader));
    assert_eq!(woken.get(), 1, "a reader cut off by a commit must find out");
    // It has sent all the record holds: it waits to learn from the chosen reader whether
    // the source ends there.
    assert!(poll(&mut ahead, &waker).is_pending());

    assert_eq!(expect_data(poll_noop(&mut chosen)), "ab");
    assert_eq!(limits.in_use(), 0);
    gate.open();
    assert_eq!(drain(&mut chosen).unwrap().data, b"cd");
    // It did not: the rest, never recorded, cannot be sent to it.
    assert!(
        woken.get() >= 2,
        "woken when the chosen reader went past the record"
    );
    assert!(!expect_not_replayable(poll(&mut ahead, &waker)).is_over_limit());
    expect_end(poll(&mut ahead, &waker));
}

#[test]
fn a_reader_cut_off_at_the_end_of_the_record_ends_the_body_if_the_source_ends_there() {
    // The first attempt has sent "ab" (all there is, though the source has not said so yet)
    // when the call commits to the second: once the second finds the source's end, the
    // first's request is whole, and ends as a request should, not with an error.
    let (source, gate) = script(&[b"ab"], 1);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut first, _) = copies.first();
    let (mut second, second_reader) = copies.copy().unwrap();
    let (woken, waker) = counting_waker();
    expect_data(poll(&mut first, &waker));
    assert!(poll(&mut first, &waker).is_pending());
    assert!(copies.commit(second_reader));
    assert!(poll(&mut first, &waker).is_pending());
    let before = woken.get();
    gate.open();
    assert_eq!(drain(&mut second).unwrap().data, b"ab");
    assert!(woken.get() > before, "woken by the source's end");
    expect_end(poll(&mut first, &waker));

    // If the chosen reader goes away instead, no one will find the end: it fails.
    let (source, _gate) = script(&[b"ab"], 1);
    let copies = recorded(source, &limits);
    let (mut first, _) = copies.first();
    let (second, second_reader) = copies.copy().unwrap();
    let (woken, waker) = counting_waker();
    expect_data(poll(&mut first, &waker));
    assert!(poll(&mut first, &waker).is_pending());
    assert!(copies.commit(second_reader));
    assert!(poll(&mut first, &waker).is_pending());
    let before = woken.get();
    drop(second);
    assert!(
        woken.get() > before,
        "woken when the chosen reader went away"
    );
    expect_not_replayable(poll(&mut first, &waker));
}

#[test]
fn a_commit_to_a_dropped_reader_frees_the_whole_record() {
    let (source, _) = script(&[b"ab", b"cd"], 2);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut first, first_reader) = copies.first();
    let (mut second, _) = copies.copy().unwrap();
    expect_data(poll_noop(&mut first));
    expect_data(poll_noop(&mut first));
    expect_data(poll_noop(&mut second));
    // As hyper does once a body is sent, before the response comes.
    drop(first);
    assert_eq!(limits.in_use(), 4);

    assert!(copies.commit(first_reader));
    assert_eq!(limits.in_use(), 0, "no one may send the record any more");
    assert!(
        copies.commit(first_reader),
        "committing again changes nothing"
    );
    assert!(!copies.commit(second.reader_id()));
    assert_eq!(copies.committed_reader(), Some(first_reader));
    expect_not_replayable(poll_noop(&mut second));
    assert!(copies.copy().is_none());
}

#[test]
fn a_commit_to_a_reader_never_made_commits_nothing() {
    let source = Script::data(&[b"ab", b"cd"]);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut first, _) = copies.first();
    expect_data(poll_noop(&mut first));

    for unknown in [2, 99, u64::MAX] {
        assert!(!copies.commit(unknown));
    }
    assert!(!copies.is_committed());
    assert_eq!(limits.in_use(), 2);

    // The call goes on as if nothing happened.
    let (mut second, second_reader) = copies.copy().unwrap();
    assert_eq!(second_reader, 2);
    expect_data(poll_noop(&mut first));
    assert_eq!(drain(&mut second).unwrap().data, b"abcd");
    assert!(copies.commit(second_reader));
    // The first reader had sent the whole body: it ends it, as the source did.
    expect_end(poll_noop(&mut first));
}

#[test]
fn a_commit_with_the_whole_body_recorded_lets_every_reader_send_it_and_keeps_the_record() {
    // The source ended before the commit: every reader can still send the whole body (a
    // hedge that lost is a complete request, not a stream reset), and the record is kept
    // until the last reader is dropped.
    let steps = vec![
        Step::Data(Bytes::from_static(b"ab")),
        Step::Data(Bytes::from_static(b"cd")),
        Step::Trailers(trailers("t")),
    ];
    let (source, _gate) = Script::new(steps, false);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut winner, winner_reader) = copies.first();
    let (mut whole, _) = copies.copy().unwrap();
    let (mut behind, _) = copies.copy().unwrap();
    assert_eq!(drain(&mut winner).unwrap().data, b"abcd");
    expect_data(poll_noop(&mut whole));
    expect_data(poll_noop(&mut whole));
    expect_data(poll_noop(&mut behind));
    assert!(copies.commit(winner_reader));
    assert!(copies.copy().is_none(), "no new attempt starts");
    assert_eq!(limits.in_use(), 4, "kept for the readers still sending");
    assert_eq!(expect_trailers(poll_noop(&mut whole)), trailers("t"));
    expect_end(poll_noop(&mut whole));
    let rest = drain(&mut behind).unwrap();
    assert_eq!(
        (rest.data.as_slice(), rest.trailers),
        (&b"cd"[..], Some(trailers("t")))
    );
    drop((winner, whole, behind));
    assert_eq!(limits.in_use(), 4, "the template still holds it");
    drop(copies);
    assert_eq!(limits.in_use(), 0);
}

#[test]
fn after_a_commit_made_before_the_source_ended_no_other_reader_ends_the_body() {
    // The commit came first: what the source sent after it was never recorded, so a reader
    // at the end of the record may be short of the body, and fails.
    let (source, gate) = script(&[b"ab", b"cd"], 1);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut winner, winner_reader) = copies.first();
    let (mut loser, _) = copies.copy().unwrap();
    expect_data(poll_noop(&mut winner));
    expect_data(poll_noop(&mut loser));
    assert!(copies.commit(winner_reader));
    gate.open();
    assert_eq!(drain(&mut winner).unwrap().data, b"cd");
    expect_not_replayable(poll_noop(&mut loser));
}

#[test]
fn dropping_the_committed_reader_frees_the_rest_of_the_record() {
    let (source, gate) = script(&[b"ab", b"cd", b"ef"], 2);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut ahead, _) = copies.first();
    let (mut chosen, reader) = copies.copy().unwrap();
    expect_data(poll_noop(&mut ahead));
    expect_data(poll_noop(&mut ahead));
    expect_data(poll_noop(&mut chosen));
    assert!(copies.commit(reader));
    assert_eq!(limits.in_use(), 2);

    drop(chosen);
    assert_eq!(limits.in_use(), 0);
    expect_not_replayable(poll_noop(&mut ahead));
    drop(ahead);
    gate.open();
    drop(copies);
    assert!(!gate.source_alive());
}

#[test]
fn commit_from_the_reader_itself_still_frees_what_it_sent() {
    let (source, _) = script(&[b"ab", b"cd"], 2);
    let limits = big();
    let copies = recorded(source, &limits);
    let (mut first, _) = copies.first();
    let (second, _) = copies.copy().unwrap();
    expect_data(poll_noop(&mut first));
    expect_data(poll_noop(&mut first));
    assert!(first.commit());
    assert_eq!(limits.in_use(), 0);
    assert!(!second.commit());
    assert!(!copies.commit(second.reader_id()));
}

// === the call learns of a commit ===

#[tokio::test(start_paused = true)]
async fn the_call_is_woken_by_a_commit_made_in_the_transports_task() {
    let limits = BufferLimits::new(4096, 1 << 20);
    let (tx, source) = channel();
    let copies = Arc::new(recorded(source, &limits));
    let (mut first, first_reader) = copies.first();
    let (mut second, _) = copies.copy().unwrap();

    // The call's driver: waits for a commit, and tells the transport what it saw.
    let (registered, registered_rx) = oneshot::channel();
    let (saw, saw_rx) = oneshot::channel();
    let driver = tokio::spawn({
        let copies = Arc::clone(&copies);
        async move {
            let mut registered = Some(registered);
            let mut polls = 0;
            let reader = poll_fn(|cx| {
                polls += 1;
                let polled = copies.poll_committed(cx);
                if polled.is_pending()
                    && let Some(registered) = registered.take()
                {
                    registered.send(()).unwrap();
                }
                polled
            })
            .await;
            saw.send(reader).unwrap();
            polls
        }
    });
    registered_rx.await.unwrap();

    // The hedge's second attempt has sent one chunk, and is then held back by its transport.
    let feeder = feed(tx, 0..8, limits.clone(), 4096);
    assert_eq!(data_frame(&mut second).await, chunk(0));

    // The first attempt's transport task: the fifth chunk takes the record over 4096 bytes,
    // committing the call inside this task. It goes on only once the call has seen it, so
    // the wake cannot come from anything after the commit (the body's end, or its drop).
    let transport = tokio::spawn({
        let limits = limits.clone();
        async move {
            let mut received = Vec::new();
            for _ in 0..5 {
                received.extend_from_slice(&data_frame(&mut first).await);
            }
            assert_eq!(limits.in_use(), 0, "the commit freed the record");
            let seen = saw_rx
                .await
                .expect("the call saw the commit before the body ended");
            while let Some(frame) = first.frame().await {
                received.extend_from_slice(&frame.unwrap().into_data().unwrap());
            }
            (seen, received)
        }
    });
    // Paused, the clock only moves once every task is idle: this fails rather than hangs if
    // the driver is never woken.
    let (seen, received) = tokio::time::timeout(Duration::from_secs(60), transport)
        .await
        .expect("the driver must be woken by the commit")
        .unwrap();
    assert_eq!(seen, first_reader);
    assert_eq!(driver.await.unwrap(), 2, "one wake-up, no more");
    feeder.await.unwrap();
    let expected: Vec<u8> = (0..8).flat_map(|i| chunk(i).to_vec()).collect();
    assert!(received == expected);

    // Cancelled by the call, or left to find out: the other attempt cannot go on.
    let error = second.frame().await.unwrap().unwrap_err();
    let error = error
        .downcast_ref::<tower_retry_hedge::body::NotReplayable>()
        .expect("NotReplayable");
    assert!(error.is_over_limit());
    assert_eq!(
        copies.poll_committed(&mut Context::from_waker(std::task::Waker::noop())),
        Poll::Ready(first_reader)
    );
}

#[test]
fn a_later_registration_replaces_the_call_waker() {
    let (source, _) = script(&[b"ab"], 1);
    let copies = recorded(source, &big());
    let (attempt, reader) = copies.first();
    let (old, old_waker) = counting_waker();
    let (new, new_waker) = counting_waker();
    let pending = |waker: &std::task::Waker| copies.poll_committed(&mut Context::from_waker(waker));
    assert!(pending(&old_waker).is_pending());
    assert!(pending(&new_waker).is_pending());
    assert!(pending(&new_waker).is_pending());
    assert_eq!(Arc::strong_count(&old), 2, "the old waker is let go");

    assert!(copies.commit(reader));
    assert_eq!((old.get(), new.get()), (0, 1));
    assert_eq!(pending(&new_waker), Poll::Ready(attempt.reader_id()));
    assert_eq!(new.get(), 1);
}

#[test]
fn a_source_error_wakes_the_call() {
    let (source, gate) = Script::new(
        vec![
            Step::Data(Bytes::from_static(b"ab")),
            Step::Wait,
            Step::Fail("reset"),
        ],
        false,
    );
    let copies = recorded(source, &big());
    let (mut attempt, reader) = copies.first();
    let (woken, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    expect_data(poll_noop(&mut attempt));
    assert!(copies.poll_committed(&mut cx).is_pending());
    assert!(poll_noop(&mut attempt).is_pending());
    assert_eq!(woken.get(), 0);

    gate.open();
    expect_error(poll_noop(&mut attempt));
    assert_eq!(woken.get(), 1);
    assert_eq!(copies.poll_committed(&mut cx), Poll::Ready(reader));
}

#[test]
fn a_limit_crossed_by_a_reader_wakes_the_call_once() {
    let (source, _) = script(&[b"ab", b"cd", b"ef"], 3);
    let limits = BufferLimits::new(3, 1024);
    let copies = recorded(source, &limits);
    let (mut attempt, reader) = copies.first();
    let (woken, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(copies.poll_committed(&mut cx).is_pending());
    expect_data(poll_noop(&mut attempt));
    assert_eq!(woken.get(), 0, "no commit, no wake");
    expect_data(poll_noop(&mut attempt));
    assert_eq!(woken.get(), 1);
    expect_data(poll_noop(&mut attempt));
    assert_eq!(woken.get(), 1);
    assert_eq!(copies.poll_committed(&mut cx), Poll::Ready(reader));
}

#[test]
fn clones_never_commit_and_keep_no_waker() {
    let Ok(copies) = Full::new(Bytes::from_static(b"x")).prepare(&big()) else {
        panic!("a full body is always accepted");
    };
    let copies: Clones<Full<Bytes>> = copies;
    let (count, waker) = counting_waker();
    assert!(
        copies
            .poll_committed(&mut Context::from_waker(&waker))
            .is_pending()
    );
    assert_eq!(Arc::strong_count(&count), 2, "no waker kept");
    assert!(copies.commit(0));
    assert!(copies.commit(7));
    assert!(!copies.is_committed());
    assert!(copies.copy().is_some());
    assert!(
        copies
            .poll_committed(&mut Context::from_waker(&waker))
            .is_pending()
    );
}

#[test]
fn a_source_that_says_it_ended_with_its_last_frame_is_whole_at_once() {
    // hyper sends a request body the way this test reads the winner's: a frame, then
    // `is_end_stream`, and it stops polling once that says the body has ended. A source
    // that says so with its last frame (`Full` inside a boxed body, say) is never polled
    // for its end, yet the record is whole: a hedge behind may still send all of it.
    let limits = big();
    let copies = recorded(Script::data(&[b"hello"]), &limits);
    let (mut winner, winner_reader) = copies.first();
    let (mut behind, _) = copies.copy().unwrap();
    assert_eq!(expect_data(poll_noop(&mut winner)), "hello");
    assert!(winner.is_end_stream());
    drop(winner);
    assert!(copies.commit(winner_reader));
    assert!(copies.every_copy_may_finish());
    assert_eq!(drain(&mut behind).unwrap().data, b"hello");
}
