//! A real S3-compatible server for the archive tests: moto (from PyPI, installed on first use)
//! behind a fault proxy whose [`Mode`] a test switches, and boto3 helpers that read back what
//! was stored with a client independent of ours.
//!
//! moto runs as a child process on a free loopback port. It also exits on its own when this
//! test process dies (it watches its stdin, a pipe we hold), so a killed test run leaves
//! nothing running. The proxy is plain hyper: requests and responses pass through unchanged
//! except for hop-by-hop headers, bodies streamed.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use spindle::archive::S3Config;
use tokio::sync::watch;

/// The moto and boto3 versions installed when missing.
const MOTO_REQUIREMENT: &str = "moto[server]==5.2.1";
const BOTO3_REQUIREMENT: &str = "boto3==1.43.11";

/// What the fault proxy does with each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward to moto and back.
    Pass,
    /// Answer 503 with an S3 `SlowDown` error body (after reading the request).
    Error503,
    /// Accept connections and close them at once, open ones included, answering nothing.
    Down,
    /// Accept requests and never answer (a stopped server): only the client's timeout helps.
    Hang,
}

/// moto on a free port, fronted by the fault proxy. Both stop when this is dropped.
pub struct S3Server {
    moto: Child,
    moto_addr: SocketAddr,
    proxy_addr: SocketAddr,
    mode: watch::Sender<Mode>,
    proxy: tokio::task::JoinHandle<()>,
    log: PathBuf,
}

impl S3Server {
    /// Installs moto and boto3 if missing, starts moto, waits until it answers, starts the proxy.
    pub async fn start() -> S3Server {
        tokio::task::spawn_blocking(ensure_python_tools)
            .await
            .expect("install check");
        let (moto, moto_addr, log) = start_moto().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let proxy_addr = listener.local_addr().expect("proxy addr");
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let proxy = tokio::spawn(run_proxy(listener, moto_addr, mode_rx));
        S3Server {
            moto,
            moto_addr,
            proxy_addr,
            mode,
            proxy,
            log,
        }
    }

    /// The proxy's URL: what the code under test talks to.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.proxy_addr)
    }

    /// moto's own URL, bypassing the proxy: for checking what is really stored.
    pub fn moto_endpoint(&self) -> String {
        format!("http://{}", self.moto_addr)
    }

    /// Switches the proxy's behaviour for every later request (and closes open connections
    /// when going `Down`).
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// A configuration for `bucket` through the proxy: path style, dummy credentials, bucket
    /// created at connect, a 3 s timeout.
    pub fn config(&self, bucket: &str) -> S3Config {
        let mut config = S3Config::new(bucket);
        config.endpoint = Some(self.endpoint());
        config.path_style = true;
        config.access_key_id = Some("test".to_owned());
        config.secret_access_key = Some("test".to_owned());
        config.create_bucket = true;
        config.timeout = Duration::from_secs(3);
        config
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.proxy.abort();
        let _ = self.moto.kill();
        let _ = self.moto.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A bucket name of this test alone (S3 rules: lower case, at most 63 characters).
pub fn unique_bucket(tag: &str) -> String {
    format!(
        "spindle-{tag}-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    )
}

fn python_tools_present() -> bool {
    Command::new("python3")
        .args(["-c", "import moto.server, flask, flask_cors, boto3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs moto and boto3 from PyPI once per test process if they are missing.
fn ensure_python_tools() {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        if python_tools_present() {
            return;
        }
        let installed = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                MOTO_REQUIREMENT,
                BOTO3_REQUIREMENT,
            ])
            .status()
            .expect("pip");
        assert!(
            installed.success(),
            "could not install moto and boto3 from PyPI"
        );
        assert!(
            python_tools_present(),
            "moto or boto3 still missing after pip install"
        );
    });
}

/// Runs moto's server; a watcher thread ends it when stdin reaches EOF (our process is gone).
const MOTO_LAUNCHER: &str = r#"
import os, sys, threading
def watch_parent():
    sys.stdin.buffer.read()
    os._exit(0)
threading.Thread(target=watch_parent, daemon=True).start()
from moto.server import main
main(["-H", "127.0.0.1", "-p", sys.argv[1]])
"#;

async fn start_moto() -> (Child, SocketAddr, PathBuf) {
    // A port can be taken between our probe and moto's bind: try a few.
    for _ in 0..3 {
        let port = StdListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = std::env::temp_dir().join(format!("spindle-moto-{port}.log"));
        let log_file = std::fs::File::create(&log).expect("moto log");
        let mut child = Command::new("python3")
            .args(["-c", MOTO_LAUNCHER, &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(log_file.try_clone().expect("log handle"))
            .stderr(log_file)
            .spawn()
            .expect("start moto");
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break; // exited: most likely the port was taken
            }
            let answered = client
                .get(format!("http://{addr}/"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok();
            if answered {
                return (child, addr, log);
            }
            if tokio::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "moto did not answer within 60 s:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "moto exited at start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let _ = std::fs::remove_file(&log);
    }
    panic!("moto could not be started");
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;
type ProxyError = Box<dyn std::error::Error + Send + Sync>;

async fn run_proxy(
    listener: tokio::net::TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
) {
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
    // Connection tasks live in the set, so aborting this task (on drop) ends them all.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        if *mode.borrow() == Mode::Down {
            drop(stream);
            continue;
        }
        let client = client.clone();
        let mut watch_down = mode.clone();
        let request_mode = mode.clone();
        connections.spawn(async move {
            let service =
                service_fn(move |req| forward(req, client.clone(), upstream, request_mode.clone()));
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                // Dropping the connection closes the socket, mid-request or idle.
                _ = watch_down.wait_for(|m| *m == Mode::Down) => {}
            }
        });
    }
}

/// Headers that describe one hop, not the message: hyper frames each side itself.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    // The proxy's own server side already answered any 100-continue.
    "expect",
];

fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
}

