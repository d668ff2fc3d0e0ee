//! Where a JobDB lives: [`JobDbUrl`] (a server and a database name) parsed from
//! `mysql://user[:pass]@host[:port]/database` or `sqlite:///dir/database`, and [`Server`], the
//! MySQL server or the directory of SQLite files. Neither prints a MySQL password: `Debug`
//! shows the server as `mysql://user@host:port`.
//!
//! Each engine's connection settings are built in its module (`engine::mysql`,
//! `engine::sqlite`) from what this module parses and names.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::ConnectOptions;

use super::JobDbError;

/// The file name suffix of a SQLite JobDB.
pub const SQLITE_SUFFIX: &str = ".sqlite3";

/// The file of JobDB `database` in `dir`.
pub(crate) fn file_in(dir: &Path, database: &str) -> PathBuf {
    dir.join(format!("{database}{SQLITE_SUFFIX}"))
}

/// The options of a server (no database) from its URL, logging every statement at trace level
/// and slow ones (2 s) as warnings.
pub(crate) fn server_options(url: &str) -> Result<MySqlConnectOptions, JobDbError> {
    Ok(MySqlConnectOptions::from_str(url)
        .map_err(|e| JobDbError::InvalidUrl(e.to_string()))?
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2)))
}

/// The server a JobDB lives on: a MySQL server, or a directory of SQLite files. Its `Debug`
/// never shows the MySQL password.
#[derive(Clone)]
pub enum Server {
    /// A MySQL (MariaDB) server, without a database.
    MySql(Box<MySqlConnectOptions>),
    /// A directory holding one `<database>.sqlite3` file per JobDB.
    Sqlite(PathBuf),
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Server::MySql(options) => write!(
                f,
                "MySql(mysql://{}@{}:{})",
                options.get_username(),
                options.get_host(),
                options.get_port()
            ),
            Server::Sqlite(dir) => f.debug_tuple("Sqlite").field(dir).finish(),
        }
    }
}

/// Where a JobDB lives, parsed from its URL: `mysql://user[:pass]@host[:port]/database`, or
/// `sqlite:///abs/dir/database` / `sqlite://rel/dir/database` for the file
/// `dir/database.sqlite3`.
#[derive(Clone, Debug)]
pub struct JobDbUrl {
    /// The server (or directory).
    pub server: Server,
    /// The database name (validated: `[A-Za-z0-9_]{1,48}`).
    pub database: String,
}

impl FromStr for JobDbUrl {
    type Err = JobDbError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s
            .strip_prefix("sqlite://")
            .or_else(|| s.strip_prefix("sqlite:"))
        {
            if path.ends_with('/') {
                return Err(JobDbError::InvalidUrl(
                    "a sqlite url ends with the database name: sqlite:///dir/name".into(),
                ));
            }
            let path = PathBuf::from(path);
            let database = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            check_database_name(&database)?;
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
                _ => PathBuf::from("."),
            };
            return Ok(JobDbUrl {
                server: Server::Sqlite(dir),
                database,
            });
        }
        let mut url = url::Url::parse(s).map_err(|e| JobDbError::InvalidUrl(e.to_string()))?;
        if url.scheme() != "mysql" && url.scheme() != "mariadb" {
            return Err(JobDbError::InvalidUrl(
                "scheme must be mysql:// or sqlite://".into(),
            ));
        }
        let _ = url.set_scheme("mysql");
        let database = url.path().trim_start_matches('/').to_owned();
        check_database_name(&database)?;
        url.set_path("");
        Ok(JobDbUrl {
            server: Server::MySql(Box::new(server_options(url.as_str())?)),
            database,
        })
    }
}

impl JobDbUrl {
    /// The same server with another database name (validated).
    pub fn with_database(&self, database: &str) -> Result<JobDbUrl, JobDbError> {
        check_database_name(database)?;
        Ok(JobDbUrl {
            server: self.server.clone(),
            database: database.to_owned(),
        })
    }

    /// Whether this JobDB is a SQLite file.
    pub fn is_sqlite(&self) -> bool {
        matches!(self.server, Server::Sqlite(_))
    }

