//! Messages for the `grpc` crate's client as bytes, already encoded: what a client needs
//! that has no generated code (`grpc_channel`, `grpc_channel_probe`, `tests/grpc_channel`).

use bytes::{Buf, Bytes};
use grpc::core::{RecvMessage, SendMessage};

/// A message already encoded, sent as it is.
pub struct Raw(pub Bytes);

impl SendMessage for Raw {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(self.0.clone()))
    }
}

/// A received message, as its bytes.
#[derive(Default)]
pub struct RawReply(pub Option<Bytes>);

impl RecvMessage for RawReply {
    fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
        self.0 = Some(data.copy_to_bytes(data.remaining()));
        Ok(())
    }
}
