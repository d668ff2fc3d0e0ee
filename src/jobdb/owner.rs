//! Ownership of a JobDB through its fencing token (`jobdb_owner`): taking it (bumping the
//! token, or setting it to an external lock's), reading it, and evicting a stalled or hung
//! previous owner (MySQL `KILL`; SQLite has nothing to kill). Every write transaction checks the
//! token as its last statement ([`super::write`]), so a new owner's token shuts out the old one.

use std::time::Duration;

use chrono::Utc;
use sqlx::{Connection, Row};

use super::{int, with_pool, JobDb, JobDbError};

/// How far above the JobDB's highest transition id a new owner starts numbering: a paused
/// predecessor's uncommitted rows can then never collide with the new owner's.
pub const OWNER_ID_GAP: u64 = 1 << 32;

impl JobDb {
    /// Takes ownership: bumps the fencing token and returns it. From now on every transaction
    /// of an earlier owner fails its fence check.
    pub async fn take_ownership(&self, holder: &str) -> Result<u64, JobDbError> {
        with_pool!(self, |p, q| {
            let mut tx = p.begin().await?;
            sqlx::query(
                "UPDATE jobdb_owner SET fencing_token = fencing_token + 1, holder = ?, \
                 acquired_at = ? WHERE id = 1",
            )
            .bind(holder)
            .bind(Utc::now().naive_utc())
            .execute(&mut *tx)
            .await?;
            let token: u64 =
                sqlx::query_scalar("SELECT fencing_token FROM jobdb_owner WHERE id = 1")
                    .fetch_one(&mut *tx)
                    .await?;
            tx.commit().await?;
            Ok(token)
        })
    }

    /// Takes ownership with a token from an external lock (a Consul lock key's ModifyIndex):
    /// succeeds only if it is higher than every token the JobDB has seen, so an older holder
    /// can never take it back; [`JobDbError::Fenced`] otherwise. Waits at most `wait` for a
    /// previous owner's transaction in its final round trip ([`JobDbError::Busy`] then).
    pub async fn take_ownership_at(
        &self,
        token: u64,
        holder: &str,
        wait: Duration,
    ) -> Result<u64, JobDbError> {
        const UPDATE: &str = "UPDATE jobdb_owner SET fencing_token = ?, holder = ?, \
                              acquired_at = ? WHERE id = 1 AND fencing_token < ?";
        const CURRENT: &str = "SELECT fencing_token FROM jobdb_owner WHERE id = 1";
        let (updated, current) = with_pool!(self, |_pool, q| {
            // A connection of its own, so the short lock wait does not leak into the pool.
            let mut conn = q::takeover_connection(&self.url, wait).await?;
            let mut tx = conn.begin().await?;
            let updated = match sqlx::query(UPDATE)
                .bind(int(token))
                .bind(holder)
                .bind(Utc::now().naive_utc())
                .bind(int(token))
                .execute(&mut *tx)
                .await
            {
                Ok(done) => done.rows_affected(),
                // A previous owner still holds the row.
                Err(sqlx::Error::Database(e)) if q::is_lock_wait(&*e) => {
                    return Err(JobDbError::Busy)
                }
                Err(e) => return Err(e.into()),
            };
            let current: u64 = sqlx::query_scalar(CURRENT).fetch_one(&mut *tx).await?;
            tx.commit().await?;
            conn.close().await?;
            (updated, current)
        });
        if updated == 1 {
            Ok(token)
        } else {
            Err(JobDbError::Fenced {
                ours: token,
                current,
            })
        }
    }

    /// The current fencing token and holder.
    pub async fn owner(&self) -> Result<(u64, String), JobDbError> {
        with_pool!(self, |p, q| {
            let row = sqlx::query("SELECT fencing_token, holder FROM jobdb_owner WHERE id = 1")
                .fetch_one(p)
                .await?;
            Ok((row.try_get("fencing_token")?, q::text(&row, "holder")?))
        })
    }

    /// Ends (`KILL`) the connections of other sessions that have a transaction open in this
    /// JobDB for longer than `older_than`: a stalled previous owner's. Needs the `PROCESS`
    /// and `CONNECTION ADMIN` (or `SUPER`) privileges. Returns how many were ended. SQLite:
    /// nothing to end (a stalled writer's lock is waited for by the busy timeout), 0.
    pub async fn kill_stalled_transactions(&self, older_than: Duration) -> Result<u64, JobDbError> {
        with_pool!(self, |p, q| q::kill_stalled_transactions(p, older_than)
            .await)
    }

    /// The MySQL connection id holding this JobDB's `GET_LOCK`, if any (for operators and
    /// fault tests); [`JobDbError::Unsupported`] on SQLite.
    pub async fn lock_connection(&self) -> Result<Option<u64>, JobDbError> {
        with_pool!(self, |p, q| q::lock_connection(p, &self.url.database).await)
    }

    /// Kills a MySQL connection (`KILL CONNECTION`): how an operator evicts a hung owner;
    /// [`JobDbError::Unsupported`] on SQLite.
    pub async fn kill_connection(&self, id: u64) -> Result<(), JobDbError> {
        with_pool!(self, |p, q| q::kill_connection(p, id).await)
    }
}
