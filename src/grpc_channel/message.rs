//! The application's messages as a request body that [`ReplayBody`](crate::body::ReplayBody)
//! can record and replay: one data frame per message, as the encoder gave it, which the
//! record keeps as it is (empty messages too: see
//! [`records_messages`](crate::body::ReplayBody::records_messages)). Each attempt
//! sends every frame it reads as one message: nothing to frame, nothing to split again.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::mpsc;

/// The messages the application sends, as a body: a data frame per message, the end when
/// the application ends its stream.
pub(super) struct Messages(mpsc::Receiver<Bytes>);

impl Messages {
    pub(super) fn new(receiver: mpsc::Receiver<Bytes>) -> Messages {
        Messages(receiver)
    }
}

impl Body for Messages {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|message| message.map(|message| Ok(Frame::data(message))))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::body::{BufferLimits, ReplayBody};

    async fn frames(body: &mut ReplayBody<Messages>) -> Vec<Bytes> {
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            frames.push(frame.expect("no error").into_data().expect("data"));
        }
        frames
    }

    #[tokio::test]
    async fn every_reader_gets_each_message_as_it_was_sent_empty_ones_too() {
        let messages = [
            Bytes::from_static(b"hello"),
            Bytes::new(),
            Bytes::from(vec![7u8; 1000]),
            Bytes::new(),
        ];
        let (sender, receiver) = mpsc::channel(messages.len());
        for message in &messages {
            sender.try_send(message.clone()).expect("room");
        }
        drop(sender);
        let limits = BufferLimits::new(4096, 1 << 20);
        let mut first = ReplayBody::try_new_unpin(Messages::new(receiver), &limits)
            .unwrap_or_else(|_| panic!("within the limits"))
            .records_messages();
        let mut second = first.clone();
        assert_eq!(frames(&mut first).await, messages);
        let replayed = frames(&mut second).await;
        assert_eq!(replayed, messages);
        // The record's own `Bytes`: no copy per attempt.
        assert_eq!(replayed[2].as_ptr(), messages[2].as_ptr());
        // Each message's bytes and its 5-byte gRPC header count toward the limits.
        assert_eq!(limits.in_use(), 1005 + 4 * 5);
    }

    #[tokio::test]
    async fn a_stream_of_empty_messages_is_bounded_by_the_limits() {
        let (sender, receiver) = mpsc::channel(64);
        // 50 bytes per call: ten empty messages fit (5 bytes each), the eleventh does not.
        let limits = BufferLimits::new(50, 1 << 20);
        let mut first = ReplayBody::try_new_unpin(Messages::new(receiver), &limits)
            .unwrap_or_else(|_| panic!("within the limits"))
            .records_messages();
        for _ in 0..11 {
            sender.try_send(Bytes::new()).expect("room");
        }
        drop(sender);
        let sent = frames(&mut first).await;
        assert_eq!(
            sent.len(),
            11,
            "the reader that pulled them sends every message"
        );
        assert!(
            first.is_committed(),
            "the eleventh empty message commits the call"
        );
        assert_eq!(
            limits.in_use(),
            0,
            "committed to the reader at the end: all freed"
        );
    }
}
