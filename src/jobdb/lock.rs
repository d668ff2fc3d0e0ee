//! Exclusive ownership of a JobDB without Consul. MySQL: a `GET_LOCK` held on a dedicated
//! connection; the lock lives exactly as long as that connection, so a dead process frees it
//! at once, and a lost connection means the lock may already belong to someone else. SQLite:
//! an exclusive `flock` on `<file>.lock` beside the JobDB, held by an open file descriptor, so
//! it too ends with the process.

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use sqlx::mysql::MySqlConnection;
use sqlx::{ConnectOptions, Connection};

use super::{file_error, JobDbError, JobDbUrl, Server};

/// A held lock on one JobDB.
#[derive(Debug)]
pub enum ServerLock {
    /// A MySQL server-wide named lock on the JobDB's name.
    MySql {
        /// The connection holding it.
        conn: MySqlConnection,
        /// The lock's name.
        name: String,
    },
    /// An exclusive file lock beside a SQLite JobDB.
    File {
        /// The locked file, open.
        lock: Flock<File>,
        /// The JobDB's file, which must still exist for the lock to mean anything.
        jobdb: PathBuf,
    },
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
        match &url.server {
            Server::MySql(server) => {
                let mut conn = server.connect().await?;
                let name = lock_name(&url.database);
                let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(&name)
                    .fetch_one(&mut conn)
                    .await?;
                if got != Some(1) {
                    let _ = conn.close().await;
                    return Err(JobDbError::Held(url.database.clone()));
                }
                Ok(ServerLock::MySql { conn, name })
            }
            Server::Sqlite(dir) => {
                let jobdb = url
                    .sqlite_file()
                    .ok_or(JobDbError::Unsupported("a file lock"))?;
                tokio::fs::create_dir_all(dir)
                    .await
                    .map_err(file_error(dir))?;
                let path = dir.join(format!("{}.lock", url.database));
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(file_error(&path))?;
                let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
                    .map_err(|_| JobDbError::Held(url.database.clone()))?;
                Ok(ServerLock::File { lock, jobdb })
            }
        }
    }

    /// Confirms the lock is still ours; an error means it must be treated as lost.
    pub async fn check(&mut self, timeout: Duration) -> Result<(), JobDbError> {
        match self {
            ServerLock::MySql { conn, name } => {
                let query = sqlx::query_scalar::<_, Option<i64>>(
                    "SELECT IS_USED_LOCK(?) = CONNECTION_ID()",
                )
                .bind(&*name)
                .fetch_one(conn);
                match tokio::time::timeout(timeout, query).await {
                    Ok(Ok(Some(1))) => Ok(()),
                    Ok(Ok(_)) => Err(JobDbError::Held(name.clone())),
                    Ok(Err(e)) => Err(e.into()),
                    Err(_) => Err(JobDbError::Sql(sqlx::Error::PoolTimedOut)),
                }
            }
            // The descriptor holds the lock until dropped; a deleted JobDB file is a lost one.
            ServerLock::File { jobdb, .. } => match tokio::fs::metadata(&*jobdb).await {
                Ok(_) => Ok(()),
                Err(e) => Err(file_error(jobdb)(e)),
            },
        }
    }

    /// Releases the lock (and closes its connection).
    pub async fn release(self) -> Result<(), JobDbError> {
        match self {
            ServerLock::MySql { mut conn, name } => {
                sqlx::query("DO RELEASE_LOCK(?)")
                    .bind(&name)
                    .execute(&mut conn)
                    .await?;
                conn.close().await?;
            }
            ServerLock::File { lock, .. } => drop(lock),
        }
        Ok(())
    }
}
