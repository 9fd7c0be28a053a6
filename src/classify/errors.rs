//! Recognising transport errors that prove a request never reached the server's application.

use std::error::Error;
use std::io;

use super::Outcome;

/// How deep [`is_not_sent`] and [`is_refused`] walk an error's `source()` chain. Error
/// chains are short; the bound keeps a cyclic or hostile chain from looping.
const MAX_SOURCE_DEPTH: usize = 32;

fn chain<'a>(error: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |e: &&'a (dyn Error + 'static)| (*e).source())
        .take(MAX_SOURCE_DEPTH)
}

/// Whether the error proves that the request never left the client.
///
/// True when the chain holds an [`io::Error`] of kind `ConnectionRefused` (the connection
/// was never made), and, with the `hyper-util` feature, a hyper-util legacy client error
/// whose `is_connect()` is true.
pub(crate) fn is_not_sent(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::ConnectionRefused;
        }
        #[cfg(feature = "hyper-util")]
        if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            return e.is_connect();
        }
        false
    })
}

/// Whether the error proves that the request reached the server but not its application:
/// an HTTP/2 `REFUSED_STREAM` reset, or a `GOAWAY` from the server (h2 fails only the streams
/// the `GOAWAY` says were not processed). Needs the `h2` feature; without it, always false.
pub(crate) fn is_refused(error: &(dyn Error + 'static)) -> bool {
    #[cfg(feature = "h2")]
    {
        chain(error).any(|e| {
            e.downcast_ref::<h2::Error>().is_some_and(|h2| {
                h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                    || (h2.is_go_away() && h2.is_remote())
            })
        })
    }
    #[cfg(not(feature = "h2"))]
    {
        let _ = error;
        false
    }
}

/// [`Outcome::NotSent`] or [`Outcome::Refused`] when the error proves one of them, else
/// `None`. Built-in classifiers call this first for every error.
///
/// - `NotSent`: the request never left the client. The error's `source()` chain holds an
///   [`io::Error`] of kind `ConnectionRefused` (the connection was never made) or, with the
///   `hyper-util` feature, a hyper-util legacy client error whose `is_connect()` is true.
/// - `Refused`: the request reached the server but not its application. The chain holds an
///   HTTP/2 `REFUSED_STREAM` reset, or a `GOAWAY` from the server (h2 fails only the streams
///   the `GOAWAY` says were not processed). Needs the `h2` feature.
///
/// ```
/// use tower_retry_hedge::classify::{transport_outcome, Outcome};
///
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(transport_outcome(&refused), Some(Outcome::NotSent));
/// let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
/// assert_eq!(transport_outcome(&reset), None);
/// ```
pub fn transport_outcome(error: &(dyn Error + Send + Sync + 'static)) -> Option<Outcome> {
    if is_not_sent(error) {
        Some(Outcome::NotSent)
    } else if is_refused(error) {
        Some(Outcome::Refused)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    #[derive(Debug)]
    struct Wrapper(io::Error);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("transport error")
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn connection_refused_deep_in_the_chain_is_not_sent() {
        let e = Wrapper(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(is_not_sent(&e));
        assert_eq!(transport_outcome(&e), Some(Outcome::NotSent));
        let e = Wrapper(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(!is_not_sent(&e));
        assert_eq!(transport_outcome(&e), None);
    }

    #[cfg(feature = "h2")]
    #[test]
    fn refused_stream_is_refused() {
        let e: h2::Error = h2::Reason::REFUSED_STREAM.into();
        assert!(is_refused(&e));
        let e: h2::Error = h2::Reason::INTERNAL_ERROR.into();
        assert!(!is_refused(&e));
    }
}
