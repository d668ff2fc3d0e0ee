//! `/v1/kv/:key` handlers: GET (plain, `?recurse`, `?keys[&separator=]`, `?raw`, blocking),
//! PUT (plain, `?cas`, `?acquire`, `?release`, `?flags`, size limit) and DELETE (plain,
//! `?recurse`, `?cas`).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use serde::Serialize;

use super::{
    json, json_with_index, meta_headers, not_found_with_index, respond_blocking, AppState,
    BlockOpts, Params,
};
use crate::error::ApiError;
use crate::server::ConnHandle;
use crate::store::kv::{DeleteMode, PutMode};
use crate::store::KvEntry;

/// One KV entry as Consul renders it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct EntryJson<'a> {
    lock_index: u64,
    key: &'a str,
    flags: u64,
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    create_index: u64,
    modify_index: u64,
}

impl<'a> From<&'a KvEntry> for EntryJson<'a> {
    fn from(e: &'a KvEntry) -> Self {
        EntryJson {
            lock_index: e.lock_index,
            key: &e.key,
            flags: e.flags,
            value: e
                .value
                .as_ref()
                .map(|v| base64::engine::general_purpose::STANDARD.encode(v)),
            session: e.session.as_deref(),
            create_index: e.create_index,
            modify_index: e.modify_index,
        }
    }
}

/// Rejects key names that real Consul versions refuse (or that break on some of them).
fn validate_key(key: &str) -> Result<(), ApiError> {
    if key.starts_with('/') {
        return Err(ApiError::BadRequest(
            "Invalid key name: keys must not begin with '/'".into(),
        ));
    }
    if key.split('/').any(|seg| seg == "..") {
        return Err(ApiError::BadRequest(
            "Invalid key name: path traversal is not allowed".into(),
        ));
    }
    if key != key.trim() {
        return Err(ApiError::BadRequest(
            "Invalid key name: leading or trailing spaces".into(),
        ));
    }
    Ok(())
}

/// `GET /v1/kv/` (empty key).
pub(crate) async fn get_root(
    State(shared): State<AppState>,
    params: Params,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Response, ApiError> {
    get(shared, String::new(), params, conn.map(|c| c.0)).await
}

/// `GET /v1/kv/:key`.
pub(crate) async fn get_key(
    State(shared): State<AppState>,
    Path(key): Path<String>,
    params: Params,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Response, ApiError> {
    get(shared, key, params, conn.map(|c| c.0)).await
}

async fn get(
    shared: AppState,
    key: String,
    params: Params,
    conn: Option<ConnHandle>,
) -> Result<Response, ApiError> {
    validate_key(&key)?;
    let opts = BlockOpts::from_params(&params)?;
    if params.has("keys") {
        let sep = params
            .get("separator")
            .or_else(|| params.get("seperator"))
            .unwrap_or("")
            .to_string();
        let prefix = key.clone();
        return Ok(respond_blocking(
            &shared,
            &opts,
            conn,
            move |st| st.kv_keys(&key, &sep),
            move |idx, keys| {
                if keys.is_empty() && !prefix.is_empty() {
                    not_found_with_index(idx)
                } else {
                    json_with_index(idx, &keys)
                }
            },
        )
        .await);
    }
    if params.has("recurse") {
        return Ok(respond_blocking(
            &shared,
            &opts,
            conn,
            move |st| st.kv_list(&key),
            |idx, entries| {
                if entries.is_empty() {
                    not_found_with_index(idx)
                } else {
                    let body: Vec<EntryJson<'_>> = entries.iter().map(EntryJson::from).collect();
                    json_with_index(idx, &body)
                }
            },
        )
        .await);
    }
    if key.is_empty() {
        return Err(ApiError::BadRequest("Missing key name".into()));
    }
    let raw = params.has("raw");
    Ok(respond_blocking(
        &shared,
        &opts,
        conn,
        move |st| st.kv_get(&key),
        move |idx, entry| match entry {
            None => not_found_with_index(idx),
            Some(e) if raw => raw_response(idx, e.value.unwrap_or_default()),
            Some(e) => json_with_index(idx, &[EntryJson::from(&e)]),
        },
    )
    .await)
}

/// `?raw`: the stored bytes with the headers Consul adds since CVE-2020-25864.
fn raw_response(idx: u64, bytes: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        meta_headers(idx),
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/plain")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                HeaderName::from_static("content-security-policy"),
                HeaderValue::from_static("sandbox"),
            ),
        ],
        bytes,
    )
        .into_response()
}

