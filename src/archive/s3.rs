//! The S3 backend of the archive: [`S3Config`], and the store behind [`super::Archive`] when it
//! is in an S3-compatible bucket: building the client (one rustls-on-ring HTTP stack, the
//! operation timeout, static or chained credentials), creating a missing bucket, PUT with the
//! SHA-256 in metadata confirmed by HEAD, GET checked against it, paginated listing, and the
//! classification of SDK errors into transient or not.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use bytes::Bytes;

use super::format::sha256_hex;
use super::ArchiveError;

/// The object-metadata key (sent as `x-amz-meta-sha256`) holding the hex SHA-256 of an object.
const SHA256_METADATA: &str = "sha256";

/// Where and how to reach the S3-compatible store. Its `Debug` output hides the secret.
#[derive(Clone)]
pub struct S3Config {
    /// The store's URL, e.g. `http://127.0.0.1:9000`; `None` uses AWS's own endpoints.
    pub endpoint: Option<String>,
    /// The signing region (default `us-east-1`); also the region a created bucket is placed in.
    pub region: String,
    /// The bucket holding the archive.
    pub bucket: String,
    /// Key prefix, e.g. `spindle/` (default empty). A `/` is appended when missing.
    pub prefix: String,
    /// Address buckets as `endpoint/bucket/key` rather than `bucket.endpoint/key` (default
    /// false; most self-hosted stores need true).
    pub path_style: bool,
    /// Static access key; `None` (the default) uses the standard AWS credential chain
    /// (environment, profile, web identity, container, instance metadata).
    pub access_key_id: Option<String>,
    /// The secret of `access_key_id`; both or neither must be set.
    pub secret_access_key: Option<String>,
    /// Create the bucket at connect if it is missing (default false; for tests and dev).
    pub create_bucket: bool,
    /// Deadline of one whole S3 operation, retries included (default 10 s), so a stopped
    /// server cannot hang us.
    pub timeout: Duration,
}

impl S3Config {
    /// A configuration for `bucket` with the defaults documented on each field.
    pub fn new(bucket: impl Into<String>) -> Self {
        S3Config {
            endpoint: None,
            region: "us-east-1".to_owned(),
            bucket: bucket.into(),
            prefix: String::new(),
            path_style: false,
            access_key_id: None,
            secret_access_key: None,
            create_bucket: false,
            timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Configs end up in start-up logs; the secret must not.
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("create_bucket", &self.create_bucket)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// An archive in an S3-compatible bucket: the client, the bucket and the deadline of one
/// operation. Cheap to clone; clones share connections.
#[derive(Clone, Debug)]
pub(super) struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: Arc<str>,
    timeout: Duration,
}

impl S3Store {
    /// Builds the S3 client. Makes no request unless `config.create_bucket` is set, in which
    /// case the bucket is created when HeadBucket says it is missing.
    pub(super) async fn connect(config: &S3Config) -> Result<S3Store, ArchiveError> {
        if config.bucket.is_empty() {
            return Err(ArchiveError::Rejected("no bucket configured".to_owned()));
        }
        if config.timeout.is_zero() {
            return Err(ArchiveError::Rejected("the s3 timeout is zero".to_owned()));
        }
        // One TLS stack for the whole binary: rustls on ring, as reqwest uses.
        let http_client = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let timeouts = TimeoutConfig::builder()
            .operation_timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(3)))
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .http_client(http_client)
            .timeout_config(timeouts);
        match (&config.access_key_id, &config.secret_access_key) {
            (Some(id), Some(secret)) => {
                loader = loader.credentials_provider(Credentials::new(
                    id.clone(),
                    secret.clone(),
                    None,
                    None,
                    "spindle-config",
                ));
            }
            (None, None) => {}
            _ => {
                return Err(ArchiveError::Rejected(
                    "set both the s3 access key id and secret, or neither".to_owned(),
                ))
            }
        }
        let shared = loader.load().await;
        let mut s3 = aws_sdk_s3::config::Builder::from(&shared).force_path_style(config.path_style);
        if let Some(endpoint) = &config.endpoint {
            s3 = s3.endpoint_url(endpoint.clone());
        }
        let client = aws_sdk_s3::Client::from_conf(s3.build());
        if config.create_bucket {
            ensure_bucket(&client, &config.bucket, &config.region).await?;
        }
        Ok(S3Store {
            client,
            bucket: config.bucket.as_str().into(),
            timeout: config.timeout,
        })
    }

    /// PUTs an object with its SHA-256 in metadata, then HEADs it to confirm it is there whole.
    pub(super) async fn put(
        &self,
        key: &str,
        data: Bytes,
        sha256: &str,
        content_type: &str,
    ) -> Result<(), ArchiveError> {
        let client = &self.client;
        let len = data.len();
        client
            .put_object()
            .bucket(&*self.bucket)
            .key(key)
            .content_type(content_type)
            .metadata(SHA256_METADATA, sha256)
            .body(ByteStream::from(data))
            .send()
            .await
            .map_err(|e| classify(&format!("put {key}"), e))?;
        let head = client
            .head_object()
            .bucket(&*self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| match e.as_service_error() {
                // Just written, yet missing: a store with lagging reads. Try again later.
                Some(s) if s.is_not_found() => {
                    ArchiveError::Unavailable(format!("{key} is missing right after its upload"))
                }
                _ => classify(&format!("head {key}"), e),
            })?;
        let stored_len = head.content_length();
        if stored_len != Some(len as i64) {
            return Err(ArchiveError::Corrupt(format!(
                "{key}: stored length {stored_len:?}, uploaded {len}"
            )));
        }
        let stored_sha = head.metadata().and_then(|m| m.get(SHA256_METADATA));
        if stored_sha.map(String::as_str) != Some(sha256) {
            return Err(ArchiveError::Corrupt(format!(
                "{key}: stored sha256 {stored_sha:?}, uploaded {sha256}"
            )));
        }
        Ok(())
    }

