//! The cost of making a request body replayable: 1 MiB sent in 16 KiB chunks.
//!
//! Each body is read to its end by polling it by hand (no runtime). Two consumers:
//! `copy` writes every chunk into a buffer, as a transport writes it to a socket, and is the
//! throughput that matters; `drain` only counts the bytes, so it shows the bare per-chunk
//! overhead of the replay body.

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_util::stream;
use http_body::{Body, Frame};
use http_body_util::StreamBody;
use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tower_retry_hedge::body::{BufferLimits, ReplayBody};

const BODY: usize = 1 << 20;
const CHUNK: usize = 16 << 10;

fn chunks() -> Vec<Bytes> {
    (0..BODY / CHUNK)
        .map(|i| Bytes::from(vec![i as u8; CHUNK]))
        .collect()
}

/// A streaming source of the chunks, as hyper or tonic would give.
fn source(chunks: &[Bytes]) -> impl Body<Data = Bytes, Error = Infallible> + Unpin + '_ {
    StreamBody::new(stream::iter(
        chunks.iter().cloned().map(|chunk| Ok(Frame::data(chunk))),
    ))
}

#[derive(Clone, Copy)]
enum Consumer {
    Copy,
    Drain,
}

impl Consumer {
    fn name(self) -> &'static str {
        match self {
            Consumer::Copy => "copy",
            Consumer::Drain => "drain",
        }
    }
}

/// Polls `body` once; `Some(false)` at its end.
fn step<B>(body: &mut B, sink: &mut Vec<u8>, consumer: Consumer) -> bool
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    match Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Some(Ok(frame))) => {
            if let Ok(data) = frame.into_data() {
                match consumer {
                    Consumer::Copy => sink.extend_from_slice(&data),
                    Consumer::Drain => {
                        black_box(&data);
                    }
                }
            }
            true
        }
        Poll::Ready(None) => false,
        Poll::Ready(Some(Err(error))) => panic!("body failed: {error:?}"),
        Poll::Pending => panic!("the benchmark's bodies never wait"),
    }
}

fn read<B>(mut body: B, sink: &mut Vec<u8>, consumer: Consumer)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    sink.clear();
    while step(&mut body, sink, consumer) {}
    black_box(&sink);
}

fn limits() -> BufferLimits {
    BufferLimits::new(2 * BODY, 64 * BODY)
}

fn replay_body<B>(body: B, limits: &BufferLimits) -> ReplayBody<B>
where
    B: Body<Data = Bytes, Error = Infallible>,
{
    match ReplayBody::try_new(body, limits) {
        Ok(body) => body,
        Err(_) => panic!("1 MiB fits the benchmark's limits"),
    }
}

/// Checks, once, that a replay sends the very `Bytes` the source gave.
fn assert_replay_copies_nothing(chunks: &[Bytes]) {
    let limits = limits();
    let mut first = replay_body(source(chunks), &limits);
    let template = first.clone();
    read_chunks(&mut first);
    let replayed = read_chunks(&mut template.clone());
    let shared = replayed
        .iter()
        .zip(chunks)
        .filter(|(replayed, original)| replayed.as_ptr() == original.as_ptr())
        .count();
    assert_eq!(shared, chunks.len());
    eprintln!(
        "replay copies no Bytes: {shared}/{} chunks share the source's memory",
        chunks.len()
    );
}

fn read_chunks<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> Vec<Bytes>
where
    B::Error: std::fmt::Debug,
{
    let mut out = Vec::new();
    while let Poll::Ready(Some(Ok(frame))) =
        Pin::new(&mut *body).poll_frame(&mut Context::from_waker(Waker::noop()))
    {
        out.extend(frame.into_data().ok());
    }
    out
}

fn bench(c: &mut Criterion) {
    let chunks = chunks();
    assert_replay_copies_nothing(&chunks);
    let limits = limits();
    let mut sink = Vec::with_capacity(BODY);
    let mut second_sink = Vec::with_capacity(BODY);

    let mut group = c.benchmark_group("replay_body");
    for consumer in [Consumer::Copy, Consumer::Drain] {
        group.throughput(Throughput::Bytes(BODY as u64));

        group.bench_function(BenchmarkId::new("raw", consumer.name()), |b| {
            b.iter(|| read(source(&chunks), &mut sink, consumer))
        });

        // The first attempt, with the template a retry engine keeps; includes wrapping the
        // body and freeing the record.
        group.bench_function(BenchmarkId::new("first_read", consumer.name()), |b| {
            b.iter(|| {
                let first = replay_body(source(&chunks), &limits);
                let template = first.clone();
                read(first, &mut sink, consumer);
                drop(template);
            })
        });

        let mut recorded = replay_body(source(&chunks), &limits);
        let template = recorded.clone();
        read_chunks(&mut recorded);
        group.bench_function(BenchmarkId::new("replay", consumer.name()), |b| {
            b.iter(|| read(template.clone(), &mut sink, consumer))
        });
        drop((recorded, template));

        // Two attempts at once, the second one chunk behind the first: 2 MiB sent in all.
        group.throughput(Throughput::Bytes(2 * BODY as u64));
        group.bench_function(BenchmarkId::new("two_concurrent", consumer.name()), |b| {
            b.iter(|| {
                let mut first = replay_body(source(&chunks), &limits);
                let mut second = first.clone();
                sink.clear();
                second_sink.clear();
                let mut first_open = true;
                let mut second_open = true;
                while first_open || second_open {
                    if first_open {
                        first_open = step(&mut first, &mut sink, consumer);
                    }
                    if second_open {
                        second_open = step(&mut second, &mut second_sink, consumer);
                    }
                }
                black_box((&sink, &second_sink));
            })
        });
    }
    group.finish();
    assert_eq!(limits.in_use(), 0);
}

criterion_group!(benches, bench);
criterion_main!(benches);
