//! Exclusive ownership of a JobDB without Consul. MySQL: a `GET_LOCK` held on a dedicated
//! connection; the lock lives exactly as long as that connection, so a dead process frees it
//! at once, and a lost connection means the lock may already belong to someone else. SQLite:
//! an exclusive `flock` on `<file>.lock` beside the JobDB, held by an open file descriptor, so
//! it too ends with the process. Each engine's lock is in its module
//! ([`mysql::NamedLock`], [`sqlite::FileLock`]); [`ServerLock`] is either.

use std::time::Duration;

use super::engine::{mysql, sqlite};
use super::{JobDbError, JobDbUrl, Server};

/// A held lock on one JobDB.
#[derive(Debug)]
pub enum ServerLock {
    /// A MySQL server-wide named lock on the JobDB's name.
    MySql(mysql::NamedLock),
    /// An exclusive file lock beside a SQLite JobDB.
    File(sqlite::FileLock),
}

impl ServerLock {
    /// Takes the lock without waiting; [`JobDbError::Held`] if another session holds it.
    pub async fn try_acquire(url: &JobDbUrl) -> Result<Self, JobDbError> {
        match &url.server {
            Server::MySql(server) => mysql::NamedLock::try_acquire(server, &url.database)
                .await
                .map(ServerLock::MySql),
            Server::Sqlite(dir) => sqlite::FileLock::try_acquire(url, dir)
                .await
                .map(ServerLock::File),
        }
    }

    /// Confirms the lock is still ours; an error means it must be treated as lost.
    pub async fn check(&mut self, timeout: Duration) -> Result<(), JobDbError> {
        match self {
            ServerLock::MySql(lock) => lock.check(timeout).await,
            ServerLock::File(lock) => lock.check().await,
        }
    }

    /// Releases the lock (and closes its connection).
    pub async fn release(self) -> Result<(), JobDbError> {
        match self {
            ServerLock::MySql(lock) => lock.release().await,
            ServerLock::File(lock) => {
                lock.release();
                Ok(())
            }
        }
    }
}
