//! `grpc_timeout`: to be written.
