//! A thin typed client for the dozen Consul HTTP endpoints spindle relies on (see
//! `docs/decisions.md` for why not `consulrs` or `rs-consul`): sessions, KV with
//! check-and-set, acquire/release and blocking reads, agent services with TTL checks, and
//! healthy-instance listing. Non-2xx answers become typed errors; headers are kept.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::RegistryError;
use crate::secret::Secret;

/// The answer of a read, with the index to block on next (`X-Consul-Index`).
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned<T> {
    /// What was read.
    pub value: T,
    /// The resource's index at the time of the read (at least 1).
    pub index: u64,
}

/// How a read is made.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    /// Block until the resource's index exceeds this (0: answer at once).
    pub index: u64,
    /// Longest wait of a blocking read.
    pub wait: Option<Duration>,
    /// Ask the leader to confirm with a quorum (`?consistent`).
    pub consistent: bool,
}

/// A KV entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEntry {
    /// Full key.
    pub key: String,
    /// Stored bytes (empty when Consul holds `null`).
    pub value: Vec<u8>,
    /// Client-chosen flags.
    pub flags: u64,
    /// Index of creation.
    pub create_index: u64,
    /// Index of the last change: the check-and-set token, and spindle's fencing token for locks.
    pub modify_index: u64,
    /// Successful acquisitions so far.
    pub lock_index: u64,
    /// The holding session, if locked.
    pub session: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawKv {
    key: String,
    value: Option<String>,
    #[serde(default)]
    flags: u64,
    #[serde(default)]
    create_index: u64,
    #[serde(default)]
    modify_index: u64,
    #[serde(default)]
    lock_index: u64,
    #[serde(default)]
    session: Option<String>,
}

impl RawKv {
    fn decode(self) -> Result<KvEntry, RegistryError> {
        let value = match self.value {
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| RegistryError::Decode(format!("value of {}: {e}", self.key)))?,
            None => Vec::new(),
        };
        Ok(KvEntry {
            key: self.key,
            value,
            flags: self.flags,
            create_index: self.create_index,
            modify_index: self.modify_index,
            lock_index: self.lock_index,
            session: self.session.filter(|s| !s.is_empty()),
        })
    }
}

/// How a KV write is made.
#[derive(Clone, Debug)]
pub enum Put<'a> {
    /// Unconditional write (locks are advisory: this ignores them).
    Set,
    /// Write only if the key's ModifyIndex is this (0: only if absent).
    Cas(u64),
    /// Take the key's lock for this session.
    Acquire(&'a str),
    /// Give the key's lock back (must be the holder).
    Release(&'a str),
}

/// What happens to keys a session holds when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Behavior {
    /// Keys keep their value; only the lock is released. spindle's choice: lock keys are
    /// never deleted, so their ModifyIndex keeps rising and can serve as a fencing token.
    Release,
    /// Keys are deleted.
    Delete,
}

/// A session to create.
#[derive(Clone, Debug)]
pub struct SessionSpec {
    /// Free text shown in Consul.
    pub name: String,
    /// Renew at least this often (Consul invalidates after up to 2× this).
    pub ttl: Duration,
    /// After invalidation, nobody may acquire the session's keys for this long.
    pub lock_delay: Duration,
    /// What happens to held keys.
    pub behavior: Behavior,
}

/// A service instance to register with the local agent.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceRegistration {
    /// Unique per agent.
    #[serde(rename = "ID")]
    pub id: String,
    /// Service name (`spindle-director`).
    pub name: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Address clients should call.
    pub address: String,
    /// Port clients should call.
    pub port: u16,
    /// Metadata (e.g. the JobDB it owns).
    pub meta: HashMap<String, String>,
    /// The TTL health check the instance keeps passing.
    pub check: TtlCheck,
}

/// A TTL health check.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TtlCheck {
    /// Check id (pass it to [`ConsulClient::check_pass`]).
    #[serde(rename = "CheckID")]
    pub check_id: String,
    /// Display name.
    pub name: String,
    /// The check goes critical unless passed within this (Consul duration text, e.g. "10s").
    #[serde(rename = "TTL")]
    pub ttl: String,
    /// Initial status.
    pub status: String,
    /// Deregister after being critical this long (Consul's minimum is 1m).
    pub deregister_critical_service_after: String,
}

