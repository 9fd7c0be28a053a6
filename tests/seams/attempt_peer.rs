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

use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

use super::common::pb::Chunk;
use super::common::pb::bidi_echo_server::{BidiEcho, BidiEchoServer};
use super::common::{BidiAttempt, ChunkStream, Recorder, ServerTask};

#[derive(Clone)]
struct AttemptEcho {
    fast: u32,
    slow: Duration,
    recorder: Recorder,
}

/// A running [`AttemptEcho`] on 127.0.0.1.
pub(crate) struct AttemptPeer {
    server: ServerTask,
    recorder: Recorder,
}

impl AttemptPeer {
    /// Serves on `127.0.0.1:0`: attempt `fast` answers at once, the others after `slow`.
    pub(crate) async fn spawn(fast: u32, slow: Duration) -> AttemptPeer {
        let recorder = Recorder::new();
        let service = AttemptEcho {
            fast,
            slow,
            recorder: recorder.clone(),
        };
        let server =
            ServerTask::spawn(Server::builder().add_service(BidiEchoServer::new(service))).await;
        AttemptPeer { server, recorder }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    pub(crate) fn recorder(&self) -> Recorder {
        self.recorder.clone()
    }

    /// Stops accepting, waits for the open connections to close and the server to end.
    pub(crate) async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

#[tonic::async_trait]
impl BidiEcho for AttemptEcho {
    type BidiStream = ChunkStream;

    async fn bidi(
        &self,
        request: Request<Streaming<Chunk>>,
    ) -> Result<Response<ChunkStream>, Status> {
        let attempt = BidiAttempt::begin(&self.recorder, request).await?;
        let number = attempt
            .metadata
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(1, |previous| previous + 1);
        if number != self.fast {
            tokio::time::sleep(self.slow).await;
        }
        Ok(Response::new(attempt.echo(None)))
    }
}