    /// Connection options for a MySQL JobDB's database; [`JobDbError::Unsupported`] for SQLite.
    pub fn mysql_options(&self) -> Result<MySqlConnectOptions, JobDbError> {
        match &self.server {
            Server::MySql(server) => Ok((**server).clone().database(&self.database)),
            Server::Sqlite(_) => Err(JobDbError::Unsupported("a MySQL connection")),
        }
    }

    /// The file of a SQLite JobDB (`None` for MySQL).
    pub fn sqlite_file(&self) -> Option<PathBuf> {
        match &self.server {
            Server::Sqlite(dir) => Some(file_in(dir, &self.database)),
            Server::MySql(_) => None,
        }
    }

    /// The URL of a database named `name` on a server given by its URL without a database
    /// (`mysql://user@host:3306`, or a directory `sqlite:///var/lib/spindle`).
    pub fn on_server(server: &str, name: &str) -> Result<(String, JobDbUrl), JobDbError> {
        let text = if server.starts_with("sqlite:") {
            format!("{}/{name}", server.trim_end_matches('/'))
        } else {
            let mut url =
                url::Url::parse(server).map_err(|e| JobDbError::InvalidUrl(e.to_string()))?;
            url.set_path(&format!("/{name}"));
            url.to_string()
        };
        let parsed = text.parse()?;
        Ok((text, parsed))
    }
}

/// Whether a database name is one spindle accepts (and may splice into a statement).
fn valid_database_name(name: &str) -> bool {
    (1..=48).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// [`valid_database_name`], as an error naming the rule.
fn check_database_name(name: &str) -> Result<(), JobDbError> {
    if valid_database_name(name) {
        Ok(())
    } else {
        Err(JobDbError::InvalidUrl(format!(
            "database name {name:?} must be 1 to 48 of [A-Za-z0-9_]"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_validated() {
        let url: JobDbUrl = "mysql://root@127.0.0.1:3306/spindle_x1".parse().unwrap();
        assert_eq!(url.database, "spindle_x1");
        assert!("mysql://root@127.0.0.1:3306/".parse::<JobDbUrl>().is_err());
        assert!("mysql://root@127.0.0.1:3306/a;drop"
            .parse::<JobDbUrl>()
            .is_err());
        assert!("postgres://root@127.0.0.1/x".parse::<JobDbUrl>().is_err());
        assert!(url.with_database("a`b").is_err());
        assert_eq!(url.with_database("other").unwrap().database, "other");
        assert!(!url.is_sqlite());

        let abs: JobDbUrl = "sqlite:///var/lib/spindle/jobdb_01".parse().unwrap();
        assert_eq!(abs.database, "jobdb_01");
        assert_eq!(
            abs.sqlite_file().unwrap(),
            PathBuf::from("/var/lib/spindle/jobdb_01.sqlite3")
        );
        let rel: JobDbUrl = "sqlite://data/j1".parse().unwrap();
        assert_eq!(rel.sqlite_file().unwrap(), PathBuf::from("data/j1.sqlite3"));
        let bare: JobDbUrl = "sqlite:j2".parse().unwrap();
        assert_eq!(bare.sqlite_file().unwrap(), PathBuf::from("./j2.sqlite3"));
        assert!("sqlite:///tmp/a;b".parse::<JobDbUrl>().is_err());
        assert!("sqlite:///tmp/".parse::<JobDbUrl>().is_err());
        assert!(abs.mysql_options().is_err());
        let (text, on) = JobDbUrl::on_server("sqlite:///data/", "jobdb_02").unwrap();
        assert_eq!(text, "sqlite:///data/jobdb_02");
        assert_eq!(
            on.sqlite_file().unwrap(),
            PathBuf::from("/data/jobdb_02.sqlite3")
        );
    }

    #[test]
    fn debug_never_shows_the_password() {
        let url: JobDbUrl = "mysql://root:hunter2@127.0.0.1:3306/spindle_x1"
            .parse()
            .unwrap();
        let shown = format!("{url:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("mysql://root@127.0.0.1:3306"), "{shown}");
    }
}
