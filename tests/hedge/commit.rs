//! When a hedged call commits, every other attempt is cancelled at once, whichever task made
//! the commit: the caller's, when a response arrives, or a transport's, when the body it is
//! sending outgrows the per-call limit. Each attempt's body is read by a task of its own (as
//! hyper's connection task sends one), and "at once" means within a few turns of the
//! scheduler with the paused clock standing still: no timer of the call's is needed.

use super::*;

/// Yields to the other tasks until `done` holds, at most `max` times; returns how many yields
/// it took. The paused clock must not move meanwhile: only a timer could then have helped.
async fn yields_until(max: usize, mut done: impl FnMut() -> bool) -> Option<usize> {
    let at = Instant::now();
    for yields in 0..=max {
        if done() {
            assert_eq!(Instant::now(), at, "the clock moved");
            return Some(yields);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// A hedged call whose three attempts' bodies are read by tasks of their own, over a body the
/// test feeds through `chunks`.
struct Hedged {
    call: CallHandle,
    chunks: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    attempts: mpsc::UnboundedReceiver<BodyAttempt>,
    limits: BufferLimits,
}

impl Hedged {
    /// Starts the call: up to 4 attempts, 100 ms apart, within `limits`; attempt `n` stops
    /// reading its body at `stall_at[n]` bytes.
    fn start(limits: BufferLimits, stall_at: HashMap<u32, usize>) -> Hedged {
        let policies = Policies::builder()
            .service(SERVICE, hedge(4, 100))
            .buffer_limits(limits.clone())
            .build();
        let (arrivals, attempts) = mpsc::unbounded_channel();
        let svc = HedgeLayer::new(policies).layer(BodyReader {
            arrivals,
            stall_at: Arc::new(stall_at),
            pump_in_task: true,
        });
        let (chunks, source) = mpsc::channel(8);
        let body = StreamBody::new(ReceiverStream::new(source)).boxed();
        let request = Request::post(METHOD)
            .header("content-type", "application/grpc")
            .body(body)
            .unwrap();
        Hedged {
            call: tokio::spawn(svc.oneshot(request)),
            chunks,
            attempts,
            limits,
        }
    }

    fn send(&self, data: &'static str) {
        self.chunks
            .try_send(Ok(Frame::data(Bytes::from_static(data.as_bytes()))))
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_response_cancels_every_other_attempt_at_once_while_bodies_stream_in_tasks() {
    let mut hedged = Hedged::start(BufferLimits::new(1024, 1024 * 1024), HashMap::new());
    let start = Instant::now();
    hedged.send("aaaa");
    let first = hedged.attempts.recv().await.unwrap();
    sleep_until(start + ms(100)).await;
    let mut second = hedged.attempts.recv().await.unwrap();
    sleep_until(start + ms(200)).await;
    let third = hedged.attempts.recv().await.unwrap();
    sleep_until(start + ms(250)).await;
    for attempt in [&first, &second, &third] {
        assert_eq!(attempt.received(), b"aaaa", "attempt {}", attempt.number);
    }
    assert_eq!(hedged.limits.in_use(), 4);

    // Response headers: the second attempt wins, and goes on sending its body.
    second.answer(marked(headers_only(), 2));
    let yields = yields_until(2, || {
        hedged.call.is_finished() && first.cancelled() && third.cancelled()
    })
    .await;
    assert!(
        yields.is_some(),
        "the other attempts are still in flight: first cancelled {}, third cancelled {}",
        first.cancelled(),
        third.cancelled()
    );
    assert!(!second.cancelled());
    assert_eq!(hedged.limits.in_use(), 0, "the record is freed on commit");

    hedged.send("bbbb");
    drop(hedged.chunks);
    let response = hedged.call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some("2"));
    assert_eq!(attempts(&response), Attempts::new(3, 0));
    sleep_until(start + ms(251)).await;
    assert_eq!(second.received(), b"aaaabbbb", "the whole body, intact");
    assert!(!second.cut_off());
    assert!(first.cut_off() && third.cut_off(), "their bodies end too");
    assert_eq!(hedged.limits.in_use(), 0);
    assert!(hedged.attempts.try_recv().is_err(), "no fourth attempt");
}

#[tokio::test(start_paused = true)]
async fn a_body_outgrowing_its_limit_in_a_transport_task_cancels_every_other_attempt_at_once() {
    // 8 bytes per call. Attempt 1 stops reading at 4 bytes; attempts 2 and 3 read on. The
    // chunk that takes the body past 8 bytes is read by the task of attempt 2 or 3, which
    // commits the call to its attempt; the call must then drop the other two attempts'
    // futures without any timer of its own firing (the fourth hedge is due only at 300 ms).
    let mut hedged = Hedged::start(BufferLimits::new(8, 1024), HashMap::from([(1, 4)]));
    let start = Instant::now();
    hedged.send("aaaa");
    let first = hedged.attempts.recv().await.unwrap();
    sleep_until(start + ms(100)).await;
    let second = hedged.attempts.recv().await.unwrap();
    sleep_until(start + ms(150)).await;
    hedged.send("bbbb");
    sleep_until(start + ms(200)).await;
    let third = hedged.attempts.recv().await.unwrap();
    sleep_until(start + ms(250)).await;
    assert_eq!(first.received(), b"aaaa");
    assert_eq!(second.received(), b"aaaabbbb");
    assert_eq!(third.received(), b"aaaabbbb");
    assert_eq!(hedged.limits.in_use(), 8);

    hedged.send("cccc");
    let committed = |attempt: &BodyAttempt| attempt.received().len() == 12;
    let yields = yields_until(2, || {
        let (winner, loser) = if committed(&second) {
            (&second, &third)
        } else {
            (&third, &second)
        };
        committed(winner) && first.cancelled() && loser.cancelled()
    })
    .await;
    let (mut winner, loser) = if committed(&second) {
        (second, third)
    } else {
        (third, second)
    };
    assert!(
        yields.is_some(),
        "attempt {} committed the call, yet the others are in flight: first cancelled {}, \
         attempt {} cancelled {}",
        winner.number,
        first.cancelled(),
        loser.number,
        loser.cancelled()
    );
    assert!(!winner.cancelled() && !winner.cut_off());
    assert_eq!(hedged.limits.in_use(), 0, "the record is freed on commit");
    assert!(!hedged.call.is_finished(), "the committed attempt goes on");

    // No fourth hedge, though it was due at 300 ms.
    sleep_until(start + ms(1000)).await;
    assert!(hedged.attempts.try_recv().is_err());
    assert!(loser.cut_off(), "the other attempt's body ends too");
    hedged.send("dddd");
    drop(hedged.chunks);
    sleep_until(start + ms(1001)).await;
    assert_eq!(
        winner.received(),
        b"aaaabbbbccccdddd",
        "the whole body, intact"
    );
    let number = winner.number;
    winner.answer(marked(grpc_ok(), number));
    let response = hedged.call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some(number.to_string().as_str()));
    assert_eq!(attempts(&response), Attempts::new(3, 0));
    assert_eq!(hedged.limits.in_use(), 0);
}
