//! Exclusive ownership of a JobDB without Consul: a MySQL `GET_LOCK` held on a dedicated
//! connection. The lock lives exactly as long as that connection, so a dead process frees it
//! at once, and a lost connection means the lock may already belong to someone else.

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{ConnectOptions, Connection};

use super::{JobDbError, JobDbUrl};

/// A held server-wide lock on one JobDB's name.
#[derive(Debug)]
pub struct ServerLock {
    conn: MySqlConnection,
    name: String,
}

/// The lock name for a database: server-wide, at most 64 characters.
pub(crate) fn lock_name(database: &str) -> String {
    let mut name = format!("spindle.jobdb.{database}");
    name.truncate(64);
    name
}

impl ServerLock {
    /// Takes the lock without waiting; [`JobDbError::Held`] if another session holds it.
    pub async fn try_acquire(url: &JobDbUrl) -> Result<Self, JobDbError> {
        let mut conn = url.server.connect().await?;
        let name = lock_name(&url.database);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await?;
        if got != Some(1) {
            let _ = conn.close().await;
            return Err(JobDbError::Held(url.database.clone()));
        }
        Ok(ServerLock { conn, name })
    }

    /// Confirms the lock is still ours; an error means it must be treated as lost.
    pub async fn check(&mut self, timeout: Duration) -> Result<(), JobDbError> {
        let query =
            sqlx::query_scalar::<_, Option<i64>>("SELECT IS_USED_LOCK(?) = CONNECTION_ID()")
                .bind(&self.name)
                .fetch_one(&mut self.conn);
        match tokio::time::timeout(timeout, query).await {
            Ok(Ok(Some(1))) => Ok(()),
            Ok(Ok(_)) => Err(JobDbError::Held(self.name.clone())),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(JobDbError::Sql(sqlx::Error::PoolTimedOut)),
        }
    }

    /// Releases the lock and closes its connection.
    pub async fn release(mut self) -> Result<(), JobDbError> {
        sqlx::query("DO RELEASE_LOCK(?)")
            .bind(&self.name)
            .execute(&mut self.conn)
            .await?;
        self.conn.close().await?;
        Ok(())
    }
}
