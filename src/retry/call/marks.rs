//! What a call's result carries about its attempts, as the engine says.

use http::Response;

use crate::engine::AttemptMarks;
use crate::error::Attempted;
use crate::error::BoxError;
use crate::metadata::{Attempts, GRPC_PREVIOUS_RPC_ATTEMPTS_NAME};

/// The call's result. A response of a call that made more than one attempt carries an
/// [`Attempts`] extension and, for gRPC, its attempt's `grpc-previous-rpc-attempts`; a call
/// of one attempt returns its response as it is (like that header, A6: "it will not be
/// present on the first RPC"), so the success path allocates nothing. An error is always one
/// [`Attempted`] around the last error, whatever the number of attempts, so that its type
/// does not change the first time a call retries.
pub(super) fn finish<RB>(
    result: Result<Response<RB>, BoxError>,
    marks: AttemptMarks,
    grpc: bool,
) -> Result<Response<RB>, BoxError> {
    match result {
        Ok(mut response) => {
            if marks.attempts.sent() <= 1 {
                return Ok(response);
            }
            if grpc && marks.previous > 0 {
                response.headers_mut().insert(
                    GRPC_PREVIOUS_RPC_ATTEMPTS_NAME,
                    http::HeaderValue::from(marks.previous),
                );
            }
            response.extensions_mut().insert(marks.attempts);
            Ok(response)
        }
        Err(error) => Err(mark_error(error, marks.attempts, marks.previous, grpc)),
    }
}

/// Wraps the last error in [`Attempted`], once: an error that is one already (from a stack
/// of the crate's layers below, driving calls of its own) is kept as it is.
///
/// With the `tonic` feature, a gRPC status also carries the count as A6's
/// `grpc-previous-rpc-attempts` metadata, and a gRPC call whose last attempt could not be
/// sent (no connection could be made) fails with `UNAVAILABLE`, as grpc-go's and grpc-java's
/// do, with the transport's error as the status's source. tonic's client finds the status in
/// the error's chain.
fn mark_error(error: BoxError, attempts: Attempts, previous: u32, grpc: bool) -> BoxError {
    if error.is::<Attempted>() {
        return error;
    }
    #[cfg(feature = "tonic")]
    let error = grpc_status(error, previous, grpc);
    #[cfg(not(feature = "tonic"))]
    let _ = (previous, grpc);
    Box::new(Attempted::new(error, attempts))
}

/// The gRPC status a gRPC call's error stands for: the error itself when it is a status (with
/// the attempts before its own in its metadata), `UNAVAILABLE` when no connection could be
/// made, else the error as it is.
#[cfg(feature = "tonic")]
fn grpc_status(error: BoxError, previous: u32, grpc: bool) -> BoxError {
    let mut status = match error.downcast::<tonic::Status>() {
        Ok(status) => status,
        Err(error)
            if grpc
                && crate::classify::transport_outcome(&*error)
                    == Some(crate::classify::Outcome::NotSent) =>
        {
            let mut status = Box::new(tonic::Status::unavailable(error.to_string()));
            status.set_source(std::sync::Arc::from(error));
            status
        }
        Err(error) => return error,
    };
    if previous > 0 {
        status.metadata_mut().insert(
            crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS,
            tonic::metadata::MetadataValue::from(previous),
        );
    }
    status
}

/// The error for a call that ends with no attempt result to return. The engine keeps a
/// failure before it ends a call with it, so this is a bug.
pub(super) fn no_result() -> BoxError {
    "no attempt result left to return".into()
}
