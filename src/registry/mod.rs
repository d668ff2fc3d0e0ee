//! Coordination: who owns which JobDB, and where the Directors are.
//!
//! - [`consul`]: a thin typed client for the Consul HTTP API (production).
//! - [`lease`]: exclusive ownership of one JobDB as a [`lease::Lease`]: a fencing token plus a
//!   signal that fires the moment ownership is lost or may be lost. Two ways to get one: a
//!   Consul session lock ([`lease::consul_lock`]) or, for single-site setups without Consul,
//!   MySQL `GET_LOCK` ([`lease::server_lock`]).
//! - [`inventory`]: the JobDB inventory in Consul KV (connection info and lifecycle state).
//! - [`controls`] and [`parks`]: operators' controls (pauses, caps) and parked endpoints,
//!   watched by every Director.
//! - [`catalog`]: registering a Director in the Consul catalog with a TTL health check.

pub mod catalog;
pub mod consul;
pub mod controls;
pub mod inventory;
pub mod lease;
pub mod parks;

/// Errors of the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Consul could not be reached, or did not answer in time.
    #[error("consul unreachable")]
    Transport(#[source] reqwest::Error),
    /// Consul answered with an error status.
    #[error("consul answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// Start of the answer.
        body: String,
    },
    /// The session no longer exists: every lock it held is lost.
    #[error("consul session {0} is gone")]
    SessionGone(String),
    /// An answer could not be decoded.
    #[error("unexpected consul answer: {0}")]
    Decode(String),
    /// Bad configuration (address, names).
    #[error("{0}")]
    Config(String),
    /// The JobDB side of an ownership change failed.
    #[error(transparent)]
    JobDb(#[from] crate::jobdb::JobDbError),
}
