//! The `test.echo.Echo` service of `tests/proto/echo.proto`, failing the first two attempts
//! of every call: the server of the examples that show a client retrying
//! (`tonic_client`, `grpc_channel`).
//!
//! Included with `#[path = "support/echo_peer.rs"] mod echo_peer;`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

/// The code generated from `tests/proto/echo.proto` (package `test.echo`).
#[allow(clippy::all, missing_docs, unreachable_pub, dead_code)]
pub mod pb {
    include!("../../tests/common/pb/test.echo.rs");
}

use pb::echo_server::{Echo, EchoServer};
use pb::{Chunk, Digest, EchoReply, EchoRequest};

/// Serves [`FailsTwice`] on 127.0.0.1 (a port the system picks): its address, and the
/// server's task (abort it to stop the server).
pub async fn serve()
-> std::io::Result<(SocketAddr, JoinHandle<Result<(), tonic::transport::Error>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(
        Server::builder()
            .add_service(EchoServer::new(FailsTwice::default()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Ok((addr, server))
}

/// Fails the first two attempts of every call (by its `call` field) with `UNAVAILABLE`;
/// `Unary` answers the third with an echo. `ServerStream` fails every attempt, and
/// `ClientStream` is not served.
#[derive(Default)]
pub struct FailsTwice {
    attempts: Mutex<HashMap<u32, u32>>,
}

impl FailsTwice {
    /// Counts an attempt of `call`; gives its number, from 1.
    fn attempt(&self, call: u32) -> u32 {
        let mut attempts = self
            .attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = attempts.entry(call).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }
}

#[tonic::async_trait]
impl Echo for FailsTwice {
    async fn unary(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let request = request.into_inner();
        let attempt = self.attempt(request.call);
        if attempt <= 2 {
            return Err(Status::unavailable(format!("attempt {attempt}: try again")));
        }
        Ok(Response::new(EchoReply {
            message: request.message,
            payload: request.payload,
            attempt: attempt.saturating_sub(1),
        }))
    }

    async fn client_stream(
        &self,
        _request: Request<tonic::Streaming<Chunk>>,
    ) -> Result<Response<Digest>, Status> {
        Err(Status::unimplemented("not used by the examples"))
    }

    type ServerStreamStream = tokio_stream::Empty<Result<EchoReply, Status>>;

    async fn server_stream(
        &self,
        request: Request<EchoRequest>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        let attempt = self.attempt(request.into_inner().call);
        Err(Status::unavailable(format!("attempt {attempt}: try again")))
    }
}
