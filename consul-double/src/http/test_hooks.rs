//! `/_test/...` endpoints: the fault hooks, session expiry and the virtual clock over HTTP,
//! so the standalone binary can be scripted. They bypass the `/v1` fault middleware.
//! PUT and POST are both accepted.
//!
//! | Path | Effect |
//! |---|---|
//! | `/_test/faults/renew_fails?on=true\|false` | [`Faults::set_renew_fails`](crate::Faults::set_renew_fails) |
//! | `/_test/faults/error_500?on=true\|false` | [`Faults::set_error_500`](crate::Faults::set_error_500) |
//! | `/_test/faults/latency?ms=N` | [`Faults::set_latency`](crate::Faults::set_latency) |
//! | `/_test/faults/stall?ms=N` | [`Faults::stall`](crate::Faults::stall) |
//! | `/_test/faults/index_backwards_once` | [`Faults::index_backwards_once`](crate::Faults::index_backwards_once) |
//! | `/_test/faults/drop_blocking_queries` | [`Faults::drop_blocking_queries`](crate::Faults::drop_blocking_queries) |
//! | `/_test/faults/clear` | [`Faults::clear`](crate::Faults::clear) |
//! | `/_test/sessions/expire/{id}` | invalidate now; body `true`/`false` (existed) |
//! | `/_test/time/freeze`, `/_test/time/resume`, `/_test/time/advance?ms=N` | virtual clock |
//! | `GET /_test/parked` | number of blocking queries parked now |

use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, on, MethodFilter};
use axum::Router;

use super::{json, AppState, Params};
use crate::error::ApiError;

/// The `/_test` routes.
pub(crate) fn router() -> Router<AppState> {
    let m = MethodFilter::PUT.or(MethodFilter::POST);
    Router::new()
        .route("/_test/faults/renew_fails", on(m, renew_fails))
        .route("/_test/faults/error_500", on(m, error_500))
        .route("/_test/faults/latency", on(m, latency))
        .route("/_test/faults/stall", on(m, stall))
        .route("/_test/faults/index_backwards_once", on(m, index_backwards))
        .route("/_test/faults/drop_blocking_queries", on(m, drop_blocking))
        .route("/_test/faults/clear", on(m, clear))
        .route("/_test/sessions/expire/{id}", on(m, expire_session))
        .route("/_test/time/freeze", on(m, freeze))
        .route("/_test/time/resume", on(m, resume))
        .route("/_test/time/advance", on(m, advance))
        .route("/_test/parked", get(parked))
}

async fn parked(State(s): State<AppState>) -> Response {
    json(&s.parked.load(std::sync::atomic::Ordering::SeqCst))
}

/// `?on=` (absent means true).
fn on_flag(p: &Params) -> Result<bool, ApiError> {
    if p.has("on") {
        p.bool("on")
    } else {
        Ok(true)
    }
}

fn millis(p: &Params) -> Result<Duration, ApiError> {
    p.u64("ms", "ms")?
        .map(Duration::from_millis)
        .ok_or_else(|| ApiError::BadRequest("missing ?ms=".into()))
}

async fn renew_fails(State(s): State<AppState>, p: Params) -> Result<Response, ApiError> {
    s.faults.set_renew_fails(on_flag(&p)?);
    Ok(().into_response())
}

async fn error_500(State(s): State<AppState>, p: Params) -> Result<Response, ApiError> {
    s.faults.set_error_500(on_flag(&p)?);
    Ok(().into_response())
}

async fn latency(State(s): State<AppState>, p: Params) -> Result<Response, ApiError> {
    s.faults.set_latency(millis(&p)?);
    Ok(().into_response())
}

async fn stall(State(s): State<AppState>, p: Params) -> Result<Response, ApiError> {
    s.faults.stall(millis(&p)?);
    Ok(().into_response())
}

async fn index_backwards(State(s): State<AppState>) -> Response {
    s.faults.index_backwards_once();
    ().into_response()
}

async fn drop_blocking(State(s): State<AppState>) -> Response {
    s.faults.drop_blocking_queries();
    ().into_response()
}

async fn clear(State(s): State<AppState>) -> Response {
    s.faults.clear();
    ().into_response()
}

async fn expire_session(State(s): State<AppState>, Path(id): Path<String>) -> Response {
    json(&s.store.write(|st| st.session_invalidate(&id)))
}

async fn freeze(State(s): State<AppState>) -> Response {
    s.store.write(|st| st.clock.freeze());
    ().into_response()
}

async fn resume(State(s): State<AppState>) -> Response {
    s.store.write(|st| st.clock.resume());
    ().into_response()
}

async fn advance(State(s): State<AppState>, p: Params) -> Result<Response, ApiError> {
    let d = millis(&p)?;
    s.store.write(|st| {
        st.clock.advance(d);
        st.expire_due();
    });
    Ok(().into_response())
}