    /// Downloads a whole object with its metadata, within the configured timeout, checking it
    /// against the SHA-256 in its metadata when there is one. `None` when there is no such key.
    pub(super) async fn get(
        &self,
        key: &str,
    ) -> Result<Option<(Bytes, HashMap<String, String>)>, ArchiveError> {
        let output = match self
            .client
            .get_object()
            .bucket(&*self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(classify(&format!("get {key}"), e)),
        };
        let metadata = output.metadata.clone().unwrap_or_default();
        // The SDK's operation timeout ends when the headers arrive; the body needs its own.
        let body = tokio::time::timeout(self.timeout, output.body.collect())
            .await
            .map_err(|_| ArchiveError::Unavailable(format!("get {key}: body timed out")))?
            .map_err(|e| ArchiveError::Unavailable(format!("get {key}: {e}")))?
            .into_bytes();
        if let Some(expected) = metadata.get(SHA256_METADATA) {
            let actual = sha256_hex(&body);
            if &actual != expected {
                return Err(ArchiveError::Corrupt(format!(
                    "{key}: sha256 {actual}, metadata says {expected}"
                )));
            }
        }
        Ok(Some((body, metadata)))
    }

    /// Every key starting with `list_prefix`, in byte order (ListObjectsV2's order, paginated).
    pub(super) async fn list(&self, list_prefix: &str) -> Result<Vec<String>, ArchiveError> {
        let mut keys = Vec::new();
        let mut continuation: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&*self.bucket)
                .prefix(list_prefix)
                .set_continuation_token(continuation.take())
                .send()
                .await
                .map_err(|e| classify(&format!("list {}/{list_prefix}", self.bucket), e))?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|o| o.key())
                    .map(str::to_owned),
            );
            match page.next_continuation_token() {
                Some(token) if page.is_truncated() == Some(true) => {
                    continuation = Some(token.to_owned())
                }
                _ => break,
            }
        }
        Ok(keys)
    }
}

/// Creates the bucket when HeadBucket says it is missing.
async fn ensure_bucket(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    region: &str,
) -> Result<(), ArchiveError> {
    let what = format!("head bucket {bucket}");
    match client.head_bucket().bucket(bucket).send().await {
        Ok(_) => return Ok(()),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => {}
        Err(e) => return Err(classify(&what, e)),
    }
    let mut create = client.create_bucket().bucket(bucket);
    // us-east-1 is the one region that refuses an explicit location constraint.
    if region != "us-east-1" {
        create = create.create_bucket_configuration(
            CreateBucketConfiguration::builder()
                .location_constraint(BucketLocationConstraint::from(region))
                .build(),
        );
    }
    match create.send().await {
        Ok(_) => Ok(()),
        // Another process created it between our HEAD and CREATE.
        Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => Ok(()),
        Err(e) => Err(classify(&format!("create bucket {bucket}"), e)),
    }
}

/// S3 error codes that mean "slow down or try again", whatever the status says.
const TRANSIENT_CODES: &[&str] = &[
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
];

/// Sorts an SDK error into transient (network, timeout, 5xx, throttling) or not.
fn classify<E>(what: &str, err: SdkError<E>) -> ArchiveError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ConstructionFailure(_) => {
            ArchiveError::Rejected(format!("{what}: {}", DisplayErrorContext(&err)))
        }
        SdkError::TimeoutError(_) => ArchiveError::Unavailable(format!("{what}: timed out")),
        SdkError::DispatchFailure(failure) if failure.is_user() => {
            ArchiveError::Rejected(format!("{what}: {}", DisplayErrorContext(&err)))
        }
        SdkError::ServiceError(_) => {
            let status = err.raw_response().map(|r| r.status().as_u16());
            let code = err.code().unwrap_or("unknown");
            let message = format!(
                "{what}: {code} (status {}): {}",
                status.map_or_else(|| "?".to_owned(), |s| s.to_string()),
                err.message().unwrap_or("")
            );
            let transient =
                status.is_some_and(|s| s >= 500 || s == 429) || TRANSIENT_CODES.contains(&code);
            if transient {
                ArchiveError::Unavailable(message)
            } else {
                ArchiveError::Rejected(message)
            }
        }
        // Dispatch (connect, reset, I/O) and unreadable responses: the store or the path to it.
        _ => ArchiveError::Unavailable(format!("{what}: {}", DisplayErrorContext(&err))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::Archive;

    #[test]
    fn the_config_debug_output_hides_the_secret() {
        let mut config = S3Config::new("b");
        config.access_key_id = Some("AKIDEXAMPLE".into());
        config.secret_access_key = Some("wJalrXUtnFEMI".into());
        let shown = format!("{config:?}");
        assert!(shown.contains("AKIDEXAMPLE") && !shown.contains("wJalrXUtnFEMI"));
    }

    #[tokio::test]
    async fn half_given_credentials_are_rejected() {
        let mut config = S3Config::new("b");
        config.access_key_id = Some("k".into());
        let err = Archive::connect(&config).await.unwrap_err();
        assert!(matches!(err, ArchiveError::Rejected(_)));
    }
}