async fn forward(
    req: Request<Incoming>,
    client: Client<HttpConnector, Incoming>,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let current = *mode.borrow();
    match current {
        // An error from the service makes hyper drop the connection without an answer.
        Mode::Down => return Err("proxy is down".into()),
        Mode::Hang => {
            // Hold the request until the mode changes, then drop the connection.
            let mut mode = mode;
            let _ = mode.wait_for(|m| *m != Mode::Hang).await;
            return Err("proxy stopped hanging".into());
        }
        Mode::Error503 => {
            // Read the request first, as S3 does, so the client sees the answer, not a reset.
            let _ = req.into_body().collect().await;
            return Ok(slow_down());
        }
        Mode::Pass => {}
    }
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    // The Host header is left as the client sent it (the proxy's): moto does not check
    // signatures, and path-style requests carry the bucket in the path.
    parts.uri = format!("http://{upstream}{path}").parse()?;
    strip_hop_by_hop(&mut parts.headers);
    let response = match client.request(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(e) => return Ok(plain(StatusCode::BAD_GATEWAY, format!("upstream: {e}"))),
    };
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, body.boxed()))
}

fn full(body: impl Into<Bytes>) -> ProxyBody {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn plain(status: StatusCode, text: String) -> Response<ProxyBody> {
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response
}

fn slow_down() -> Response<ProxyBody> {
    let body = concat!(
        r#"<?xml version="1.0" encoding="UTF-8"?>"#,
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>",
        "<RequestId>fault-proxy</RequestId><HostId>fault-proxy</HostId></Error>"
    );
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    response
}

/// The independent side: list, download, hash, gunzip and parse, in Python, and print one JSON
/// value. The store is S3 through boto3, or, for an endpoint `file://ROOT`, the archive
/// directory `ROOT/<bucket>` through plain file calls (every file listed, temp files included).
const BOTO3_SCRIPT: &str = r#"
import base64, gzip, hashlib, json, os, sys

endpoint, bucket, action = sys.argv[1], sys.argv[2], sys.argv[3]
if endpoint.startswith("file://"):
    root = os.path.join(endpoint[len("file://"):], bucket)

    def keys():
        out = []
        for folder, _, files in os.walk(root):
            for name in files:
                out.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
        return sorted(out, key=lambda k: k.encode())

    def get(key):
        with open(os.path.join(root, *key.split("/")), "rb") as f:
            body = f.read()
        return body, len(body), {}

    def put(key, body):
        path = os.path.join(root, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(body)
else:
    import boto3
    from botocore.config import Config
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )

    def keys():
        out = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            out.extend(o["Key"] for o in page.get("Contents", []))
        return out

    def get(key):
        got = s3.get_object(Bucket=bucket, Key=key)
        return got["Body"].read(), got["ContentLength"], got.get("Metadata", {})

    def put(key, body):
        s3.put_object(Bucket=bucket, Key=key, Body=body)

if action == "keys":
    print(json.dumps(keys()))
elif action == "read":
    body = get(sys.argv[4])[0]
    print(json.dumps(base64.b64encode(body).decode()))
elif action == "put":
    put(sys.argv[4], base64.b64decode(sys.argv[5]))
    print(json.dumps(True))
elif action == "dump":
    objects = {}
    for key in keys():
        body, length, metadata = get(key)
        entry = {
            "size": len(body),
            "content_length": length,
            "sha256": hashlib.sha256(body).hexdigest(),
            "metadata": metadata,
        }
        if key.endswith(".ndjson.gz"):
            text = gzip.decompress(body)
            entry["uncompressed_size"] = len(text)
            entry["records"] = [json.loads(line) for line in text.splitlines() if line]
        elif key.endswith(".json"):
            entry["json"] = json.loads(body)
        objects[key] = entry
    print(json.dumps(objects))
else:
    sys.exit("unknown action " + action)
"#;

async fn boto3(endpoint: &str, bucket: &str, args: &[&str]) -> Value {
    let run = tokio::process::Command::new("python3")
        .args(["-c", BOTO3_SCRIPT, endpoint, bucket])
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("boto3 within 2 minutes")
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "boto3 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("boto3 printed JSON")
}

/// Every key of `bucket`, listed by boto3.
pub async fn boto3_keys(endpoint: &str, bucket: &str) -> Vec<String> {
    serde_json::from_value(boto3(endpoint, bucket, &["keys"]).await).expect("key list")
}

/// One object's bytes, downloaded by boto3.
pub async fn boto3_read(endpoint: &str, bucket: &str, key: &str) -> Vec<u8> {
    let encoded = boto3(endpoint, bucket, &["read", key]).await;
    base64::engine::general_purpose::STANDARD
        .decode(encoded.as_str().expect("base64 string"))
        .expect("base64")
}

/// Stores `body` under `key` with boto3 (or plain file calls), bypassing our client.
pub async fn boto3_put(endpoint: &str, bucket: &str, key: &str, body: &[u8]) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(body);
    boto3(endpoint, bucket, &["put", key, &encoded]).await;
}

