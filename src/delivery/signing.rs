//! Signed deliveries, per the Standard Webhooks specification: `webhook-id`,
//! `webhook-timestamp` and `webhook-signature` headers, the signature being
//! `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")) for each secret in force, space
//! separated (several during a rotation). Secrets are `whsec_` + base64 of the key.
//!
//! Which secrets sign a job: those configured for its endpoint (URL without query), else those
//! of its bucket, else none (the job goes unsigned). Secrets are never logged or printed.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::job::Job;

/// Header carrying the message id (the job id: the same on every attempt).
pub const ID_HEADER: &str = "webhook-id";
/// Header carrying the signing time, in Unix seconds.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Header carrying the signatures.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// Where the secret of an event's subscription is found (the subscription cache, which lives
/// above delivery).
pub trait SubscriptionSecrets: fmt::Debug + Send + Sync {
    /// The subscription's signing key, if it is known.
    fn secret(&self, subscription: &ulid::Ulid) -> Option<SigningSecret>;

    /// Whether its receiver gets a `traceparent` header (unless it said no, yes).
    fn sends_traceparent(&self, _subscription: &ulid::Ulid) -> bool {
        true
    }
}

/// A signing key, parsed from its `whsec_...` text.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(redacted)")
    }
}

/// A secret that is not `whsec_` followed by base64 of at least 24 bytes.
#[derive(Debug, thiserror::Error)]
#[error("signing secret must be whsec_ followed by base64 of 24 to 64 bytes")]
pub struct InvalidSecret;

impl std::str::FromStr for SigningSecret {
    type Err = InvalidSecret;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let encoded = text.strip_prefix("whsec_").ok_or(InvalidSecret)?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| InvalidSecret)?;
        if !(24..=64).contains(&key.len()) {
            return Err(InvalidSecret);
        }
        Ok(SigningSecret(key))
    }
}

/// The `webhook-signature` value for a message signed with every secret given.
pub fn sign(secrets: &[SigningSecret], id: &str, timestamp: i64, body: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    secrets
        .iter()
        .map(|secret| {
            // HMAC accepts keys of any length; this cannot fail.
            let mut mac =
                <Hmac<Sha256> as Mac>::new_from_slice(&secret.0).unwrap_or_else(|_| unreachable!());
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            format!("v1,{}", b64.encode(mac.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which secrets sign which jobs.
#[derive(Clone, Debug, Default)]
pub struct SigningConfig {
    buckets: HashMap<String, Vec<SigningSecret>>,
    endpoints: HashMap<String, Vec<SigningSecret>>,
}

/// A signing configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SigningConfigError {
    /// The file could not be read.
    #[error("cannot read signing config {0}")]
    Read(String, #[source] std::io::Error),
    /// The file is not the expected JSON.
    #[error("signing config {0}: {1}")]
    Parse(String, String),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SigningFile {
    #[serde(default)]
    buckets: HashMap<String, Vec<String>>,
    #[serde(default)]
    endpoints: HashMap<String, Vec<String>>,
}

impl SigningConfig {
    /// Reads `{"buckets": {"tenant": ["whsec_..."]}, "endpoints": {"https://h/p": ["whsec_..."]}}`.
    /// Several secrets for one key mean a rotation: every delivery carries all their signatures.
    pub fn load(path: &Path) -> Result<Self, SigningConfigError> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| SigningConfigError::Read(name.clone(), e))?;
        let file: SigningFile = serde_json::from_str(&text)
            .map_err(|e| SigningConfigError::Parse(name.clone(), e.to_string()))?;
        let parse = |section: &str, map: HashMap<String, Vec<String>>| {
            map.into_iter()
                .map(|(key, secrets)| {
                    let parsed = secrets
                        .iter()
                        .map(|s| s.parse::<SigningSecret>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| {
                            SigningConfigError::Parse(name.clone(), format!("{section}.{key}: {e}"))
                        })?;
                    Ok((key, parsed))
                })
                .collect::<Result<HashMap<_, _>, SigningConfigError>>()
        };
        Ok(SigningConfig {
            buckets: parse("buckets", file.buckets)?,
            endpoints: parse("endpoints", file.endpoints)?,
        })
    }

    /// Signs `bucket`'s jobs with `secrets`.
    pub fn with_bucket(mut self, bucket: &str, secrets: Vec<SigningSecret>) -> Self {
        self.buckets.insert(bucket.to_owned(), secrets);
        self
    }

    /// Signs jobs to `endpoint` (URL without query) with `secrets`, whatever their bucket.
    pub fn with_endpoint(mut self, endpoint: &str, secrets: Vec<SigningSecret>) -> Self {
        self.endpoints.insert(endpoint.to_owned(), secrets);
        self
    }

    /// The secrets that sign `job` (empty: unsigned).
    pub fn secrets_for(&self, job: &Job) -> &[SigningSecret] {
        self.endpoints
            .get(job.lane())
            .or_else(|| self.buckets.get(&*job.bucket))
            .map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproduces_the_specifications_test_vector() {
        let secret: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let signature = sign(
            &[secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    /// The vectors the SDKs' receiver checks are tested with (signed by the standardwebhooks
    /// package): spindle signs each the same.
    #[test]
    fn signs_the_sdks_shared_vectors_as_the_reference_package_does() {
        let text = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/sdks/webhook-vectors.json"
        ));
        let doc: serde_json::Value = serde_json::from_str(text).unwrap();
        let signed: Vec<&serde_json::Value> = doc["vectors"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["why"] == "signed by the secret")
            .collect();
        assert!(signed.len() >= 12);
        for v in signed {
            let secret: SigningSecret = v["secret"].as_str().unwrap().parse().unwrap();
            let ours = sign(
                &[secret],
                v["id"].as_str().unwrap(),
                v["timestamp"].as_i64().unwrap(),
                v["body"].as_str().unwrap().as_bytes(),
            );
            assert_eq!(ours, v["signature"].as_str().unwrap(), "{v}");
        }
    }

    #[test]
    fn rotation_signs_with_every_secret_and_secrets_stay_secret() {
        let a: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let b: SigningSecret = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 32])
        )
        .parse()
        .unwrap();
        let both = sign(&[a.clone(), b], "id", 1, b"{}");
        let parts: Vec<_> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(std::slice::from_ref(&a), "id", 1, b"{}"));
        assert!(!format!("{a:?}").contains("MfKQ"));
        assert!("whsec_c2hvcnQ=".parse::<SigningSecret>().is_err());
        assert!("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            .parse::<SigningSecret>()
            .is_err());
    }
}
