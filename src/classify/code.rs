//! gRPC status codes and sets of them.

use std::fmt;
use std::str::FromStr;

/// A gRPC status code (the 17 codes of `grpc/status.proto`).
///
/// Kept here rather than borrowed from tonic so that the crate works with any
/// gRPC stack, and so that service-config JSON can be validated without tonic.
///
/// ```
/// use tower_retry_hedge::classify::Code;
///
/// assert_eq!("unavailable".parse::<Code>(), Ok(Code::Unavailable));
/// assert_eq!(Code::from_i32(4), Some(Code::DeadlineExceeded));
/// assert_eq!(Code::Unavailable.as_str(), "UNAVAILABLE");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)] // the names are the gRPC specification's
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

const ALL: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

impl Code {
    /// The code with this number, if it is one of the 17.
    pub fn from_i32(value: i32) -> Option<Code> {
        usize::try_from(value)
            .ok()
            .and_then(|i| ALL.get(i).copied())
    }

    /// The code's number.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// The specification's upper-case name, such as `"UNAVAILABLE"`.
    pub fn as_str(self) -> &'static str {
        NAMES[self as usize]
    }

    /// Parses the value of a `grpc-status` header: a decimal number with no sign,
    /// no leading zeros beyond a lone `0`, and no other characters.
    ///
    /// Returns `None` for anything else, which callers treat as `UNKNOWN`.
    pub fn from_header_bytes(bytes: &[u8]) -> Option<Code> {
        match bytes {
            [d @ b'0'..=b'9'] => Code::from_i32(i32::from(d - b'0')),
            [b'1', d @ b'0'..=b'6'] => Code::from_i32(10 + i32::from(d - b'0')),
            _ => None,
        }
    }

    /// The header value that carries this code in `grpc-status`.
    pub fn header_value(self) -> http::HeaderValue {
        const VALUES: [&str; 17] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
            "16",
        ];
        http::HeaderValue::from_static(VALUES[self as usize])
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing a [`Code`] from a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCode(String);

impl fmt::Display for UnknownCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown gRPC status code name {:?}", self.0)
    }
}

impl std::error::Error for UnknownCode {}

impl FromStr for Code {
    type Err = UnknownCode;

    /// Case-insensitive, as gRFC A6 allows for service config (`"unavailable"`).
    fn from_str(s: &str) -> Result<Code, UnknownCode> {
        NAMES
            .iter()
            .position(|name| name.eq_ignore_ascii_case(s))
            .map(|i| ALL[i])
            .ok_or_else(|| {
                // Bound what an error message can carry from untrusted input.
                UnknownCode(s.chars().take(64).collect())
            })
    }
}

/// A set of gRPC status codes, stored as a bit set: `Copy`, and a membership test is
/// one instruction.
///
/// ```
/// use tower_retry_hedge::classify::{Code, GrpcCodes};
///
/// let codes = GrpcCodes::from([Code::Unavailable, Code::ResourceExhausted]);
/// assert!(codes.contains(Code::Unavailable));
/// assert!(!codes.contains(Code::Internal));
/// assert_eq!(codes.len(), 2);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GrpcCodes(u32);

impl GrpcCodes {
    /// The empty set.
    pub const fn empty() -> GrpcCodes {
        GrpcCodes(0)
    }

    /// Adds a code.
    #[must_use]
    pub const fn with(self, code: Code) -> GrpcCodes {
        GrpcCodes(self.0 | (1 << code as u32))
    }

    /// Adds a code in place.
    pub fn insert(&mut self, code: Code) {
        self.0 |= 1 << code as u32;
    }

    /// Whether the set holds `code`.
    pub const fn contains(self, code: Code) -> bool {
        self.0 & (1 << code as u32) != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The number of codes in the set.
    pub const fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The codes, in numeric order.
    pub fn iter(self) -> impl Iterator<Item = Code> {
        ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

impl<const N: usize> From<[Code; N]> for GrpcCodes {
    fn from(codes: [Code; N]) -> GrpcCodes {
        codes.into_iter().collect()
    }
}

impl FromIterator<Code> for GrpcCodes {
    fn from_iter<I: IntoIterator<Item = Code>>(iter: I) -> GrpcCodes {
        let mut set = GrpcCodes::empty();
        for code in iter {
            set.insert(code);
        }
        set
    }
}

impl fmt::Debug for GrpcCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_round_trip() {
        for (i, code) in ALL.iter().enumerate() {
            assert_eq!(Code::from_i32(i as i32), Some(*code));
            assert_eq!(code.as_str().parse::<Code>(), Ok(*code));
            assert_eq!(
                code.as_str().to_ascii_lowercase().parse::<Code>(),
                Ok(*code)
            );
            assert_eq!(
                Code::from_header_bytes(code.header_value().as_bytes()),
                Some(*code)
            );
        }
        assert_eq!(Code::from_i32(17), None);
        assert_eq!(Code::from_i32(-1), None);
        assert!("UNAVAILABLE ".parse::<Code>().is_err());
        assert!("".parse::<Code>().is_err());
    }

    #[test]
    fn header_bytes_reject_padding_and_garbage() {
        for bad in [
            &b""[..],
            b"014",
            b"17",
            b"-1",
            b" 1",
            b"1 ",
            b"x",
            b"00",
            b"99",
        ] {
            assert_eq!(Code::from_header_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn set_operations() {
        let set = GrpcCodes::from([Code::Ok, Code::Unauthenticated, Code::Unavailable]);
        assert_eq!(set.len(), 3);
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            vec![Code::Ok, Code::Unavailable, Code::Unauthenticated]
        );
        assert!(GrpcCodes::empty().is_empty());
        assert_eq!(format!("{set:?}"), "{Ok, Unavailable, Unauthenticated}");
    }
}
