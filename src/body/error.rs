//! [`NotReplayable`]: why a reader cannot replay the body.

use std::fmt;
use std::sync::Arc;

use super::{BoxError, Overflow};
#[cfg(doc)]
use super::{BufferLimits, ReplayBody};

/// The most bytes of a source error's message that [`NotReplayable`] keeps.
pub(super) const MAX_SOURCE_MESSAGE: usize = 1024;

/// Why a body cannot be replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Reason {
    /// A chunk would have taken the record over a limit.
    Limit(Overflow),
    /// The call chose another reader ([`ReplayBody::commit_to`]).
    Chosen,
    /// The source failed, with this (bounded) message.
    SourceFailed(Arc<str>),
}

/// The error a reader gets when the body cannot be replayed: the call was committed to
/// another reader, because the body outgrew a limit, because the layers chose that reader,
/// or because the source failed (the source's error went to the reader that hit it).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower_retry_hedge::body::{BufferLimits, NotReplayable, ReplayBody};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_retry_hedge::body::BoxError> {
/// let limits = BufferLimits::default();
/// let template = ReplayBody::try_new(Full::new(Bytes::from_static(b"x")), &limits)
///     .map_err(|_| "body too large to replay")?;
/// template.clone().commit();
/// let error = template.clone().collect().await.err().ok_or("must fail")?;
/// let error = error.downcast_ref::<NotReplayable>().ok_or("not a NotReplayable")?;
/// assert!(!error.is_source_failure());
/// assert_eq!(
///     error.to_string(),
///     "request body cannot be replayed: the call was committed to another attempt"
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReplayable {
    pub(super) reason: Reason,
}

impl NotReplayable {
    /// Whether the body cannot be replayed because its source failed (rather than because
    /// the call outgrew a limit or was committed to another attempt).
    pub fn is_source_failure(&self) -> bool {
        matches!(self.reason, Reason::SourceFailed(_))
    }

    /// Whether the body cannot be replayed because it outgrew the per-call limit or the
    /// total budget of [`BufferLimits`].
    pub fn is_over_limit(&self) -> bool {
        matches!(self.reason, Reason::Limit(_))
    }
}

impl fmt::Display for NotReplayable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Reason::Limit(Overflow::PerCall) => f.write_str(
                "request body exceeded the per-call retry buffer limit and cannot be replayed",
            ),
            Reason::Limit(Overflow::Total) => f.write_str(
                "request body exceeded the total retry buffer budget and cannot be replayed",
            ),
            Reason::Chosen => f.write_str(
                "request body cannot be replayed: the call was committed to another attempt",
            ),
            Reason::SourceFailed(message) => {
                write!(
                    f,
                    "request body cannot be replayed: its source failed: {message}"
                )
            }
        }
    }
}

impl std::error::Error for NotReplayable {}

/// `error`'s message, cut to at most [`MAX_SOURCE_MESSAGE`] bytes without ever formatting
/// more than that (the source's `Display` is not ours to trust).
pub(super) fn bounded_message(error: &BoxError) -> Arc<str> {
    struct Bounded(String);

    impl fmt::Write for Bounded {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let room = MAX_SOURCE_MESSAGE.saturating_sub(self.0.len());
            if s.len() <= room {
                self.0.push_str(s);
                return Ok(());
            }
            self.0.push_str(&s[..s.floor_char_boundary(room)]);
            // Stops the formatting: the message is full.
            Err(fmt::Error)
        }
    }

    let mut message = Bounded(String::new());
    let _ = fmt::write(&mut message, format_args!("{error}"));
    Arc::from(message.0)
}
