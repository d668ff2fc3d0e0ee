//! The one error type of the HTTP layer and its mapping to status codes and JSON bodies.
//! Internal error text is logged, never returned.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::api::{ErrorBody, ErrorDetail, FieldError};

/// An error answered to an RPC client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or does not have the request's shape (unknown or missing field).
    #[error("{message}")]
    InvalidJson {
        /// Where in the body.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A field has a value that is not allowed.
    #[error("{0:?}")]
    InvalidField(FieldError),
    /// The body is larger than allowed.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit.
        limit: usize,
    },
    /// No valid bearer token was presented.
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    /// The token may not do this.
    #[error("{message}")]
    Forbidden {
        /// What was refused, naming the token (never the token itself).
        message: String,
        /// The offending field, when there is one.
        field: Option<String>,
    },
    /// The token's request rate is exceeded; nothing was stored.
    #[error("token {name:?} is over its request rate; retry in {} ms", retry_after.as_millis())]
    RateLimited {
        /// The token's name.
        name: String,
        /// When a request will be admitted again.
        retry_after: std::time::Duration,
    },
    /// No such resource.
    #[error("{0}")]
    NotFound(String),
    /// The JobDB cannot take the request now; nothing was stored.
    #[error("{0}")]
    Unavailable(String),
    /// The request names a state of this Director that is not the current one.
    #[error("{message}")]
    Conflict {
        /// What differs.
        message: String,
        /// The field naming the expected state.
        field: Option<String>,
    },
    /// The request's `If-Match` names another version than the resource's: nothing changed.
    #[error("{0}")]
    PreconditionFailed(String),
    /// The Director is stopping and takes no new work.
    #[error("the director is shutting down; submit to another one")]
    ShuttingDown,
    /// The request was being written when its time ran out (or the writer could not find
    /// out whether it committed): it may or may not be stored.
    #[error("{0}")]
    OutcomeUnknown(String),
    /// A bug or an unexpected failure; details are in the log.
    #[error("internal error")]
    Internal,
}

/// What a 504 says.
pub const OUTCOME_UNKNOWN: &str = "the jobs were being written when the time to answer ran \
     out; they may or may not be stored: submit again with the same idempotency keys";

/// The `Retry-After` of a 503 (nothing stored): when the JobDB or a Director may take the
/// request again, in seconds.
const RETRY_AFTER_UNAVAILABLE_S: u64 = 1;

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::InvalidField(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message, field) = match self {
            ApiError::InvalidJson { field, message } => {
                (StatusCode::BAD_REQUEST, "invalid_json", message, field)
            }
            ApiError::InvalidField(e) if e.too_large => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("{} {}", e.field, e.message),
                Some(e.field),
            ),
            ApiError::InvalidField(e) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_field",
                format!("{} {}", e.field, e.message),
                Some(e.field),
            ),
            e @ ApiError::BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                e.to_string(),
                Some("body".to_owned()),
            ),
            e @ ApiError::Unauthenticated => {
                let body = ErrorBody {
                    error: ErrorDetail {
                        code: "unauthenticated".to_owned(),
                        message: e.to_string(),
                        field: None,
                    },
                };
                return (
                    StatusCode::UNAUTHORIZED,
                    [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
                    Json(body),
                )
                    .into_response();
            }
            ApiError::Forbidden { message, field } => {
                (StatusCode::FORBIDDEN, "forbidden", message, field)
            }
            ApiError::RateLimited { name, retry_after } => {
                let seconds = retry_after.as_secs_f64().ceil().max(1.0) as u64;
                let message =
                    format!("token {name:?} is over its request rate; retry in {seconds} s");
                let body = ErrorBody {
                    error: ErrorDetail {
                        code: "rate_limited".to_owned(),
                        message,
                        field: None,
                    },
                };
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(axum::http::header::RETRY_AFTER, seconds.to_string())],
                    Json(body),
                )
                    .into_response();
            }
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m, None),
            ApiError::Unavailable(m) => return unavailable("unavailable", m),
            ApiError::Conflict { message, field } => {
                (StatusCode::CONFLICT, "conflict", message, field)
            }
            ApiError::PreconditionFailed(m) => (
                StatusCode::PRECONDITION_FAILED,
                "precondition_failed",
                m,
                Some("If-Match".to_owned()),
            ),
            e @ ApiError::ShuttingDown => return unavailable("shutting_down", e.to_string()),
            ApiError::OutcomeUnknown(m) => {
                (StatusCode::GATEWAY_TIMEOUT, "outcome_unknown", m, None)
            }
            e @ ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                e.to_string(),
                None,
            ),
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message,
                field,
            },
        };
        (status, Json(body)).into_response()
    }
}

/// A 503: nothing was stored; `Retry-After` says when to try again (here or elsewhere).
fn unavailable(code: &str, message: String) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: code.to_owned(),
            message,
            field: None,
        },
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(
            axum::http::header::RETRY_AFTER,
            RETRY_AFTER_UNAVAILABLE_S.to_string(),
        )],
        Json(body),
    )
        .into_response()
}