/// A healthy service instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInstance {
    /// Instance id.
    pub id: String,
    /// Address (the node's, when the service gave none).
    pub address: String,
    /// Port.
    pub port: u16,
    /// Metadata.
    pub meta: HashMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawHealth {
    node: RawNode,
    service: RawService,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawNode {
    #[serde(default)]
    address: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawService {
    #[serde(rename = "ID")]
    id: String,
    #[serde(default)]
    address: String,
    #[serde(default)]
    port: u16,
    #[serde(default)]
    meta: Option<HashMap<String, String>>,
}

/// A Consul HTTP API client.
#[derive(Clone, Debug)]
pub struct ConsulClient {
    http: reqwest::Client,
    base: String,
    token: Option<Secret>,
    /// Password of the JobDBs the inventory names (it stores URLs without one).
    jobdb_password: Option<Secret>,
}

impl ConsulClient {
    /// A client for the agent at `addr` (`http://127.0.0.1:8500`; a bare `host:port` is taken
    /// as http, like `CONSUL_HTTP_ADDR`), with an optional ACL token.
    pub fn new(addr: &str, token: Option<Secret>) -> Result<Self, RegistryError> {
        let base = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        let base = base.trim_end_matches('/').to_owned();
        url::Url::parse(&base)
            .map_err(|e| RegistryError::Config(format!("consul address {addr}: {e}")))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(RegistryError::Transport)?;
        Ok(ConsulClient {
            http,
            base,
            token,
            jobdb_password: None,
        })
    }

    /// The same client, filling `password` into the URLs of JobDBs read from the inventory
    /// (see [`super::inventory`]): the credentials to reach what the registry names travel
    /// with the client that reads it, never through Consul.
    pub fn with_jobdb_password(mut self, password: Option<Secret>) -> Self {
        self.jobdb_password = password;
        self
    }

    /// The password filled into inventory URLs that have none.
    pub fn jobdb_password(&self) -> Option<&Secret> {
        self.jobdb_password.as_ref()
    }

    /// The agent address.
    pub fn address(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str, timeout: Duration) -> reqwest::RequestBuilder {
        let mut builder = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(timeout);
        if let Some(token) = &self.token {
            builder = builder.header("X-Consul-Token", token.expose());
        }
        builder
    }

    /// Sends, and turns a non-2xx answer (other than those `allow` names) into an error.
    async fn send(
        &self,
        builder: reqwest::RequestBuilder,
        allow: &[StatusCode],
    ) -> Result<reqwest::Response, RegistryError> {
        let response = builder.send().await.map_err(RegistryError::Transport)?;
        let status = response.status();
        if status.is_success() || allow.contains(&status) {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        Err(RegistryError::Status {
            status: status.as_u16(),
            body: body.chars().take(256).collect(),
        })
    }

    async fn json<T: serde::de::DeserializeOwned>(
        response: reqwest::Response,
    ) -> Result<T, RegistryError> {
        let bytes = response.bytes().await.map_err(RegistryError::Transport)?;
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::Decode(e.to_string()))
    }

    fn index_of(response: &reqwest::Response) -> u64 {
        response
            .headers()
            .get("x-consul-index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            .max(1)
    }

    fn read_query(opts: ReadOptions) -> (Vec<(&'static str, String)>, Duration) {
        let mut query = Vec::new();
        let mut timeout = Duration::from_secs(10);
        if opts.index > 0 {
            query.push(("index", opts.index.to_string()));
            let wait = opts.wait.unwrap_or(Duration::from_secs(300));
            query.push(("wait", format!("{}ms", wait.as_millis())));
            // Consul adds up to wait/16 of jitter; leave room for it.
            timeout = wait + wait / 16 + Duration::from_secs(5);
        }
        if opts.consistent {
            query.push(("consistent", String::new()));
        }
        (query, timeout)
    }

    /// `PUT /v1/session/create` with no health checks: only TTL expiry or destroy end it.
    pub async fn session_create(&self, spec: &SessionSpec) -> Result<String, RegistryError> {
        #[derive(Deserialize)]
        struct Created {
            #[serde(rename = "ID")]
            id: String,
        }
        let body = serde_json::json!({
            "Name": spec.name,
            "TTL": consul_seconds(spec.ttl),
            "LockDelay": format!("{}ms", spec.lock_delay.as_millis()),
            "Behavior": spec.behavior,
            "NodeChecks": [],
            "Checks": [],
        });
        let response = self
            .send(
                self.request(Method::PUT, "/v1/session/create", Duration::from_secs(10))
                    .json(&body),
                &[],
            )
            .await?;
        Ok(Self::json::<Created>(response).await?.id)
    }

    /// `PUT /v1/session/renew/:id`: the TTL the server wants (it may raise it).
    /// [`RegistryError::SessionGone`] when the session no longer exists.
    pub async fn session_renew(&self, id: &str) -> Result<Option<Duration>, RegistryError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            #[serde(rename = "TTL", default)]
            ttl: String,
        }
        let response = self
            .send(
                self.request(
                    Method::PUT,
                    &format!("/v1/session/renew/{id}"),
                    Duration::from_secs(10),
                ),
                &[StatusCode::NOT_FOUND],
            )
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Err(RegistryError::SessionGone(id.to_owned()));
        }
        let entries: Vec<Entry> = Self::json(response).await?;
        Ok(entries.first().and_then(|e| parse_consul_duration(&e.ttl)))
    }

    /// `PUT /v1/session/destroy/:id` (idempotent).
    pub async fn session_destroy(&self, id: &str) -> Result<(), RegistryError> {
        self.send(
            self.request(
                Method::PUT,
                &format!("/v1/session/destroy/{id}"),
                Duration::from_secs(10),
            ),
            &[],
        )
        .await?;
        Ok(())
    }

    /// `GET /v1/kv/:key`: the entry, or `None` (404) with the store's index.
    pub async fn kv_get(
        &self,
        key: &str,
        opts: ReadOptions,
    ) -> Result<Versioned<Option<KvEntry>>, RegistryError> {
        let (query, timeout) = Self::read_query(opts);
        let response = self
            .send(
                self.request(Method::GET, &format!("/v1/kv/{key}"), timeout)
                    .query(&query),
                &[StatusCode::NOT_FOUND],
            )
            .await?;
        let index = Self::index_of(&response);
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(Versioned { value: None, index });
        }
        let mut entries: Vec<RawKv> = Self::json(response).await?;
        let entry = entries.pop().map(RawKv::decode).transpose()?;
        Ok(Versioned {
            value: entry,
            index,
        })
    }

    /// `GET /v1/kv/:prefix?recurse`: every entry under the prefix, sorted by key.
    pub async fn kv_list(
        &self,
        prefix: &str,
        opts: ReadOptions,
    ) -> Result<Versioned<Vec<KvEntry>>, RegistryError> {
        let (mut query, timeout) = Self::read_query(opts);
        query.push(("recurse", String::new()));
        let response = self
            .send(
                self.request(Method::GET, &format!("/v1/kv/{prefix}"), timeout)
                    .query(&query),
                &[StatusCode::NOT_FOUND],
            )
            .await?;
        let index = Self::index_of(&response);
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(Versioned {
                value: Vec::new(),
                index,
            });
        }
        let entries: Vec<RawKv> = Self::json(response).await?;
        let value = entries
            .into_iter()
            .map(RawKv::decode)
            .collect::<Result<_, _>>()?;
        Ok(Versioned { value, index })
    }

    /// `PUT /v1/kv/:key` in the given mode; `true` when the write took effect.
    pub async fn kv_put(
        &self,
        key: &str,
        value: &[u8],
        mode: Put<'_>,
    ) -> Result<bool, RegistryError> {
        let query: Vec<(&str, String)> = match mode {
            Put::Set => vec![],
            Put::Cas(index) => vec![("cas", index.to_string())],
            Put::Acquire(session) => vec![("acquire", session.to_owned())],
            Put::Release(session) => vec![("release", session.to_owned())],
        };
        let response = self
            .send(
                self.request(
                    Method::PUT,
                    &format!("/v1/kv/{key}"),
                    Duration::from_secs(10),
                )
                .query(&query)
                .body(value.to_vec()),
                &[],
            )
            .await?;
        Self::json::<bool>(response).await
    }

    /// `DELETE /v1/kv/:key[?cas=N]`; `true` when deleted (or absent).
    pub async fn kv_delete(&self, key: &str, cas: Option<u64>) -> Result<bool, RegistryError> {
        let query: Vec<(&str, String)> = cas
            .map(|c| vec![("cas", c.to_string())])
            .unwrap_or_default();
        let response = self
            .send(
                self.request(
                    Method::DELETE,
                    &format!("/v1/kv/{key}"),
                    Duration::from_secs(10),
                )
                .query(&query),
                &[],
            )
            .await?;
        Self::json::<bool>(response).await
    }

    /// `DELETE /v1/kv/:prefix?recurse`: removes every key under the prefix.
    pub async fn kv_delete_prefix(&self, prefix: &str) -> Result<(), RegistryError> {
        self.send(
            self.request(
                Method::DELETE,
                &format!("/v1/kv/{prefix}"),
                Duration::from_secs(10),
            )
            .query(&[("recurse", "")]),
            &[],
        )
        .await?;
        Ok(())
    }

    /// `PUT /v1/agent/service/register` (re-registering the same id replaces it).
    pub async fn service_register(
        &self,
        registration: &ServiceRegistration,
    ) -> Result<(), RegistryError> {
        self.send(
            self.request(
                Method::PUT,
                "/v1/agent/service/register",
                Duration::from_secs(10),
            )
            .json(registration),
            &[],
        )
        .await?;
        Ok(())
    }

    /// `PUT /v1/agent/service/deregister/:id` (no-op when unknown).
    pub async fn service_deregister(&self, id: &str) -> Result<(), RegistryError> {
        self.send(
            self.request(
                Method::PUT,
                &format!("/v1/agent/service/deregister/{id}"),
                Duration::from_secs(10),
            ),
            &[],
        )
        .await?;
        Ok(())
    }

    /// `PUT /v1/agent/check/pass/:id`. Any failure means "register the service again".
    pub async fn check_pass(&self, check_id: &str) -> Result<(), RegistryError> {
        self.send(
            self.request(
                Method::PUT,
                &format!("/v1/agent/check/pass/{check_id}"),
                Duration::from_secs(10),
            ),
            &[],
        )
        .await?;
        Ok(())
    }

    /// `PUT /v1/agent/check/fail/:id?note=`: the check is critical (the instance leaves the
    /// healthy list) until passed again. Any failure means "register the service again".
    pub async fn check_fail(&self, check_id: &str, note: &str) -> Result<(), RegistryError> {
        self.send(
            self.request(
                Method::PUT,
                &format!("/v1/agent/check/fail/{check_id}"),
                Duration::from_secs(10),
            )
            .query(&[("note", note)]),
            &[],
        )
        .await?;
        Ok(())
    }

    /// `GET /v1/health/service/:name?passing`: instances whose checks all pass.
    pub async fn healthy(
        &self,
        service: &str,
        opts: ReadOptions,
    ) -> Result<Versioned<Vec<ServiceInstance>>, RegistryError> {
        let (mut query, timeout) = Self::read_query(opts);
        query.push(("passing", String::new()));
        let response = self
            .send(
                self.request(
                    Method::GET,
                    &format!("/v1/health/service/{service}"),
                    timeout,
                )
                .query(&query),
                &[],
            )
            .await?;
        let index = Self::index_of(&response);
        let entries: Vec<RawHealth> = Self::json(response).await?;
        let value = entries
            .into_iter()
            .map(|e| ServiceInstance {
                address: if e.service.address.is_empty() {
                    e.node.address
                } else {
                    e.service.address
                },
                id: e.service.id,
                port: e.service.port,
                meta: e.service.meta.unwrap_or_default(),
            })
            .collect();
        Ok(Versioned { value, index })
    }
}

