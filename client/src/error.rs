//! The client's errors: what failed (no connection, no answer in time, a broken transfer, an
//! error answer, an answer not understood), with what the server said.
//!
//! Nothing here retries. [`Error::stored_nothing`] tells a caller whether spindle's contract
//! guarantees that nothing of a request was stored, which is what deciding to retry (and where)
//! takes.

use std::fmt;
use std::time::Duration;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The base URL cannot address the API.
    #[error("invalid base url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The token cannot be sent in an `Authorization` header (control characters).
    #[error("the api token is not a valid header value")]
    InvalidToken,
    /// The HTTP client could not be built (TLS backend).
    #[error("cannot build the http client: {0}")]
    Build(#[source] reqwest::Error),
    /// No connection could be made: the request was not sent, nothing was stored.
    #[error("cannot connect to {url}: {}", root_cause(source))]
    Connect {
        /// The request's URL.
        url: String,
        /// The transport's error.
        #[source]
        source: reqwest::Error,
    },
    /// No complete answer within the timeout: the request may or may not have taken effect.
    #[error("no answer from {url} in time: {}", root_cause(source))]
    Timeout {
        /// The request's URL.
        url: String,
        /// The transport's error.
        #[source]
        source: reqwest::Error,
    },
    /// The exchange broke after the request may have been sent (reset, bad framing): it may or
    /// may not have taken effect.
    #[error("{url}: {}", root_cause(source))]
    Transport {
        /// The request's URL.
        url: String,
        /// The transport's error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// The server answered success with a body that is not the expected JSON.
    #[error("unexpected answer from {url} ({status}): {source}")]
    Decode {
        /// The request's URL.
        url: String,
        /// The answer's status.
        status: u16,
        /// Why the body did not parse.
        #[source]
        source: serde_json::Error,
    },
}

/// An error answer, as the server gave it.
///
/// spindle answers every error as `{"error": {"code", "message", "field"}}`; an answer that is
/// not in that shape (a proxy's 502 page) keeps its start as `message`, with no `code`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The request's URL.
    pub url: String,
    /// The HTTP status (400, 401, 403, 404, 409, 413, 422, 429, 503, 504, ...).
    pub status: u16,
    /// spindle's error code (`invalid_json`, `invalid_field`, `too_large`, `unauthenticated`,
    /// `forbidden`, `rate_limited`, `not_found`, `conflict`, `unavailable`, `shutting_down`,
    /// `outcome_unknown`, `internal`), when the body had one.
    pub code: Option<String>,
    /// The server's explanation, as given (it names the field: `jobs[2].endpoint is not a
    /// valid URL`).
    pub message: String,
    /// The offending field (`jobs[2].endpoint`), when the server named one.
    pub field: Option<String>,
    /// When to try again, from a `Retry-After` header in seconds (429, 503).
    pub retry_after: Option<Duration>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} from {}: {}", self.status, self.url, self.message)?;
        match &self.field {
            Some(field) if !self.message.contains(field.as_str()) => {
                write!(f, " (field {field})")
            }
            _ => Ok(()),
        }
    }
}

impl std::error::Error for ApiError {}

/// The innermost cause of a transport error ("Connection refused (os error 111)"), which
/// reqwest's own message ("error sending request") leaves out.
fn root_cause(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

impl Error {
    /// The status of an error answer.
    pub fn status(&self) -> Option<u16> {
        self.api().map(|e| e.status)
    }

    /// The error answer, if the server gave one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(e) => Some(e),
            _ => None,
        }
    }

    /// Whether no connection could be made (so the request was never sent).
    pub fn is_connect(&self) -> bool {
        matches!(self, Error::Connect { .. })
    }

    /// Whether the answer did not come in time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// Whether spindle's contract guarantees that nothing of the request was stored: it was
    /// never sent (bad URL or token, no connection), or it was answered 4xx or 503 (a Director
    /// or router refuses a request whole; a 503 carries `Retry-After`). After any other error
    /// (timeout, broken transfer, 500, a 504 from a Director whose write did not finish within
    /// its write timeout, a proxy's 502 or 504, an answer not understood) the request may have
    /// been stored: send it again to the same place with the same ids or idempotency keys,
    /// which spindle makes safe.
    pub fn stored_nothing(&self) -> bool {
        match self {
            Error::InvalidUrl { .. } | Error::InvalidToken | Error::Build(_) => true,
            Error::Connect { .. } => true,
            Error::Api(e) => e.status < 500 || e.status == 503,
            Error::Timeout { .. } | Error::Transport { .. } | Error::Decode { .. } => false,
        }
    }

    /// The transport error of a request to `url`, classified.
    pub(crate) fn transport(url: &str, source: reqwest::Error) -> Error {
        let url = url.to_owned();
        if source.is_connect() {
            Error::Connect { url, source }
        } else if source.is_timeout() {
            Error::Timeout { url, source }
        } else {
            Error::Transport { url, source }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16) -> Error {
        Error::Api(Box::new(ApiError {
            url: "http://h/v1/jobs".into(),
            status,
            code: None,
            message: String::new(),
            field: None,
            retry_after: None,
        }))
    }

    #[test]
    fn a_503_stored_nothing_and_a_504_may_have_stored() {
        // A definite refusal: safe to send anywhere (a router tries the shard's next Director).
        for status in [400, 409, 413, 422, 429, 503] {
            assert!(answered(status).stored_nothing(), "{status}");
        }
        // An unknown outcome: send again with the same ids or keys (a router re-sends to the
        // same JobDB).
        for status in [500, 502, 504] {
            assert!(!answered(status).stored_nothing(), "{status}");
        }
    }
}
