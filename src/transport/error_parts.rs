//! What every protocol's error response has in common, whatever its body's shape and its
//! codes: the message a client may read (the detail of the server's own fault logged once at
//! ERROR and replaced by a generic message; a service failure as the service words it for
//! clients; any other error as it says itself), `Retry-After` where waiting helps, and
//! `Content-Range: bytes */LEN` on a refused range. Each protocol keeps only its mapping from
//! its errors to statuses, codes and the shape of its body.

use axum::http::{HeaderMap, HeaderValue, header};

use super::respond::ByteRefusal;
use crate::served::{ClientFacing, INTERNAL_MESSAGE};

/// What an error is, as far as the parts every protocol shares go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ErrorClass<'e> {
    /// A failure the service classified: its words for clients, its retry time.
    Service(&'e dyn ClientFacing),
    /// The server's own fault: logged, never shown.
    Internal,
    /// The answer did not start within the request timeout: retry in a second.
    TimedOut,
    /// A range the representation of `length` bytes cannot satisfy.
    Unsatisfiable { length: u64 },
    /// The protocol's own refusal, which says what is wrong itself.
    Plain,
}

/// The parts every protocol's error response shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorParts {
    /// What the client reads.
    pub message: String,
    /// Seconds to wait before trying again, where waiting helps.
    pub retry_after: Option<u64>,
    /// The length a refused range was measured against.
    pub unsatisfied_length: Option<u64>,
}

impl ErrorParts {
    /// The parts of `error`, of class `class`. An internal error is logged here, once, with its
    /// causes, as a request of `protocol` that failed.
    pub(crate) fn of(error: &dyn std::error::Error, class: ErrorClass<'_>, protocol: &'static str) -> ErrorParts {
        let message = match class {
            ErrorClass::Service(service) => service.message_for_client(),
            ErrorClass::Internal => {
                tracing::error!(error = %Chain(error), protocol, "request failed");
                INTERNAL_MESSAGE.to_owned()
            }
            ErrorClass::TimedOut | ErrorClass::Unsatisfiable { .. } | ErrorClass::Plain => error.to_string(),
        };
        let retry_after = match class {
            ErrorClass::Service(service) => service.retry_after_secs(),
            ErrorClass::TimedOut => Some(1),
            _ => None,
        };
        let unsatisfied_length = match class {
            ErrorClass::Unsatisfiable { length } => Some(length),
            _ => None,
        };
        ErrorParts { message, retry_after, unsatisfied_length }
    }

    /// Adds `Retry-After` and `Content-Range` where they belong.
    pub(crate) fn add_headers(&self, headers: &mut HeaderMap) {
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(after));
        }
        if let Some(length) = self.unsatisfied_length {
            headers.insert(header::CONTENT_RANGE, HeaderValue::from_str(&format!("bytes */{length}")).expect("ASCII"));
        }
    }
}

impl<E: ClientFacing> ByteRefusal<E> {
    /// What the refusal of a byte response is, for its protocol's error.
    pub(crate) fn class(&self) -> ErrorClass<'_> {
        match self {
            ByteRefusal::RangeNotSatisfiable { length } | ByteRefusal::TooManyRanges { length, .. } => {
                ErrorClass::Unsatisfiable { length: *length }
            }
            ByteRefusal::Source(error) => ErrorClass::Service(error),
            ByteRefusal::Internal(_) => ErrorClass::Internal,
        }
    }
}

/// An error and its causes, `: `-separated, for the log.
struct Chain<'e>(&'e dyn std::error::Error);

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            // `#[error(transparent)]` and "…: {0}" wrappers repeat their cause's words.
            if !self.0.to_string().ends_with(&error.to_string()) {
                write!(f, ": {error}")?;
            }
            cause = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn internal_errors_are_told_generically_and_logged_with_their_causes() {
        let error = Outer(std::io::Error::other("disk on fire at /srv/x"));
        let parts = ErrorParts::of(&error, ErrorClass::Internal, "test");
        assert_eq!(parts, ErrorParts { message: INTERNAL_MESSAGE.into(), retry_after: None, unsatisfied_length: None });
        assert_eq!(Chain(&error).to_string(), "outer: disk on fire at /srv/x");
    }

    /// A failure of a source that passes with time, as the service's `ChangedOnDisk` does.
    #[derive(Debug, thiserror::Error)]
    #[error("model \"m\" changed on disk")]
    struct Busy;

    impl ClientFacing for Busy {
        fn message_for_client(&self) -> String {
            self.to_string()
        }

        fn retry_after_secs(&self) -> Option<u64> {
            Some(1)
        }
    }

    #[test]
    fn service_failures_say_when_to_retry_and_refused_ranges_their_length() {
        let busy = Busy;
        let parts = ErrorParts::of(&busy, ErrorClass::Service(&busy), "test");
        assert_eq!((parts.message.as_str(), parts.retry_after), (busy.to_string().as_str(), Some(1)));
        let refusal = ByteRefusal::<Busy>::RangeNotSatisfiable { length: 10 };
        let parts = ErrorParts::of(&refusal, refusal.class(), "test");
        let mut headers = HeaderMap::new();
        parts.add_headers(&mut headers);
        assert_eq!(headers.get(header::CONTENT_RANGE).unwrap(), "bytes */10");
        assert!(headers.get(header::RETRY_AFTER).is_none());
        let parts = ErrorParts::of(&refusal, ErrorClass::TimedOut, "test");
        assert_eq!(parts.retry_after, Some(1));
    }
}
