//! A `test.echo.BidiEcho` peer that tells a call's attempts apart by what they carry, not by
//! the order they reach it: the scripted peer of `tests/common` answers by arrival index, and
//! hedges sent together reach a server's handlers in any order.
//!
//! Every attempt answers with response headers once its first chunk is in, then echoes every
//! chunk as it arrives and ends OK when its request stream ends; the attempt numbered `fast`
//! (`grpc-previous-rpc-attempts: fast - 1`) answers at once, the others `slow` later. What
//! each attempt received goes to a [`Recorder`] as the common peer's does.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::metadata::MetadataMap;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

use super::common::pb::Chunk;
use super::common::pb::bidi_echo_server::{BidiEcho, BidiEchoServer};
use super::common::{
    AttemptGuard, AttemptRecord, CALL_METADATA, ChunkStream, Method, Outcome, Recorder,
};

#[derive(Clone)]
struct AttemptEcho {
    fast: u32,
    slow: Duration,
    recorder: Recorder,
}

/// A running [`AttemptEcho`] on 127.0.0.1.
pub(crate) struct AttemptPeer {
    addr: SocketAddr,
    recorder: Recorder,
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl AttemptPeer {
    /// Serves on `127.0.0.1:0`: attempt `fast` answers at once, the others after `slow`.
    pub(crate) async fn spawn(fast: u32, slow: Duration) -> AttemptPeer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        let recorder = Recorder::new();
        let service = AttemptEcho {
            fast,
            slow,
            recorder: recorder.clone(),
        };
        // tonic ignores its own nodelay setting for a custom incoming stream.
        let incoming = TcpListenerStream::new(listener).map(|conn| {
            conn.and_then(|stream| {
                stream.set_nodelay(true)?;
                Ok(stream)
            })
        });
        let (shutdown, signal) = oneshot::channel::<()>();
        let server = tokio::spawn(
            Server::builder()
                .add_service(BidiEchoServer::new(service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = signal.await;
                }),
        );
        AttemptPeer {
            addr,
            recorder,
            shutdown: Some(shutdown),
            server,
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn recorder(&self) -> Recorder {
        self.recorder.clone()
    }

    /// Stops accepting, waits for the open connections to close and the server to end.
    pub(crate) async fn shutdown(mut self) {
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
        match (&mut self.server).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => panic!("attempt peer failed: {error}"),
            Err(error) => panic!("attempt peer task failed: {error}"),
        }
    }
}

impl Drop for AttemptPeer {
    fn drop(&mut self) {
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
    }
}

fn record_chunk(guard: &AttemptGuard<AttemptRecord>, received: &mut BytesMut, chunk: &Chunk) {
    received.extend_from_slice(&chunk.data);
    let payload = Bytes::copy_from_slice(received);
    guard.update(|record| {
        record.payload = payload;
        record.messages = record.messages.saturating_add(1);
    });
}

fn header(metadata: &MetadataMap, name: &str) -> Option<String> {
    metadata
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tonic::async_trait]
impl BidiEcho for AttemptEcho {
    type BidiStream = ChunkStream;

    async fn bidi(
        &self,
        request: Request<Streaming<Chunk>>,
    ) -> Result<Response<ChunkStream>, Status> {
        let metadata = request.metadata().clone();
        let call = header(&metadata, CALL_METADATA)
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0);
        let previous_attempts = header(&metadata, "grpc-previous-rpc-attempts");
        let number = previous_attempts
            .as_deref()
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(1, |previous| previous + 1);
        let mut stream = request.into_inner();
        let arrived = Instant::now();
        let guard = self.recorder.begin(&call, |attempt| AttemptRecord {
            call,
            attempt,
            method: Method::Bidi,
            previous_attempts,
            grpc_timeout: header(&metadata, "grpc-timeout"),
            metadata: metadata.clone(),
            message: String::new(),
            payload: Bytes::new(),
            messages: 0,
            arrived,
            ended: None,
            cancelled: false,
            outcome: None,
        });
        let mut received = BytesMut::new();
        // The client went away before its first chunk: the guard records a cancellation.
        let first = stream.message().await?;
        if let Some(chunk) = &first {
            record_chunk(&guard, &mut received, chunk);
        }
        if number != self.fast {
            tokio::time::sleep(self.slow).await;
        }
        let (echoes, replies) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut next = first;
            while let Some(chunk) = next {
                if echoes.send(Ok(chunk)).await.is_err() {
                    // The client dropped the response: the guard records a cancellation.
                    return;
                }
                next = match stream.message().await {
                    Ok(Some(chunk)) => {
                        record_chunk(&guard, &mut received, &chunk);
                        Some(chunk)
                    }
                    Ok(None) => None,
                    // The request stream broke off: the guard records a cancellation.
                    Err(_) => return,
                };
            }
            let now = Instant::now();
            guard.finish(|record| {
                record.outcome = Some(Outcome::Ok);
                record.ended = Some(now);
            });
        });
        Ok(Response::new(ReceiverStream::new(replies)))
    }
}
