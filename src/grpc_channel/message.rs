//! The application's messages as a request body that [`ReplayBody`](crate::body::ReplayBody)
//! can record and replay: each message is a 4-byte big-endian length and its bytes, so that
//! message boundaries (and empty messages, which a body does not record) survive the replay.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame};
use smallvec::SmallVec;
use tokio::sync::mpsc;

/// The bytes of a message's length prefix.
const PREFIX: usize = 4;

/// A message as the chunks the body carries: its length prefix, then its bytes (as they
/// are: no copy), unless it is empty. The prefix counts toward the buffer limits too.
/// `None` for a message over 4 GiB, which gRPC's own framing cannot carry either.
pub(super) fn frame(message: Bytes) -> Option<SmallVec<[Bytes; 2]>> {
    let len = u32::try_from(message.len()).ok()?;
    let mut chunks = SmallVec::new();
    chunks.push(Bytes::copy_from_slice(&len.to_be_bytes()));
    if !message.is_empty() {
        chunks.push(message);
    }
    Some(chunks)
}

/// The messages the application sends, as a body: a data frame per chunk, the end when the
/// application ends its stream.
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
            .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// Cuts the chunks of a [`Messages`] body back into messages, whatever the chunks' sizes:
/// a message that comes whole in one chunk is a slice of it (no copy).
#[derive(Debug, Default)]
pub(super) struct Unframe {
    /// Bytes of an incomplete prefix or message.
    partial: BytesMut,
    /// The length of the message being gathered, once its prefix is whole.
    want: Option<usize>,
}

impl Unframe {
    /// Takes `chunk` in; gives the messages it completes, in order.
    pub(super) fn push(&mut self, mut chunk: Bytes, out: &mut Vec<Bytes>) {
        while !chunk.is_empty() || self.want == Some(0) {
            match self.want {
                None => {
                    let take = (PREFIX - self.partial.len()).min(chunk.len());
                    self.partial.extend_from_slice(&chunk[..take]);
                    chunk.advance(take);
                    if self.partial.len() == PREFIX {
                        let len = self.partial.get_u32();
                        self.partial.clear();
                        self.want = Some(len as usize);
                    }
                }
                Some(want) if self.partial.is_empty() && chunk.len() >= want => {
                    out.push(chunk.split_to(want));
                    self.want = None;
                }
                Some(want) => {
                    let take = (want - self.partial.len()).min(chunk.len());
                    self.partial.extend_from_slice(&chunk[..take]);
                    chunk.advance(take);
                    if self.partial.len() == want {
                        out.push(self.partial.split().freeze());
                        self.want = None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(chunks: impl IntoIterator<Item = Bytes>) -> Vec<Bytes> {
        let mut unframe = Unframe::default();
        let mut out = Vec::new();
        for chunk in chunks {
            unframe.push(chunk, &mut out);
        }
        out
    }

    #[test]
    fn messages_come_back_whole_whatever_the_chunks() {
        let messages = [
            Bytes::from_static(b"hello"),
            Bytes::new(),
            Bytes::from(vec![7u8; 1000]),
            Bytes::from_static(b"x"),
        ];
        let framed: Vec<Bytes> = messages
            .iter()
            .cloned()
            .flat_map(|m| frame(m).expect("small"))
            .collect();
        // As framed: a prefix chunk and a message chunk each.
        assert_eq!(cut(framed.clone()), messages);
        // One byte at a time.
        let all: Vec<u8> = framed.iter().flat_map(|c| c.to_vec()).collect();
        let bytes: Vec<Bytes> = all.iter().map(|b| Bytes::copy_from_slice(&[*b])).collect();
        assert_eq!(cut(bytes), messages);
        // All in one chunk.
        assert_eq!(cut([Bytes::from(all)]), messages);
    }

    #[test]
    fn a_whole_message_in_one_chunk_is_not_copied() {
        let message = Bytes::from(vec![1u8; 64]);
        let out = cut(frame(message.clone()).expect("small"));
        assert_eq!(out[0].as_ptr(), message.as_ptr());
    }

    #[test]
    fn an_empty_message_is_a_message() {
        let framed = frame(Bytes::new()).expect("small");
        assert_eq!(framed.len(), 1);
        assert_eq!(cut(framed), [Bytes::new()]);
    }
}