/// A duration as Consul's whole-seconds text, rounded up (at least "1s"): rounding down would
/// make the server expect renewals sooner than the client sends them.
pub fn consul_seconds(d: Duration) -> String {
    format!("{}s", (d.as_millis().div_ceil(1000)).max(1))
}

/// Parses Consul's duration text (`"15s"`, `"1m30s"`, `"250ms"`).
pub fn parse_consul_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let mut unit = c.to_string();
        while let Some(&next) = chars.peek() {
            if next.is_ascii_alphabetic() || next == 'µ' {
                unit.push(next);
                chars.next();
            } else {
                break;
            }
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        let seconds = match unit.as_str() {
            "h" => value * 3600.0,
            "m" => value * 60.0,
            "s" => value,
            "ms" => value / 1e3,
            "us" | "µs" => value / 1e6,
            "ns" => value / 1e9,
            _ => return None,
        };
        total += Duration::from_secs_f64(seconds);
    }
    if !number.is_empty() {
        return None;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_whole_seconds_rounding_up() {
        assert_eq!(consul_seconds(Duration::from_millis(1500)), "2s");
        assert_eq!(consul_seconds(Duration::from_secs(10)), "10s");
        assert_eq!(consul_seconds(Duration::from_millis(10)), "1s");
    }

    #[test]
    fn parses_consul_durations() {
        assert_eq!(parse_consul_duration("15s"), Some(Duration::from_secs(15)));
        assert_eq!(
            parse_consul_duration("1m30s"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse_consul_duration("250ms"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_consul_duration(""), None);
        assert_eq!(parse_consul_duration("20"), None);
        assert_eq!(parse_consul_duration("5x"), None);
    }
}