/// The endpoint under which the `boto3_*` helpers read an archive directory `root` (holding
/// bucket directories) with plain file calls instead of boto3.
pub fn dir_endpoint(root: &std::path::Path) -> String {
    format!("file://{}", root.display())
}

/// Every object of `bucket` as boto3 sees it, by key: `size`, `content_length`, `sha256`
/// (computed in Python), `metadata`; for `.ndjson.gz` objects `uncompressed_size` and
/// `records` (gunzipped and parsed in Python); for `.json` objects the parsed `json`.
pub async fn boto3_dump(endpoint: &str, bucket: &str) -> serde_json::Map<String, Value> {
    match boto3(endpoint, bucket, &["dump"]).await {
        Value::Object(map) => map,
        other => panic!("boto3 dump printed {other}"),
    }
}

/// Which archive backend a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// moto behind the fault proxy.
    S3,
    /// A temporary local directory.
    Dir,
}

/// An archive store of one test: a moto server (behind the fault proxy) with a bucket of the
/// test's own, or a temporary directory. The `keys`, `dump`, `read` and `put_raw` helpers go
/// around our client (boto3, or plain file calls in Python).
pub struct ArchiveStore {
    /// The backend.
    pub backend: Backend,
    /// The test's bucket (for a directory: the bucket directory's name).
    pub bucket: String,
    s3: Option<S3Server>,
    dir: Option<tempfile::TempDir>,
}

