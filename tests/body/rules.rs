//! One test (or a few) for each rule of the replay body.

use crate::support::*;
use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Empty, Full};
use std::task::{Poll, Waker};
use tower_retry_hedge::body::{BufferLimits, ReplayBody};

fn big() -> BufferLimits {
    BufferLimits::new(1 << 20, 1 << 24)
}

fn replay<B>(body: B, limits: &BufferLimits) -> ReplayBody<B>
where
    B: Body,
    B::Data: bytes::Buf,
    B::Error: Into<tower_retry_hedge::body::BoxError>,
{
    match ReplayBody::try_new(body, limits) {
        Ok(body) => body,
        Err(_) => panic!("the body should be accepted"),
    }
}

fn data(chunks: &[&'static [u8]]) -> Vec<Step> {
    chunks
        .iter()
        .map(|chunk| Step::Data(Bytes::from_static(chunk)))
        .collect()
}

// === streaming and replay ===

#[test]
fn first_reader_streams_each_chunk_as_it_arrives() {
    let (script, gate) = Script::new(
        vec![
            Step::Data(Bytes::from_static(b"ab")),
            Step::Wait,
            Step::Data(Bytes::from_static(b"cd")),
        ],
        true,
    );
    let mut first = replay(script, &big());
    let (woken, waker) = counting_waker();

    assert_eq!(expect_data(poll(&mut first, &waker)), "ab");
    assert!(poll(&mut first, &waker).is_pending());
    assert!(gate.is_waiting());
    assert_eq!(woken.get(), 0);

    gate.open();
    assert_eq!(woken.get(), 1);
    assert_eq!(expect_data(poll(&mut first, &waker)), "cd");
    assert!(first.is_end_stream());
    expect_end(poll(&mut first, &waker));
    assert_eq!(first.bytes_read(), 4);
    assert!(!gate.source_alive(), "an ended source is dropped at once");
}

#[test]
fn clones_replay_the_bytes_and_the_trailers() {
    let mut steps = data(&[b"hello ", b"", b"world"]);
    steps.push(Step::Trailers(trailers("0")));
    let (script, _) = Script::new(steps, false);
    let limits = big();
    let mut first = replay(script, &limits);
    let template = first.clone();

    let sent = drain(&mut first).unwrap();
    assert_eq!(sent.data, b"hello world");
    assert_eq!(sent.trailers, Some(trailers("0")));
    assert_eq!(limits.in_use(), 11);

    for _ in 0..3 {
        let again = drain(&mut template.clone()).unwrap();
        assert_eq!(again.data, sent.data);
        assert_eq!(again.trailers, sent.trailers);
    }
    assert!(!template.is_committed());
    assert_eq!(template.committed_reader(), None);
}

#[test]
fn reader_ids_count_up_from_zero() {
    let template = replay(Script::data(&[b"x"]), &big());
    let first = template.clone();
    let second = first.clone();
    assert_eq!(
        [template.reader_id(), first.reader_id(), second.reader_id()],
        [0, 1, 2]
    );
    assert_eq!(template.clone().reader_id(), 3);
}

#[test]
fn bytes_read_is_per_reader() {
    let mut first = replay(Script::data(&[b"abc", b"de"]), &big());
    let mut second = first.clone();
    expect_data(poll_noop(&mut first));
    expect_data(poll_noop(&mut first));
    expect_data(poll_noop(&mut second));
    assert_eq!((first.bytes_read(), second.bytes_read()), (5, 3));
}

#[test]
fn empty_chunks_are_sent_but_not_recorded() {
    let (script, _) = Script::new(data(&[b"", b"a", b""]), false);
    let limits = BufferLimits::new(1, 1);
    let mut first = replay(script, &limits);
    let sent = drain(&mut first).unwrap();
    assert_eq!(sent.chunks, [&b""[..], b"a", b""]);
    let again = drain(&mut first.clone()).unwrap();
    assert_eq!(again.chunks, [&b"a"[..]]);
    assert!(!first.is_committed());
}

// === concurrent readers ===

#[test]
fn a_reader_behind_reads_the_record_while_the_leader_waits() {
    let (script, gate) = Script::new(
        vec![
            Step::Data(Bytes::from_static(b"ab")),
            Step::Wait,
            Step::Data(Bytes::from_static(b"cd")),
        ],
        true,
    );
    let mut leader = replay(script, &big());
    let mut behind = leader.clone();
    let (leader_woken, leader_waker) = counting_waker();
    let (behind_woken, behind_waker) = counting_waker();

    assert_eq!(expect_data(poll(&mut leader, &leader_waker)), "ab");
    assert!(poll(&mut leader, &leader_waker).is_pending());
    // The source is parked, but the record is not.
    assert_eq!(expect_data(poll(&mut behind, &behind_waker)), "ab");
    assert!(poll(&mut behind, &behind_waker).is_pending());

    // The source wakes both, whichever polled it last.
    gate.open();
    assert_eq!((leader_woken.get(), behind_woken.get()), (1, 1));

    // The one behind gets there first and pulls; the other reads what it recorded.
    let pulled = expect_data(poll(&mut behind, &behind_waker));
    let replayed = expect_data(poll(&mut leader, &leader_waker));
    assert_eq!(pulled, "cd");
    assert_eq!(pulled.as_ptr(), replayed.as_ptr());
    expect_end(poll(&mut behind, &behind_waker));
    expect_end(poll(&mut leader, &leader_waker));
}

#[test]
fn a_waiting_reader_is_woken_when_another_records() {
    let (script, gate) = Script::new(
        vec![Step::Wait, Step::Data(Bytes::from_static(b"x")), Step::Wait],
        false,
    );
    let mut waiting = replay(script, &big());
    let mut puller = waiting.clone();
    let (woken, waker) = counting_waker();

    assert!(poll(&mut waiting, &waker).is_pending());
    // The source is ready, but says nothing: only a poll can find out.
    gate.open_silently();
    assert_eq!(woken.get(), 0);
    assert_eq!(expect_data(poll_noop(&mut puller)), "x");
    assert_eq!(
        woken.get(),
        1,
        "recording new data must wake waiting readers"
    );
    assert_eq!(expect_data(poll(&mut waiting, &waker)), "x");

    // The same for the end of the body.
    assert!(poll(&mut waiting, &waker).is_pending());
    gate.open_silently();
    expect_end(poll_noop(&mut puller));
    assert_eq!(woken.get(), 2, "the end must wake waiting readers");
    expect_end(poll(&mut waiting, &waker));
}

#[test]
fn dropping_the_last_poller_of_the_source_strands_no_one() {
    let (script, gate) = Script::new(vec![Step::Wait, Step::Data(Bytes::from_static(b"x"))], true);
    let mut first = replay(script, &big());
    let mut second = first.clone();
    let (woken, waker) = counting_waker();

    assert!(poll(&mut first, &waker).is_pending());
    assert!(poll_noop(&mut second).is_pending()); // second polled the source last
    drop(second);
    gate.open();
    assert_eq!(woken.get(), 1);
    assert_eq!(expect_data(poll(&mut first, &waker)), "x");
}

#[test]
fn a_yielding_source_wakes_its_poller() {
    let (script, _) = Script::new(
        vec![Step::Yield, Step::Data(Bytes::from_static(b"x"))],
        true,
    );
    let mut body = replay(script, &big());
    let (woken, waker) = counting_waker();
    assert!(poll(&mut body, &waker).is_pending());
    assert_eq!(woken.get(), 1);
    assert_eq!(expect_data(poll(&mut body, &waker)), "x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_on_many_threads_all_get_the_whole_body() {
    use futures_util::StreamExt;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use tokio_stream::wrappers::ReceiverStream;

    for round in 0..50u8 {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let source =
            StreamBody::new(ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>));
        let limits = big();
        let template = replay(source, &limits);
        let expected: Vec<u8> = (0..64u32).flat_map(|i| [round, i as u8, 7]).collect();

        let readers: Vec<_> = (0..4)
            .map(|_| {
                let body = template.clone();
                tokio::spawn(async move { body.collect().await.map(|c| c.to_bytes()) })
            })
            .collect();
        let feeder = tokio::spawn(async move {
            for i in 0..64u32 {
                let chunk = Bytes::from(vec![round, i as u8, 7]);
                tx.send(Frame::data(chunk)).await.unwrap();
                if i % 8 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
        feeder.await.unwrap();
        for reader in readers {
            assert_eq!(reader.await.unwrap().unwrap(), expected);
        }
        assert_eq!(limits.in_use(), expected.len());
        drop(template);
        assert_eq!(limits.in_use(), 0);
    }
}

// === size hints ===

#[test]
fn size_hint_and_is_end_stream_are_exact_for_every_reader() {
    let (script, _) = Script::new(
        vec![
            Step::Data(Bytes::from_static(b"abc")),
            Step::Data(Bytes::from_static(b"de")),
            Step::Trailers(trailers("0")),
        ],
        true,
    );
    let mut first = replay(script, &big());
    let mut second = first.clone();
    let exact = |body: &ReplayBody<Script>| body.size_hint().exact();

    assert_eq!((exact(&first), exact(&second)), (Some(5), Some(5)));
    expect_data(poll_noop(&mut first));
    assert_eq!((exact(&first), exact(&second)), (Some(2), Some(5)));
    expect_data(poll_noop(&mut second));
    assert_eq!((exact(&first), exact(&second)), (Some(2), Some(2)));
    expect_data(poll_noop(&mut first));
    assert_eq!((exact(&first), exact(&second)), (Some(0), Some(2)));
    // Trailers are still to come.
    assert!(!first.is_end_stream());
    expect_trailers(poll_noop(&mut first));
    assert!(first.is_end_stream());
    assert!(!second.is_end_stream());
    assert_eq!(exact(&second), Some(2));
    expect_data(poll_noop(&mut second));
    assert!(!second.is_end_stream());
    expect_trailers(poll_noop(&mut second));
    assert!(second.is_end_stream());
    expect_end(poll_noop(&mut second));

    // A late clone knows everything now.
    let late = first.clone();
    assert_eq!(exact(&late), Some(5));
    assert!(!late.is_end_stream());
}

#[test]
fn size_hint_of_an_unknown_source_becomes_exact_when_it_ends() {
    let (script, _) = Script::new(data(&[b"abc", b"de"]), false);
    let mut first = replay(script, &big());
    let second = first.clone();
    assert_eq!(first.size_hint().lower(), 0);
    assert_eq!(first.size_hint().upper(), None);
    expect_data(poll_noop(&mut first));
    assert_eq!(second.size_hint().lower(), 3);
    assert_eq!(second.size_hint().upper(), None);
    expect_data(poll_noop(&mut first));
    assert!(!first.is_end_stream()); // the source cannot tell
    expect_end(poll_noop(&mut first));
    assert!(first.is_end_stream());
    assert_eq!(second.size_hint().exact(), Some(5));
    assert_eq!(first.size_hint().exact(), Some(0));
}

#[test]
fn a_source_that_reports_its_end_is_not_polled_again() {
    // `Script` panics when polled after its end; with `exact` it reports the end itself.
    let mut first = replay(Script::data(&[b"a"]), &big());
    expect_data(poll_noop(&mut first));
    assert!(first.is_end_stream());
    expect_end(poll_noop(&mut first));
    let mut second = first.clone();
    expect_data(poll_noop(&mut second));
    assert!(second.is_end_stream());
    expect_end(poll_noop(&mut second));
}

// === no copies ===

#[test]
fn empty_bodies_are_ended_for_every_reader() {
    let limits = big();
    let mut full = replay(Full::new(Bytes::new()), &limits);
    let mut empty = replay(Empty::<Bytes>::new(), &limits);
    let mut full_clone = full.clone();
    for body in [&mut full, &mut full_clone] {
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
        expect_end(poll_noop(body));
    }
    assert!(empty.clone().is_end_stream());
    expect_end(poll_noop(&mut empty));
    assert_eq!(limits.in_use(), 0);
}

#[test]
fn a_single_bytes_body_replays_without_a_copy() {
    let payload = Bytes::from(vec![42u8; 4096]);
    let limits = big();
    let mut first = replay(Full::new(payload.clone()), &limits);
    let template = first.clone();

    let sent = expect_data(poll_noop(&mut first));
    assert_eq!(sent.as_ptr(), payload.as_ptr());
    expect_end(poll_noop(&mut first));
    for _ in 0..3 {
        let mut again = template.clone();
        let replayed = expect_data(poll_noop(&mut again));
        assert_eq!(replayed.as_ptr(), payload.as_ptr());
        assert_eq!(replayed.len(), payload.len());
        expect_end(poll_noop(&mut again));
    }
    assert_eq!(limits.in_use(), 4096);
}

#[test]
fn every_chunk_replays_without_a_copy() {
    let chunks: Vec<Bytes> = (0..8).map(|i| Bytes::from(vec![i; 100])).collect();
    let steps = chunks.iter().cloned().map(Step::Data).collect();
    let (script, _) = Script::new(steps, false);
    let mut first = replay(script, &big());
    let sent = drain(&mut first).unwrap();
    let again = drain(&mut first.clone()).unwrap();
    for ((original, sent), again) in chunks.iter().zip(&sent.chunks).zip(&again.chunks) {
        assert_eq!(sent.as_ptr(), original.as_ptr());
        assert_eq!(again.as_ptr(), original.as_ptr());
    }
}

// === try_new ===

#[tokio::test]
async fn try_new_gives_back_a_body_over_the_per_call_limit() {
    let limits = BufferLimits::new(4, 1024);
    assert!(ReplayBody::try_new(Full::new(Bytes::from_static(b"four")), &limits).is_ok());
    let given_back = match ReplayBody::try_new(Full::new(Bytes::from_static(b"fives")), &limits) {
        Ok(_) => panic!("a body over the per-call limit must be given back"),
        Err(body) => body,
    };
    let bytes = given_back.collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "fives");
    assert_eq!(limits.in_use(), 0);
}

#[test]
fn try_new_gives_back_a_body_over_what_the_budget_has_left() {
    let limits = BufferLimits::new(100, 10);
    let mut other_call = replay(Script::data(&[b"sixsix"]), &limits);
    expect_data(poll_noop(&mut other_call));
    assert_eq!(limits.in_use(), 6);
    assert!(ReplayBody::try_new(Full::new(Bytes::from_static(b"fives")), &limits).is_err());
    assert!(ReplayBody::try_new(Full::new(Bytes::from_static(b"four")), &limits).is_ok());
    // Only the lower bound counts: a body that says nothing is accepted.
    let (unknown, _) = Script::new(data(&[b"0123456789"]), false);
    assert!(ReplayBody::try_new(unknown, &limits).is_ok());
}

// === limits and commitment ===

#[test]
fn a_body_of_exactly_the_limit_is_recorded() {
    let (script, _) = Script::new(data(&[b"ab", b"cd"]), false);
    let limits = BufferLimits::new(4, 4);
    let mut first = replay(script, &limits);
    assert_eq!(drain(&mut first).unwrap().data, b"abcd");
    assert!(!first.is_committed());
    assert_eq!(limits.in_use(), 4);
    assert_eq!(drain(&mut first.clone()).unwrap().data, b"abcd");
}

#[test]
fn crossing_the_per_call_limit_commits_to_the_reader_that_sent_the_most() {
    let (script, _) = Script::new(data(&[b"ab", b"cd", b"ef", b"gh"]), false);
    let limits = BufferLimits::new(4, 1024);
    let template = replay(script, &limits);
    let mut leader = template.clone();
    let mut behind = template.clone();

    expect_data(poll_noop(&mut leader));
    expect_data(poll_noop(&mut leader));
    expect_data(poll_noop(&mut behind));
    assert_eq!(limits.in_use(), 4);
    assert!(!template.is_committed());

    // "ef" would make 6 bytes: committed, record freed at once.
    assert_eq!(expect_data(poll_noop(&mut leader)), "ef");
    assert!(template.is_committed());
    assert_eq!(template.committed_reader(), Some(leader.reader_id()));
    assert_eq!(limits.in_use(), 0);

    // The others can send nothing more, and say so.
    assert_eq!(behind.size_hint().exact(), Some(0));
    assert!(!behind.is_end_stream());
    let error = expect_not_replayable(poll_noop(&mut behind));
    assert!(error.is_over_limit());
    assert_eq!(
        error.to_string(),
        "request body exceeded the per-call retry buffer limit and cannot be replayed"
    );
    expect_end(poll_noop(&mut behind));
    assert!(behind.is_end_stream());
    assert!(expect_not_replayable(poll_noop(&mut template.clone())).is_over_limit());

    // The leader goes on to the end, as if nothing happened.
    assert_eq!(expect_data(poll_noop(&mut leader)), "gh");
    expect_end(poll_noop(&mut leader));
    assert_eq!(leader.bytes_read(), 8);
    assert_eq!(limits.in_use(), 0);
}

#[test]
fn crossing_the_total_budget_commits() {
    let limits = BufferLimits::new(100, 6);
    let mut other_call = replay(Script::data(&[b"four"]), &limits);
    expect_data(poll_noop(&mut other_call));

    let (script, _) = Script::new(data(&[b"ab", b"cd", b"ef"]), false);
    let mut first = replay(script, &limits);
    let template = first.clone();
    expect_data(poll_noop(&mut first));
    assert_eq!(limits.in_use(), 6);
    expect_data(poll_noop(&mut first));
    assert!(first.is_committed());
    assert_eq!(limits.in_use(), 4, "the other call keeps its bytes");
    assert_eq!(drain(&mut first).unwrap().data, b"ef");
    let error = expect_not_replayable(poll_noop(&mut template.clone()));
    assert!(error.to_string().contains("total retry buffer budget"));
}

#[test]
fn a_zero_limit_commits_on_the_first_byte() {
    let (script, _) = Script::new(data(&[b"", b"a", b"b"]), false);
    let limits = BufferLimits::new(0, 1024);
    let mut first = replay(script, &limits);
    let template = first.clone();
    expect_data(poll_noop(&mut first));
    assert!(!first.is_committed(), "an empty chunk takes no room");
    expect_data(poll_noop(&mut first));
    assert!(first.is_committed());
    assert_eq!(drain(&mut first).unwrap().data, b"b");
    expect_not_replayable(poll_noop(&mut template.clone()));
}

#[test]
fn tied_readers_commit_to_the_one_that_pulled() {
    let (script, _) = Script::new(data(&[b"ab", b"cd"]), false);
    let limits = BufferLimits::new(2, 1024);
    let mut first = replay(script, &limits);
    let mut second = first.clone();
    expect_data(poll_noop(&mut first));
    expect_data(poll_noop(&mut second));
    assert_eq!(expect_data(poll_noop(&mut second)), "cd");
    assert_eq!(first.committed_reader(), Some(second.reader_id()));
    expect_not_replayable(poll_noop(&mut first));
    expect_end(poll_noop(&mut second));
}

#[test]
fn readers_waiting_at_the_front_are_woken_on_commit() {
    let (script, gate) = Script::new(
        vec![
            Step::Data(Bytes::from_static(b"ab")),
            Step::Wait,
            Step::Data(Bytes::from_static(b"cd")),
        ],
        false,
    );
    let limits = BufferLimits::new(2, 1024);
    let mut first = replay(script, &limits);
    let mut second = first.clone();
    let (woken, waker) = counting_waker();
    expect_data(poll(&mut first, &waker));
    assert!(poll(&mut first, &waker).is_pending());
    expect_data(poll_noop(&mut second));
    gate.open_silently();
    assert_eq!(expect_data(poll_noop(&mut second)), "cd");
    assert_eq!(woken.get(), 1);
    assert!(expect_not_replayable(poll(&mut first, &waker)).is_over_limit());
}

#[test]
fn trailers_after_a_commit_reach_the_leader() {
    let (script, _) = Script::new(
        vec![
            Step::Data(Bytes::from_static(b"abc")),
            Step::Trailers(trailers("0")),
        ],
        false,
    );
    let limits = BufferLimits::new(2, 1024);
    let mut first = replay(script, &limits);
    let sent = drain(&mut first).unwrap();
    assert_eq!(sent.data, b"abc");
    assert_eq!(sent.trailers, Some(trailers("0")));
    assert!(first.is_committed());
    expect_not_replayable(poll_noop(&mut first.clone()));
}

#[test]
fn commit_frees_what_was_sent_and_the_rest_as_it_is_sent() {
    let (script, _) = Script::new(data(&[b"a", b"bb", b"ccc"]), false);
    let limits = big();
    let mut ahead = replay(script, &limits);
    let mut chosen = ahead.clone();
    for _ in 0..3 {
        expect_data(poll_noop(&mut ahead));
    }
    expect_data(poll_noop(&mut chosen));
    assert_eq!(limits.in_use(), 6);

    assert!(chosen.commit());
    assert!(
        chosen.commit(),
        "committing twice to the same reader is fine"
    );
    assert!(!ahead.commit());
    assert_eq!(ahead.committed_reader(), Some(chosen.reader_id()));
    assert_eq!(limits.in_use(), 5);
    assert_eq!(chosen.size_hint().lower(), 5);

    // `ahead` has sent the whole record: it waits for how the source ends.
    assert!(poll_noop(&mut ahead).is_pending());
    assert_eq!(expect_data(poll_noop(&mut chosen)), "bb");
    assert_eq!(limits.in_use(), 3);
    assert_eq!(expect_data(poll_noop(&mut chosen)), "ccc");
    assert_eq!(limits.in_use(), 0);
    expect_end(poll_noop(&mut chosen));
    // It ended there: `ahead` had sent the whole body, and ends it too.
    expect_end(poll_noop(&mut ahead));
}

// === source errors ===

#[test]
fn a_source_error_reaches_the_reader_that_hit_it_and_fails_the_others() {
    let (script, _) = Script::new(
        vec![Step::Data(Bytes::from_static(b"ab")), Step::Fail("reset")],
        false,
    );
    let limits = big();
    let template = replay(script, &limits);
    let mut hit = template.clone();
    let mut behind = template.clone();
    expect_data(poll_noop(&mut hit));
    expect_data(poll_noop(&mut behind));
    assert_eq!(limits.in_use(), 2);

    let error = expect_error(poll_noop(&mut hit));
    assert_eq!(
        error.downcast_ref::<SourceError>(),
        Some(&SourceError("reset")),
        "the original error, to be classified"
    );
    assert!(hit.is_end_stream());
    expect_end(poll_noop(&mut hit));
    assert!(
        template.is_committed(),
        "no attempt can send this body any more"
    );
    assert_eq!(template.committed_reader(), Some(hit.reader_id()));
    assert_eq!(limits.in_use(), 0, "the record is freed at once");

    for mut other in [behind, template.clone()] {
        let error = expect_not_replayable(poll_noop(&mut other));
        assert!(error.is_source_failure());
        assert_eq!(
            error.to_string(),
            "request body cannot be replayed: its source failed: source failed: reset"
        );
    }
}

#[test]
fn a_source_error_wakes_waiting_readers() {
    let (script, gate) = Script::new(vec![Step::Wait, Step::Fail("gone")], false);
    let mut waiting = replay(script, &big());
    let mut puller = waiting.clone();
    let (woken, waker) = counting_waker();
    assert!(poll(&mut waiting, &waker).is_pending());
    gate.open_silently();
    expect_error(poll_noop(&mut puller));
    assert_eq!(woken.get(), 1);
    assert!(expect_not_replayable(poll(&mut waiting, &waker)).is_source_failure());
}

#[test]
fn a_source_error_after_a_commit_keeps_the_commit() {
    let (script, _) = Script::new(
        vec![Step::Data(Bytes::from_static(b"abc")), Step::Fail("late")],
        false,
    );
    let limits = BufferLimits::new(1, 16);
    let mut first = replay(script, &limits);
    let template = first.clone();
    expect_data(poll_noop(&mut first));
    expect_error(poll_noop(&mut first));
    assert_eq!(template.committed_reader(), Some(0));
    assert!(expect_not_replayable(poll_noop(&mut template.clone())).is_over_limit());
}

// === memory ===

#[test]
fn dropping_the_last_clone_releases_the_budget() {
    let (script, gate) = Script::new(
        vec![Step::Data(Bytes::from_static(b"abc")), Step::Wait],
        false,
    );
    let limits = big();
    let template = replay(script, &limits);
    let mut attempt = template.clone();
    expect_data(poll_noop(&mut attempt));
    assert!(poll_noop(&mut attempt).is_pending());
    assert_eq!(limits.in_use(), 3);

    drop(template);
    assert_eq!(
        limits.in_use(),
        3,
        "the attempt may still be retried from itself"
    );
    let replay_of_attempt = attempt.clone();
    drop(attempt);
    assert_eq!(limits.in_use(), 3);
    assert!(gate.source_alive());
    drop(replay_of_attempt);
    assert_eq!(limits.in_use(), 0);
    assert!(!gate.source_alive(), "the source goes with the last clone");
}

#[test]
fn the_template_holds_the_record_only_while_it_lives() {
    let limits = big();
    let template = replay(Full::new(Bytes::from_static(b"abc")), &limits);
    let mut attempt = template.clone();
    drain(&mut attempt).unwrap();
    drop(attempt);
    assert_eq!(limits.in_use(), 3);
    drop(template);
    assert_eq!(limits.in_use(), 0);
}

#[test]
fn calls_share_one_budget_across_clones_of_the_limits() {
    let limits = BufferLimits::new(8, 8);
    let shared = limits.clone();
    let mut first = replay(Script::data(&[b"abcd"]), &limits);
    let mut second = replay(Script::data(&[b"efgh"]), &shared);
    drain(&mut first).unwrap();
    drain(&mut second).unwrap();
    assert_eq!((limits.in_use(), shared.in_use()), (8, 8));
    drop(first);
    assert_eq!(shared.in_use(), 4);
}

// === types ===

#[test]
fn replay_body_is_send_sync_unpin_and_fits_tonic() {
    fn assert_traits<T: Send + Sync + Unpin + 'static>(_: &T) {}
    let body = replay(Full::new(Bytes::from_static(b"x")), &big());
    assert_traits(&body);
    let _tonic = tonic::body::Body::new(body.clone());
    assert!(format!("{body:?}").contains("reader_id: 0"));
}

#[test]
fn polling_a_finished_reader_is_harmless() {
    let mut body = replay(Full::new(Bytes::from_static(b"x")), &big());
    drain(&mut body).unwrap();
    for _ in 0..3 {
        expect_end(poll(&mut body, Waker::noop()));
    }
    assert!(matches!(poll_noop(&mut body), Poll::Ready(None)));
}
