//! The error type handlers return: a status code plus a short plain-text body, the way
//! Consul reports errors (never JSON).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// An HTTP error answered as plain text with the matching status code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 400: malformed request (`Missing key name`, `Conflicting flags`, decode failures).
    #[error("{0}")]
    BadRequest(String),
    /// 404 with a text body (session renew of an unknown session).
    #[error("{0}")]
    NotFound(String),
    /// 413: KV value larger than `kv_max_value_size`.
    #[error("{0}")]
    TooLarge(String),
    /// 500: errors Consul raises inside its RPC layer (invalid session, invalid TTL...).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status(),
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.to_string(),
        )
            .into_response()
    }
}
