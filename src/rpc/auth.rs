//! Authentication of RPC callers: bearer tokens, stored only as SHA-256 hashes and compared in
//! constant time, each scoped to a set of buckets (producers) or to everything (admin).
//!
//! The token file (`--tokens`):
//! `{"tokens": [{"name": "producer-a", "sha256": "<hex>", "buckets": ["tenant-1"],
//!               "requests_per_second": 50, "burst": 100},
//!              {"name": "ops", "sha256": "<hex>", "admin": true}]}`
//! A token with `requests_per_second` is rate-limited (token bucket, `burst` defaults to the
//! rate); excess requests get 429 with `Retry-After`.
//! `spindle tokens new` makes a token and prints its entry. Tokens are never logged; only a
//! token's name appears in errors.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Operator actions and every bucket.
    Admin,
    /// Submit to and read these buckets only.
    Buckets(HashSet<String>),
}

/// An authenticated caller.
#[derive(Clone)]
pub struct Caller {
    /// The token's name (safe to show).
    pub name: String,
    /// What it may do.
    pub scope: Scope,
    /// Buckets whose subscriptions it may manage (an admin token: every bucket's).
    manages: HashSet<String>,
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish()
    }
}

impl Caller {
    /// Takes one request from the token's rate limit: `Err(wait)` when the caller must wait.
    pub fn admit(&self) -> Result<(), Duration> {
        match &self.limiter {
            None => Ok(()),
            Some(limiter) => limiter
                .check()
                .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now())),
        }
    }

    /// Whether the caller may submit to, and read jobs of, `bucket`.
    pub fn may_use(&self, bucket: &str) -> bool {
        match &self.scope {
            Scope::Admin => true,
            Scope::Buckets(buckets) => buckets.contains(bucket) || buckets.contains("*"),
        }
    }

    /// Whether it may manage `bucket`'s subscriptions (add, list, change, remove, back-fill):
    /// an admin token, or a token given the bucket to manage (`manages`); using a bucket is
    /// not enough, since a subscription decides where the bucket's events go.
    pub fn may_manage(&self, bucket: &str) -> bool {
        matches!(self.scope, Scope::Admin)
            || self.manages.contains(bucket)
            || self.manages.contains("*")
    }
}

#[derive(Clone)]
struct Entry {
    hash: [u8; 32],
    caller: Caller,
}

/// The known tokens.
#[derive(Clone, Default)]
pub struct TokenStore {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for TokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self
            .entries
            .iter()
            .map(|e| e.caller.name.as_str())
            .collect();
        f.debug_struct("TokenStore").field("names", &names).finish()
    }
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// Unreadable.
    #[error("cannot read token file {0}")]
    Read(String, #[source] std::io::Error),
    /// Not the expected JSON, or an entry is invalid.
    #[error("token file {0}: {1}")]
    Invalid(String, String),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<TokenEntry>,
}

#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    sha256: String,
    #[serde(default)]
    buckets: Vec<String>,
    #[serde(default)]
    admin: bool,
    /// Buckets whose subscriptions it may manage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    manages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Option<u32>,
}

fn limiter(per_second: Option<u32>, burst: Option<u32>) -> Option<Arc<DefaultDirectRateLimiter>> {
    let rate = NonZeroU32::new(per_second?)?;
    let burst = burst.and_then(NonZeroU32::new).unwrap_or(rate);
    Some(Arc::new(RateLimiter::direct(
        Quota::per_second(rate).allow_burst(burst),
    )))
}

