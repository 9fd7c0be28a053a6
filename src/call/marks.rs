//! What a call's result carries about its attempts, as the engine's [`Marks`] say.

use http::Response;

use crate::BoxError;
use crate::engine::Marks;
use crate::error::Attempted;
use crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS_NAME;

/// The call's result, marked as the engine says when it made more than one attempt: an
/// [`Attempts`](crate::metadata::Attempts) response extension and, for gRPC, the result's
/// attempt's `grpc-previous-rpc-attempts`; or an [`Attempted`] error around the last error.
/// Like that header (A6: "it will not be present on the first RPC"), a call of one attempt
/// is returned as it is, so the success path allocates nothing.
pub(super) fn finish<RB>(
    result: Result<Response<RB>, BoxError>,
    marks: Option<Marks>,
    grpc: bool,
) -> Result<Response<RB>, BoxError> {
    let Some(marks) = marks else {
        return result;
    };
    match result {
        Ok(mut response) => {
            if grpc && marks.previous > 0 {
                response.headers_mut().insert(
                    GRPC_PREVIOUS_RPC_ATTEMPTS_NAME,
                    http::HeaderValue::from(marks.previous),
                );
            }
            response.extensions_mut().insert(marks.attempts);
            Ok(response)
        }
        Err(error) => Err(mark_error(error, marks)),
    }
}

/// A gRPC status keeps its type (tonic's client reads it as it is) and carries the count as
/// A6's `grpc-previous-rpc-attempts` metadata; any other error is wrapped in [`Attempted`].
fn mark_error(error: BoxError, marks: Marks) -> BoxError {
    #[cfg(feature = "tonic")]
    let error = match error.downcast::<tonic::Status>() {
        Ok(mut status) => {
            if marks.previous > 0 {
                status.metadata_mut().insert(
                    crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS,
                    tonic::metadata::MetadataValue::from(marks.previous),
                );
            }
            return status;
        }
        Err(error) => error,
    };
    Box::new(Attempted::new(error, marks.attempts))
}

/// The error for a call that ends with no attempt result to return. The engine keeps a
/// failure before it ends a call with it, so this is a bug.
pub(super) fn no_result() -> BoxError {
    "no attempt result left to return".into()
}