/// `PUT /v1/kv/` (empty key): always 400 `Missing key name`.
pub(crate) async fn put_root() -> ApiError {
    ApiError::BadRequest("Missing key name".into())
}

/// `PUT /v1/kv/:key`.
pub(crate) async fn put_key(
    State(shared): State<AppState>,
    Path(key): Path<String>,
    params: Params,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    validate_key(&key)?;
    if key.is_empty() {
        return Err(ApiError::BadRequest("Missing key name".into()));
    }
    if let Some(delay) = shared.faults.kv_write_delay(&key) {
        tokio::time::sleep(delay).await;
    }
    let present: Vec<&str> = ["cas", "acquire", "release"]
        .into_iter()
        .filter(|f| params.has(f))
        .collect();
    if present.len() > 1 {
        return Err(ApiError::BadRequest(format!(
            "Conflicting flags: {}",
            present.join(", ")
        )));
    }
    let flags = params.u64("flags", "flags")?.unwrap_or(0);
    let mode = if let Some(cas) = params.u64("cas", "cas index")? {
        PutMode::Cas(cas)
    } else if let Some(s) = params.get("acquire") {
        if s.is_empty() {
            return Err(ApiError::Internal("missing session".into()));
        }
        PutMode::Acquire(s.to_string())
    } else if let Some(s) = params.get("release") {
        PutMode::Release(s.to_string())
    } else {
        PutMode::Plain
    };
    let max = shared.store.read(|st| st.config.kv_max_value_size);
    let value = read_limited(&headers, body, max).await?;
    let value = if value.is_empty() { None } else { Some(value) };
    let ok = shared
        .store
        .write(|st| st.kv_put(&key, value, flags, mode))?;
    Ok(json(&ok))
}

/// Reads a body of at most `max` bytes; larger → 413 as Consul answers.
async fn read_limited(headers: &HeaderMap, body: Body, max: usize) -> Result<Vec<u8>, ApiError> {
    let too_large = |n: Option<u64>| {
        let size = n.map_or_else(|| "more than max".to_string(), |n| n.to_string());
        ApiError::TooLarge(format!(
            "Request body({size} bytes) too large, max size: {max} bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size."
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared {
        if n > max as u64 {
            return Err(too_large(Some(n)));
        }
    }
    match axum::body::to_bytes(body, max).await {
        Ok(b) => Ok(b.to_vec()),
        Err(_) => Err(too_large(declared)),
    }
}

/// `DELETE /v1/kv/` (empty key; only meaningful with `?recurse`).
pub(crate) async fn delete_root(
    State(shared): State<AppState>,
    params: Params,
) -> Result<Response, ApiError> {
    delete(shared, String::new(), params).await
}

/// `DELETE /v1/kv/:key`.
pub(crate) async fn delete_key(
    State(shared): State<AppState>,
    Path(key): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    delete(shared, key, params).await
}

async fn delete(shared: AppState, key: String, params: Params) -> Result<Response, ApiError> {
    validate_key(&key)?;
    let recurse = params.has("recurse");
    if recurse && params.has("cas") {
        return Err(ApiError::BadRequest(
            "Conflicting flags: recurse, cas".into(),
        ));
    }
    if !recurse && key.is_empty() {
        return Err(ApiError::BadRequest("Missing key name".into()));
    }
    let mode = if recurse {
        DeleteMode::Recurse
    } else if let Some(cas) = params.u64("cas", "cas index")? {
        DeleteMode::Cas(cas)
    } else {
        DeleteMode::Plain
    };
    let ok = shared.store.write(|st| st.kv_delete(&key, mode));
    Ok(json(&ok))
}
