//! Decoders from a row of either engine to spindle's types, written once as plain generic code
//! over [`Columns`]. A value a decoder reads is a [`Value`]: a type both engines decode, so the
//! two impls of [`Columns`] are the only engine code here. Each engine module re-exports these
//! (`q::job_from_row`), beside the statements it spells its own way.

use sqlx::mysql::{MySql, MySqlRow};
use sqlx::sqlite::{Sqlite, SqliteRow};
use sqlx::{Decode, Type};

use crate::jobdb::JobDbError;

/// A column type both engines decode (bytes, integers, floats, booleans, times, and
/// `Option`s of them).
pub trait Value:
    Sized + for<'r> Decode<'r, MySql> + Type<MySql> + for<'r> Decode<'r, Sqlite> + Type<Sqlite>
{
}

impl<T> Value for T where
    T: Sized + for<'r> Decode<'r, MySql> + Type<MySql> + for<'r> Decode<'r, Sqlite> + Type<Sqlite>
{
}

/// A row of either engine, as the decoders read it.
pub trait Columns {
    /// The named column's value.
    fn get<T: Value>(&self, column: &str) -> Result<T, sqlx::Error>;
}

impl Columns for MySqlRow {
    fn get<T: Value>(&self, column: &str) -> Result<T, sqlx::Error> {
        sqlx::Row::try_get(self, column)
    }
}

impl Columns for SqliteRow {
    fn get<T: Value>(&self, column: &str) -> Result<T, sqlx::Error> {
        sqlx::Row::try_get(self, column)
    }
}

/// A text column, whatever its collation (sqlx types MySQL's `_bin` collations as binary;
/// SQLite hands TEXT out as bytes too).
pub fn text(row: &impl Columns, column: &str) -> Result<String, JobDbError> {
    let bytes: Vec<u8> = row.get(column)?;
    String::from_utf8(bytes).map_err(|_| JobDbError::Corrupt(format!("{column} is not utf-8")))
}

/// A nullable text column.
pub fn text_opt(row: &impl Columns, column: &str) -> Result<Option<String>, JobDbError> {
    let bytes: Option<Vec<u8>> = row.get(column)?;
    bytes
        .map(|b| {
            String::from_utf8(b).map_err(|_| JobDbError::Corrupt(format!("{column} is not utf-8")))
        })
        .transpose()
}

/// The `state` column.
pub fn state_of(row: &impl Columns) -> Result<crate::job::State, JobDbError> {
    std::str::FromStr::from_str(&text(row, "state")?)
        .map_err(|e: crate::job::UnknownState| JobDbError::Corrupt(e.to_string()))
}

/// A 16-byte id column.
pub fn job_id_of(row: &impl Columns, column: &str) -> Result<crate::job::JobId, JobDbError> {
    let bytes: Vec<u8> = row.get(column)?;
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| JobDbError::Corrupt(format!("{column} is not 16 bytes")))?;
    Ok(crate::job::JobId::from_bytes(bytes))
}

/// A 16-byte ULID column (batch ids).
pub fn ulid_of(row: &impl Columns, column: &str) -> Result<ulid::Ulid, JobDbError> {
    job_id_of(row, column).map(|id| id.0)
}

/// A count column (`COUNT(*)`, a cast sum, a length) as a `u64`.
pub fn count_of(row: &impl Columns, column: &str) -> Result<u64, JobDbError> {
    let n: i64 = row.get(column)?;
    u64::try_from(n).map_err(|_| JobDbError::Corrupt(format!("{column} is negative: {n}")))
}

/// A UTC time column.
pub fn time_of(
    row: &impl Columns,
    column: &str,
) -> Result<chrono::DateTime<chrono::Utc>, JobDbError> {
    let t: chrono::NaiveDateTime = row.get(column)?;
    Ok(t.and_utc())
}

