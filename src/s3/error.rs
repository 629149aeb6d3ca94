//! The S3 endpoint's errors: the only place its error codes are chosen, for each kind of service
//! failure (with what every protocol's errors share: the message a client may read, the detail
//! of an internal error logged once, `Retry-After` where waiting helps; the failure kept as the
//! error's source), and the XML answers of the refusals the common layers make themselves (a
//! panic, the request timeout).

use axum::http::{HeaderMap, HeaderValue, header};
use s3s::{S3Error, S3ErrorCode, s3_error};

use crate::service::{ErrorKind, ServiceError};
use crate::transport::error_parts::{ErrorClass, ErrorParts};

/// S3's code for each kind of service failure.
fn code_of(kind: ErrorKind) -> S3ErrorCode {
    match kind {
        // S3 has no code for gone: a version no longer kept has no keys.
        ErrorKind::NotFound | ErrorKind::Gone => S3ErrorCode::NoSuchKey,
        ErrorKind::BadInput => S3ErrorCode::InvalidArgument,
        ErrorKind::Refused => S3ErrorCode::InvalidObjectState,
        ErrorKind::Busy { .. } => S3ErrorCode::SlowDown,
        ErrorKind::Unavailable { .. } => S3ErrorCode::ServiceUnavailable,
        ErrorKind::Internal => S3ErrorCode::InternalError,
        ErrorKind::TooLarge => S3ErrorCode::EntityTooLarge,
    }
}

/// The S3 error of a service failure.
pub(super) fn service_error(error: ServiceError) -> S3Error {
    let parts = ErrorParts::of(&error, ErrorClass::Service(&error), "s3");
    let mut s3_error = S3Error::with_message(code_of(error.kind()), parts.message.clone());
    if parts.retry_after.is_some() {
        // s3s sends these headers instead of its own: the body's type goes with them.
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml"));
        parts.add_headers(&mut headers);
        s3_error.set_headers(headers);
    }
    s3_error.set_source(Box::new(error));
    s3_error
}

/// A handler's panic, answered as S3 answers an internal error.
pub(super) fn internal_error() -> axum::response::Response {
    s3_error_response(S3Error::with_message(S3ErrorCode::InternalError, "internal error"))
}

/// An answer not started within `request_timeout_secs`, as S3's `RequestTimeout`.
pub(super) fn request_timeout() -> axum::response::Response {
    s3_error_response(s3_error!(RequestTimeout, "the answer did not start within the request timeout"))
}

/// An S3 error as the XML response `s3s` writes for it.
fn s3_error_response(error: S3Error) -> axum::response::Response {
    let status = error.status_code().unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    let code = error.code().as_str().to_owned();
    let message = error.message().unwrap_or_default().to_owned();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{}</Message></Error>",
        xml_escape(&message)
    );
    axum::response::IntoResponse::into_response((status, [(header::CONTENT_TYPE, "application/xml")], body))
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::served::INTERNAL_MESSAGE;

    #[test]
    fn each_kind_of_failure_has_its_s3_code_and_status() {
        let cases = [
            (ServiceError::ModelNotFound("m".into()), "NoSuchKey", 404),
            (ServiceError::NotReady, "ServiceUnavailable", 503),
            (ServiceError::ChangedOnDisk { model: "m".into() }, "ServiceUnavailable", 503),
            (ServiceError::Internal("the disk at /srv/x failed".into()), "InternalError", 500),
        ];
        for (error, code, status) in cases {
            let said = error.to_string();
            let s3 = service_error(error);
            assert_eq!((s3.code().as_str(), s3.status_code().map(|s| s.as_u16())), (code, Some(status)), "{said}");
            assert!(s3.source().is_some(), "{said}: the failure is kept as the source");
        }
    }

    #[test]
    fn an_internal_error_is_told_generically_and_a_busy_one_when_to_retry() {
        let internal = service_error(ServiceError::Internal("the disk at /srv/x failed".into()));
        assert_eq!(internal.message(), Some(INTERNAL_MESSAGE));
        assert!(internal.headers().is_none());
        let changed = service_error(ServiceError::ChangedOnDisk { model: "m".into() });
        let headers = changed.headers().expect("Retry-After");
        assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "1");
        assert_eq!(headers.get(header::CONTENT_TYPE).unwrap(), "application/xml");
    }

    #[test]
    fn the_layers_refusals_are_s3_xml() {
        let response = request_timeout();
        assert_eq!(response.status(), 400, "S3 answers RequestTimeout 400");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/xml");
        assert_eq!(xml_escape("<a & b>"), "&lt;a &amp; b&gt;");
    }
}