impl ArchiveStore {
    /// Starts moto or makes a temporary directory; `tag` names the bucket.
    pub async fn start(backend: Backend, tag: &str) -> ArchiveStore {
        let bucket = unique_bucket(tag);
        let (s3, dir) = match backend {
            Backend::S3 => (Some(S3Server::start().await), None),
            Backend::Dir => (None, Some(tempfile::tempdir().expect("temp dir"))),
        };
        ArchiveStore {
            backend,
            bucket,
            s3,
            dir,
        }
    }

    /// The S3 server, for S3-only cases (fault modes).
    pub fn s3(&self) -> Option<&S3Server> {
        self.s3.as_ref()
    }

    /// The directory holding the bucket directory (directory backend only).
    pub fn root(&self) -> Option<&std::path::Path> {
        self.dir.as_ref().map(|d| d.path())
    }

    /// A configuration of the test's bucket: created when missing, a 3 s timeout, no prefix.
    pub fn config(&self) -> spindle::archive::ArchiveConfig {
        self.config_of(&self.bucket, "")
    }

    /// A configuration of `bucket` with key prefix `prefix` (created when missing).
    pub fn config_of(&self, bucket: &str, prefix: &str) -> spindle::archive::ArchiveConfig {
        match (&self.s3, &self.dir) {
            (Some(s3), _) => {
                let mut config = s3.config(bucket);
                config.prefix = prefix.to_owned();
                config.into()
            }
            (None, Some(dir)) => {
                let mut config = spindle::archive::DirConfig::new(dir.path());
                config.bucket = bucket.to_owned();
                config.prefix = prefix.to_owned();
                config.timeout = Duration::from_secs(3);
                config.into()
            }
            (None, None) => unreachable!("a store is S3 or a directory"),
        }
    }

    /// Where the independent helpers read: moto itself (not the proxy), or `file://root`.
    pub fn independent_endpoint(&self) -> String {
        match (&self.s3, &self.dir) {
            (Some(s3), _) => s3.moto_endpoint(),
            (None, Some(dir)) => dir_endpoint(dir.path()),
            (None, None) => unreachable!("a store is S3 or a directory"),
        }
    }

    /// Every key of the bucket (for a directory: every file, temp files included), sorted.
    pub async fn keys(&self) -> Vec<String> {
        let mut keys = boto3_keys(&self.independent_endpoint(), &self.bucket).await;
        keys.sort();
        keys
    }

    /// [`boto3_dump`] of the bucket.
    pub async fn dump(&self) -> serde_json::Map<String, Value> {
        boto3_dump(&self.independent_endpoint(), &self.bucket).await
    }

    /// [`boto3_read`] of one object.
    pub async fn read(&self, key: &str) -> Vec<u8> {
        boto3_read(&self.independent_endpoint(), &self.bucket, key).await
    }

    /// Stores an object around our client.
    pub async fn put_raw(&self, key: &str, body: &[u8]) {
        boto3_put(&self.independent_endpoint(), &self.bucket, key, body).await
    }

    /// The `spindle` options naming this archive (bucket, no prefix).
    pub fn cli_args(&self) -> Vec<String> {
        let mut args = vec![
            "--s3-bucket".to_owned(),
            self.bucket.clone(),
            "--s3-prefix=".to_owned(),
        ];
        match (&self.s3, &self.dir) {
            (Some(s3), _) => args.extend(
                [
                    "--s3-endpoint",
                    &s3.endpoint(),
                    "--s3-path-style",
                    "--s3-access-key-id",
                    "test",
                    "--s3-secret-access-key",
                    "test",
                ]
                .map(str::to_owned),
            ),
            (None, Some(dir)) => {
                args.push("--archive-dir".to_owned());
                args.push(dir.path().display().to_string());
            }
            (None, None) => unreachable!("a store is S3 or a directory"),
        }
        args
    }
}