/// The SHA-256 of a token, as stored.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl TokenStore {
    /// Reads a token file.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| TokenFileError::Read(name.clone(), e))?;
        let file: TokenFile = serde_json::from_str(&text)
            .map_err(|e| TokenFileError::Invalid(name.clone(), e.to_string()))?;
        let mut store = TokenStore::default();
        for entry in file.tokens {
            let hash = unhex(&entry.sha256).ok_or_else(|| {
                TokenFileError::Invalid(
                    name.clone(),
                    format!("{}: sha256 must be 64 hex digits", entry.name),
                )
            })?;
            if !entry.admin && entry.buckets.is_empty() && entry.manages.is_empty() {
                return Err(TokenFileError::Invalid(
                    name.clone(),
                    format!("{}: give buckets, manages or admin", entry.name),
                ));
            }
            store.entries.push(Entry {
                hash,
                caller: Caller {
                    name: entry.name,
                    scope: if entry.admin {
                        Scope::Admin
                    } else {
                        Scope::Buckets(entry.buckets.into_iter().collect())
                    },
                    manages: entry.manages.into_iter().collect(),
                    limiter: limiter(entry.requests_per_second, entry.burst),
                },
            });
        }
        Ok(store)
    }

    /// Adds a rate-limited token: `per_second` requests, bursts of `burst`.
    pub fn with_limited_token(
        mut self,
        token: &str,
        name: &str,
        scope: Scope,
        per_second: u32,
        burst: u32,
    ) -> Self {
        self.entries.push(Entry {
            hash: hash(token),
            caller: Caller {
                name: name.to_owned(),
                scope,
                manages: HashSet::new(),
                limiter: limiter(Some(per_second), Some(burst)),
            },
        });
        self
    }

    /// Adds a token (tests and embedded setups).
    pub fn with_token(mut self, token: &str, name: &str, scope: Scope) -> Self {
        self.entries.push(Entry {
            hash: hash(token),
            caller: Caller {
                name: name.to_owned(),
                scope,
                manages: HashSet::new(),
                limiter: None,
            },
        });
        self
    }

    /// Lets the token added last manage these buckets' subscriptions.
    pub fn managing(mut self, buckets: &[&str]) -> Self {
        if let Some(entry) = self.entries.last_mut() {
            entry
                .caller
                .manages
                .extend(buckets.iter().map(|b| b.to_string()));
        }
        self
    }

    /// The caller a presented token belongs to. Every entry is compared, each in constant
    /// time, so timing tells nothing about how much of a hash matched.
    pub fn authenticate(&self, token: &str) -> Option<Caller> {
        let presented = hash(token);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(entry.caller.clone());
            }
        }
        found
    }
}

/// A fresh random token (`spt_` + 32 random bytes, base64url) and its token-file entry.
pub fn new_token(
    name: &str,
    buckets: &[String],
    manages: &[String],
    admin: bool,
) -> (String, String) {
    let bytes: [u8; 32] = rand::random();
    let token = format!(
        "spt_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let entry = TokenEntry {
        name: name.to_owned(),
        sha256: hex(&hash(&token)),
        buckets: buckets.to_vec(),
        admin,
        manages: manages.to_vec(),
        requests_per_second: None,
        burst: None,
    };
    let entry = serde_json::to_string(&entry).unwrap_or_default();
    (token, entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_authenticate_by_hash_and_scopes_apply() {
        let (token, entry) = new_token("p", &["t1".to_owned()], &["t3".to_owned()], false);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), format!(r#"{{"tokens": [{entry}]}}"#)).unwrap();
        let store = TokenStore::load(file.path()).unwrap();
        assert!(!format!("{store:?}").contains(&token));
        let caller = store.authenticate(&token).expect("known token");
        assert_eq!(caller.name, "p");
        assert!(caller.may_use("t1"));
        assert!(!caller.may_use("t2"));
        assert!(caller.may_manage("t3") && !caller.may_use("t3"));
        assert!(
            !caller.may_manage("t1"),
            "using a bucket is not managing it"
        );
        assert!(store.authenticate("spt_wrong").is_none());
        assert!(store.authenticate("").is_none());
        let admin = TokenStore::default().with_token("a", "ops", Scope::Admin);
        let admin = admin.authenticate("a").unwrap();
        assert!(admin.may_use("anything") && admin.may_manage("anything"));
    }

    #[test]
    fn bad_token_files_are_refused() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            file.path(),
            r#"{"tokens": [{"name": "x", "sha256": "abc"}]}"#,
        )
        .unwrap();
        assert!(TokenStore::load(file.path()).is_err());
        std::fs::write(
            file.path(),
            format!(
                r#"{{"tokens": [{{"name": "x", "sha256": "{}"}}]}}"#,
                "0".repeat(64)
            ),
        )
        .unwrap();
        assert!(TokenStore::load(file.path()).is_err(), "no scope");
    }
}
