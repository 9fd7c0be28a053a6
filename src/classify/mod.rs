//! Outcome classification: to be written.

mod code;

pub use code::{Code, GrpcCodes, UnknownCode};