/// A nullable UTC time column.
pub fn time_opt(
    row: &impl Columns,
    column: &str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, JobDbError> {
    let t: Option<chrono::NaiveDateTime> = row.get(column)?;
    Ok(t.map(|t| t.and_utc()))
}

/// `state`, `attempts`, `retry_at` of a transition row.
pub fn progress_of(row: &impl Columns) -> Result<crate::job::Progress, JobDbError> {
    Ok(crate::job::Progress {
        state: state_of(row)?,
        attempts: row.get("attempts")?,
        retry_at: time_opt(row, "retry_at")?,
        started: None,
    })
}

/// An `open_work` row's progress: [`progress_of`] with where an attempt under way
/// began.
pub fn open_work_of(row: &impl Columns) -> Result<crate::job::Progress, JobDbError> {
    let attempts: u64 = row.get("attempts")?;
    Ok(crate::job::Progress {
        state: state_of(row)?,
        attempts: u16::try_from(attempts).unwrap_or(u16::MAX),
        retry_at: time_opt(row, "retry_at")?,
        started: started_of(row)?,
    })
}

/// `started_in`, `started_at`: where the attempt a row ends (or is under way) began.
pub fn started_of(row: &impl Columns) -> Result<Option<crate::job::AttemptStart>, JobDbError> {
    let commit: Option<u64> = row.get("started_in")?;
    let at = time_opt(row, "started_at")?;
    Ok(commit
        .zip(at)
        .map(|(commit, at)| crate::job::AttemptStart { commit, at }))
}

/// A `jobs` row.
pub fn job_from_row(row: &impl Columns) -> Result<crate::job::Job, JobDbError> {
    use std::time::Duration;
    use JobDbError;
    let id = job_id_of(row, "id")?;
    let headers = text(row, "headers")?;
    let headers: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&headers)
        .map_err(|e| JobDbError::Corrupt(format!("headers of {id}: {e}")))?;
    let headers = headers
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            other => Err(JobDbError::Corrupt(format!(
                "header {k} of {id} is {other}"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let payload: Vec<u8> = row.get("payload")?;
    let timeout: u32 = row.get("execution_timeout_ms")?;
    let min_delay: u32 = row.get("backoff_min_delay_ms")?;
    Ok(crate::job::Job {
        id,
        bucket: text(row, "bucket")?.into(),
        endpoint: text(row, "endpoint")?.into(),
        method: text(row, "method")?.into(),
        headers,
        payload: bytes::Bytes::from(payload),
        execution_timeout: Duration::from_millis(timeout.into()),
        retry: crate::job::RetryPolicy {
            min_delay: Duration::from_millis(min_delay.into()),
            coefficient: row.get("backoff_coefficient")?,
        },
        created_at: time_of(row, "created_at")?,
        expire_at: time_of(row, "expire_at")?,
        idempotency_key: text_opt(row, "idempotency_key")?,
        on_complete: text_opt(row, "on_complete")?.map(Into::into),
        ordering: match text_opt(row, "ordering_key")? {
            Some(key) => Some(crate::job::OrderedKey {
                key: key.into(),
                blocks: row.get("ordering_blocks")?,
                // Jobs of schema 8 have none: their id was their position.
                position: match row.get::<Option<Vec<u8>>>("ordering_position")? {
                    Some(_) => ulid_of(row, "ordering_position")?,
                    None => id.0,
                },
            }),
            None => None,
        },
        // An operator's SQL may have set one of the three without the others: the job
        // then delivers no event (it is sent as it is).
        event: match (
            row.get::<Option<Vec<u8>>>("event_id")?,
            text_opt(row, "event_type")?,
            row.get::<Option<Vec<u8>>>("subscription_id")?,
        ) {
            (Some(_), Some(event_type), Some(_)) => Some(crate::job::EventLink {
                event_id: ulid_of(row, "event_id")?,
                event_type: event_type.into(),
                subscription: ulid_of(row, "subscription_id")?,
            }),
            _ => None,
        },
        // An operator's SQL may have written one that is not trace context: the job
        // is then delivered in no trace (a bad state alone is dropped).
        trace: match text_opt(row, "traceparent")? {
            Some(parent) => {
                let state = text_opt(row, "tracestate")?;
                crate::telemetry::TraceContext::parse(&parent, state.as_deref())
                    .or_else(|_| crate::telemetry::TraceContext::parse(&parent, None))
                    .ok()
            }
            None => None,
        },
    })
}

/// A `job_state_transitions` row with its id.
pub fn transition_from_row(
    row: &impl Columns,
) -> Result<(u64, crate::job::Transition), JobDbError> {
    let error_response: Option<Vec<u8>> = row.get("error_response")?;
    // The bytes decide, not the tag: an operator's SQL may have written either.
    let encoding = error_response.as_deref().map(crate::job::stored_encoding);
    Ok((
        row.get("id")?,
        crate::job::Transition {
            job_id: job_id_of(row, "job_id")?,
            state: state_of(row)?,
            attempts: row.get("attempts")?,
            time: time_of(row, "time")?,
            retry_at: time_opt(row, "retry_at")?,
            error_type: text_opt(row, "error_type")?,
            error_response: error_response.map(bytes::Bytes::from),
            error_response_encoding: encoding,
            response_status: row.get("response_status")?,
            duration_ms: row.get("duration_ms")?,
            started: started_of(row)?,
        },
    ))
}

/// An `operator_commands` row.
pub fn command_from_row(row: &impl Columns) -> Result<crate::jobdb::commands::Command, JobDbError> {
    let job_id: Option<Vec<u8>> = row.get("job_id")?;
    let job_id = match job_id {
        Some(_) => Some(job_id_of(row, "job_id")?),
        None => None,
    };
    Ok(crate::jobdb::commands::Command {
        id: row.get("id")?,
        issued_by: text(row, "issued_by")?,
        action: text(row, "action")?.parse()?,
        bucket: text_opt(row, "bucket")?,
        endpoint_prefix: text_opt(row, "endpoint_prefix")?,
        job_id,
        created_before: time_opt(row, "created_before")?,
        idempotency_key_prefix: text_opt(row, "idempotency_key_prefix")?,
        postpone_until: time_opt(row, "postpone_until")?,
        reason: text_opt(row, "reason")?,
    })
}
