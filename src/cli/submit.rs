//! `spindle submit`: jobs to a Director or a router from the command line, through the
//! `spindle-client` crate.
//!
//! One job from options (`--bucket`, `--endpoint`, `--payload`, ...), or many as NDJSON from a
//! file (`--file`) or stdin: one job object per line, exactly as `POST /v1/jobs` takes it.
//! Every line is parsed and checked as intake would before anything is sent, so a malformed
//! file submits nothing; then the jobs go in batches (`--batch`, each stored atomically), and
//! each job's id and status is printed as one NDJSON line (or a summary with `--quiet`).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::value::RawValue;
use spindle_client::{AcceptedJob, Client, JobStatus, NewJob};

use crate::rpc::api::{check_job, FieldError, IntakeLimits, MAX_JOBS_PER_REQUEST};

/// Examples shown by `spindle submit --help`.
const EXAMPLES: &str = "\
Examples:
  spindle submit --bucket tenant-1 --endpoint https://example.test/hook \\
      --payload '{\"hello\":\"world\"}' -H 'x-source: cli' --idempotency-key order-1234
  spindle submit --file jobs.ndjson --batch 500 --url http://router:8070
  producer | spindle submit --quiet            # NDJSON on stdin (or --file -)

A line of jobs.ndjson:
  {\"bucket\":\"tenant-1\",\"endpoint\":\"https://example.test/hook\",\"payload\":{\"n\":1}}

Output: one line per job, {\"line\":N,\"id\":\"...\",\"status\":\"accepted\"}; through a
router also \"duplicate\" (id of the original), \"pending\" or \"failed\" (with \"error\";
submit those again with the same idempotency key). The exit status is non-zero if the input
is invalid (nothing is sent), a request fails, or any job was not stored.";

/// Options of `spindle submit`.
#[derive(Debug, Args)]
#[command(after_long_help = EXAMPLES)]
pub struct SubmitArgs {
    /// The RPC API: a Director (`spindle director`) or a router (`spindle router`).
    #[arg(
        long,
        env = "SPINDLE_API",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// An API token (bucket scope for the jobs' buckets, or admin), when the API has
    /// `--tokens`.
    #[arg(long, env = "SPINDLE_TOKEN", hide_env_values = true)]
    pub token: Option<crate::secret::Secret>,
    /// Read jobs from this NDJSON file (`-`: stdin): one JSON object per line in the
    /// `POST /v1/jobs` job schema; blank lines are skipped. Without it and without `--bucket`,
    /// jobs are read from stdin when it is not a terminal.
    #[arg(long, short = 'f', value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// The job's bucket: its tenant, or source–destination pair.
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub bucket: Option<String>,
    /// The http or https URL to deliver to.
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub endpoint: Option<String>,
    /// The body, as JSON text (sent as application/json).
    #[arg(
        long,
        value_name = "JSON",
        conflicts_with = "file",
        help_heading = "One job"
    )]
    pub payload: Option<String>,
    /// The body, as base64 bytes (sent as application/octet-stream).
    #[arg(
        long,
        value_name = "BASE64",
        conflicts_with_all = ["file", "payload"],
        help_heading = "One job"
    )]
    pub payload_base64: Option<String>,
    /// HTTP method: POST (default), PUT, PATCH, DELETE or GET.
    #[arg(long, short = 'X', conflicts_with = "file", help_heading = "One job")]
    pub method: Option<String>,
    /// A request header, `name: value` (repeatable).
    #[arg(
        long = "header",
        short = 'H',
        value_name = "NAME: VALUE",
        conflicts_with = "file",
        help_heading = "One job"
    )]
    pub headers: Vec<String>,
    /// The producer's idempotency key: a router answers a second submission of the same
    /// bucket and key within its dedup window `duplicate`.
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub idempotency_key: Option<String>,
    /// Deadline of one attempt in ms (10 to 300 000; the server's default: 10 000).
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub execution_timeout_ms: Option<u64>,
    /// Delay before the second attempt in ms (default 1 000).
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub backoff_min_delay_ms: Option<u64>,
    /// Growth of the delay per attempt (1.0 to 10.0, default 2.0).
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub backoff_coefficient: Option<f64>,
    /// Time to live in ms (default: the server's, 4 h).
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub ttl_ms: Option<u64>,
    /// When to stop retrying (RFC 3339, e.g. 2026-11-21T10:00:00Z), instead of `--ttl-ms`.
    #[arg(
        long,
        conflicts_with_all = ["file", "ttl_ms"],
        help_heading = "One job"
    )]
    pub expire_at: Option<DateTime<Utc>>,
    /// Deliver first at this time, not before (RFC 3339); the job waits in the JobDB until
    /// then and its time to live counts from then.
    #[arg(
        long,
        conflicts_with_all = ["file", "delay_ms"],
        help_heading = "One job"
    )]
    pub deliver_at: Option<DateTime<Utc>>,
    /// Deliver first this many ms after acceptance, instead of `--deliver-at`.
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub delay_ms: Option<u64>,
    /// Tell this URL when the job ends: a JSON notice of how it ended, delivered as a job of
    /// its own.
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub on_complete: Option<String>,
    /// Deliver in order with the other jobs of its bucket and endpoint that carry this key:
    /// one at a time, each after the previous ended.
    #[arg(long, conflicts_with = "file", help_heading = "One job")]
    pub ordering_key: Option<String>,
    /// With `--ordering-key`: whether this job ending without success blocks its key's later
    /// jobs (`block`) or lets the next go (`release`, the default).
    #[arg(long, conflicts_with = "file", requires = "ordering_key", value_parser = ["release", "block"], help_heading = "One job")]
    pub ordering_failure: Option<String>,
    /// Jobs per request (1 to 1000; fewer when their lines pass 16 MiB); each request is stored
    /// atomically.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u16).range(1..=MAX_JOBS_PER_REQUEST as i64))]
    pub batch: u16,
    /// Deadline of one request in ms (through a router: above its pending wait plus forward
    /// timeout).
    #[arg(long, default_value_t = 60_000)]
    pub timeout_ms: u64,
    /// Print one summary line instead of a line per job.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Most bytes of jobs in one request (as their input lines count them): half the Director's
/// default `--max-request-bytes`, so batches of large payloads are split before a 413.
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;

/// One job to send, with the input line it came from (none for a job from options) and the
/// size of its JSON.
struct Input {
    line: Option<usize>,
    bytes: usize,
    job: NewJob,
}

/// `inputs` cut into batches of at most `max_jobs` jobs and (unless one job alone is larger)
/// [`MAX_BATCH_BYTES`].
fn batches(inputs: &[Input], max_jobs: usize) -> Vec<&[Input]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, input) in inputs.iter().enumerate() {
        let full = i - start >= max_jobs || bytes + input.bytes > MAX_BATCH_BYTES;
        if full && i > start {
            out.push(&inputs[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += input.bytes;
    }
    if start < inputs.len() {
        out.push(&inputs[start..]);
    }
    out
}

/// Counts of what became of the jobs.
#[derive(Default)]
struct Tally {
    requests: usize,
    by_status: BTreeMap<&'static str, usize>,
    not_stored: usize,
}

/// Runs `spindle submit`.
pub async fn run(args: SubmitArgs) -> anyhow::Result<()> {
    let inputs = read_inputs(&args).await?;
    let client = Client::builder(&args.url)
        .token(args.token.as_ref().map(|t| t.expose().to_owned()))
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()
        .context("--url / --token")?;
    // Not locked: the future stays `Send` (spindle dev runs commands on a multi-thread runtime).
    let mut out = std::io::stdout();
    let mut tally = Tally::default();
    let mut sent = 0;
    for batch in batches(&inputs, usize::from(args.batch)) {
        let jobs: Vec<NewJob> = batch.iter().map(|input| input.job.clone()).collect();
        let reply = match client.submit(&jobs).await {
            Ok(reply) => reply,
            Err(e) => return Err(batch_failed(&e, batch, sent)),
        };
        tally.requests += 1;
        sent += batch.len();
        for (input, answer) in batch.iter().zip(&reply.jobs) {
            *tally.by_status.entry(answer.status.as_str()).or_default() += 1;
            if !answer.status.is_stored() {
                tally.not_stored += 1;
            }
            if !args.quiet {
                writeln!(out, "{}", result_line(input.line, answer)?)?;
            }
        }
        anyhow::ensure!(
            reply.jobs.len() == batch.len(),
            "the api answered {} jobs for a batch of {}",
            reply.jobs.len(),
            batch.len()
        );
    }
    if args.quiet {
        let statuses: Vec<String> = [
            JobStatus::Accepted,
            JobStatus::Duplicate,
            JobStatus::Pending,
            JobStatus::Failed,
        ]
        .iter()
        .map(|s| {
            let n = tally.by_status.get(s.as_str()).copied().unwrap_or(0);
            format!("{n} {s}")
        })
        .collect();
        writeln!(
            out,
            "submitted {sent} jobs in {} requests to {}: {}",
            tally.requests,
            args.url,
            statuses.join(", ")
        )?;
    }
    out.flush()?;
    anyhow::ensure!(
        tally.not_stored == 0,
        "{} of {sent} jobs were not stored (pending or failed): submit them again, with the \
         same idempotency keys",
        tally.not_stored
    );
    Ok(())
}

/// The jobs to send: from options, or every line of the NDJSON input, each parsed and checked.
async fn read_inputs(args: &SubmitArgs) -> anyhow::Result<Vec<Input>> {
    let one_job = args.bucket.is_some()
        || args.endpoint.is_some()
        || args.payload.is_some()
        || args.payload_base64.is_some();
    let text = match &args.file {
        Some(path) if path.as_os_str() == "-" => read_stdin().await?,
        Some(path) => tokio::fs::read(path)
            .await
            .with_context(|| format!("reading {}", path.display()))?,
        None if one_job => {
            return Ok(vec![Input {
                line: None,
                bytes: 0,
                job: job_from_options(args)?,
            }])
        }
        None if !std::io::stdin().is_terminal() => read_stdin().await?,
        None => anyhow::bail!(
            "no jobs: give --bucket and --endpoint (one job), --file PATH, or NDJSON on stdin \
             (see --help)"
        ),
    };
    let inputs = parse_ndjson(&text).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(!inputs.is_empty(), "no jobs in the input");
    Ok(inputs)
}

async fn read_stdin() -> anyhow::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut text = Vec::new();
    tokio::io::stdin()
        .read_to_end(&mut text)
        .await
        .context("reading stdin")?;
    Ok(text)
}

/// Limits that do not depend on a server's settings: the payload and request sizes a server
/// may raise are left to it.
fn local_limits() -> IntakeLimits {
    IntakeLimits {
        max_jobs_per_request: usize::MAX,
        max_request_bytes: usize::MAX,
        max_payload_bytes: usize::MAX,
        ..IntakeLimits::default()
    }
}

/// Every job of an NDJSON text, or the first error naming its line (and field).
fn parse_ndjson(text: &[u8]) -> Result<Vec<Input>, String> {
    let limits = local_limits();
    let now = Utc::now();
    let mut inputs = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line = std::str::from_utf8(line)
            .map_err(|e| format!("line {n}: not UTF-8 (byte {})", e.valid_up_to() + 1))?;
        let job = parse_job(line).map_err(|e| format!("line {n}{e}"))?;
        check_job(job.clone(), &limits, now).map_err(|e| format!("line {n}{}", field_error(&e)))?;
        inputs.push(Input {
            line: Some(n),
            bytes: line.len(),
            job,
        });
    }
    Ok(inputs)
}

/// One line as a job; the error continues `line N`: `, field headers.x-a: invalid type...`.
fn parse_job(line: &str) -> Result<NewJob, String> {
    let mut de = serde_json::Deserializer::from_str(line);
    let job: NewJob = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = json_message(&inner);
        match inner.classify() {
            serde_json::error::Category::Data if path != "." => {
                format!(", field {path}: {message}")
            }
            serde_json::error::Category::Data => format!(": {message}"),
            _ => format!(", column {}: invalid JSON: {message}", inner.column()),
        }
    })?;
    de.end().map_err(|e| {
        format!(
            ", column {}: invalid JSON: {} (one job object per line)",
            e.column(),
            json_message(&e)
        )
    })?;
    Ok(job)
}

/// A serde_json error without its position (which is within the line, not the file).
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&position).unwrap_or(&text).to_owned()
}

/// `, field endpoint: is not a valid URL`.
fn field_error(e: &FieldError) -> String {
    format!(", field {}: {}", e.field, e.message)
}

/// The one job the options describe, checked.
fn job_from_options(args: &SubmitArgs) -> anyhow::Result<NewJob> {
    let (Some(bucket), Some(endpoint)) = (&args.bucket, &args.endpoint) else {
        anyhow::bail!("one job needs both --bucket and --endpoint");
    };
    let payload = args
        .payload
        .as_deref()
        .map(|text| RawValue::from_string(text.trim().to_owned()))
        .transpose()
        .context("--payload is not JSON")?;
    let mut headers = BTreeMap::new();
    for header in &args.headers {
        let (name, value) = header
            .split_once(':')
            .with_context(|| format!("-H {header:?}: expected 'name: value'"))?;
        headers.insert(name.trim().to_owned(), value.trim().to_owned());
    }
    let job = NewJob {
        method: args.method.clone(),
        headers: (!headers.is_empty()).then_some(headers),
        payload,
        payload_base64: args.payload_base64.clone(),
        execution_timeout_ms: args.execution_timeout_ms,
        backoff_min_delay_ms: args.backoff_min_delay_ms,
        backoff_coefficient: args.backoff_coefficient,
        expire_at: args.expire_at,
        ttl_ms: args.ttl_ms,
        deliver_at: args.deliver_at,
        delay_ms: args.delay_ms,
        idempotency_key: args.idempotency_key.clone(),
        on_complete: args.on_complete.clone(),
        ordering_key: args.ordering_key.clone(),
        ordering_failure: args.ordering_failure.as_deref().map(|f| match f {
            "block" => spindle_client::OrderingFailure::Block,
            _ => spindle_client::OrderingFailure::Release,
        }),
        ..NewJob::new(bucket, endpoint)
    };
    check_job(job.clone(), &local_limits(), Utc::now())
        .map_err(|e| anyhow::anyhow!("invalid job{}", field_error(&e)))?;
    Ok(job)
}

/// The output line of one job: its input line, id and status (and why, if not stored).
fn result_line(line: Option<usize>, answer: &AcceptedJob) -> serde_json::Result<String> {
    let mut out = serde_json::Map::new();
    if let Some(line) = line {
        out.insert("line".into(), line.into());
    }
    out.insert("id".into(), answer.id.clone().into());
    out.insert("status".into(), answer.status.as_str().into());
    if let Some(error) = &answer.error {
        out.insert("error".into(), error.clone().into());
    }
    serde_json::to_string(&out)
}

/// The error of a batch the API did not take, naming the input line of a refused field and
/// what was sent before it.
fn batch_failed(e: &spindle_client::Error, batch: &[Input], sent_before: usize) -> anyhow::Error {
    let lines = match (
        batch.first().and_then(|i| i.line),
        batch.last().and_then(|i| i.line),
    ) {
        (Some(first), Some(last)) => format!(" (lines {first}-{last})"),
        _ => String::new(),
    };
    // `jobs[3].endpoint` names the 4th job of the batch: say which input line that is.
    let at_line = e
        .api()
        .and_then(|a| a.field.as_deref())
        .and_then(|f| f.strip_prefix("jobs["))
        .and_then(|f| f.split_once(']'))
        .and_then(|(i, _)| i.parse::<usize>().ok())
        .and_then(|i| batch.get(i)?.line)
        .map(|n| format!("; the field is on line {n}"))
        .unwrap_or_default();
    let outcome = if e.stored_nothing() {
        "nothing of it was stored"
    } else {
        "it may or may not have been stored; sending it again is safe for jobs with idempotency \
         keys through a router"
    };
    anyhow::anyhow!(
        "a batch of {} jobs{lines} failed: {e}{at_line}. {outcome}; {sent_before} jobs before it \
         were submitted",
        batch.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        match parse_ndjson(text.as_bytes()) {
            Ok(_) => panic!("{text:?} parsed"),
            Err(e) => e,
        }
    }

    #[test]
    fn good_lines_parse_with_their_numbers() {
        let text = "{\"bucket\":\"b\",\"endpoint\":\"http://x/1\"}\r\n\n  \n{\"bucket\":\"b\",\"endpoint\":\"http://x/2\",\"payload\":{\"a\":[1]}}";
        let inputs = parse_ndjson(text.as_bytes()).unwrap();
        let lines: Vec<_> = inputs.iter().map(|i| i.line).collect();
        assert_eq!(lines, vec![Some(1), Some(4)]);
        assert_eq!(inputs[1].job.payload.as_ref().unwrap().get(), "{\"a\":[1]}");
    }

    #[test]
    fn batches_are_bounded_by_jobs_and_bytes() {
        let input = |bytes| Input {
            line: None,
            bytes,
            job: NewJob::new("b", "http://x/"),
        };
        let sizes = |inputs: &[Input], max| -> Vec<usize> {
            batches(inputs, max).iter().map(|b| b.len()).collect()
        };
        let small: Vec<Input> = (0..5).map(|_| input(10)).collect();
        assert_eq!(sizes(&small, 2), vec![2, 2, 1]);
        assert_eq!(sizes(&small, 500), vec![5]);
        let big = MAX_BATCH_BYTES / 2;
        let large: Vec<Input> = [big, big, 1, MAX_BATCH_BYTES * 2, 1]
            .into_iter()
            .map(input)
            .collect();
        assert_eq!(sizes(&large, 500), vec![2, 1, 1, 1]);
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let ok = "{\"bucket\":\"b\",\"endpoint\":\"http://x/\"}\n";
        let e = error_of(&format!("{ok}{ok}{{\"bucket\":\"b\",\n"));
        assert!(e.starts_with("line 3, column "), "{e}");
        let e = error_of(&format!("{ok}{{\"bucket\":\"b\"}}\n"));
        assert!(e.starts_with("line 2") && e.contains("`endpoint`"), "{e}");
        let e = error_of(&format!(
            "{ok}{{\"bucket\":\"b\",\"endpoint\":\"http://x\",\"ttl_ms\":\"1\"}}"
        ));
        assert!(e.starts_with("line 2, field ttl_ms:"), "{e}");
        let e = error_of("{\"bucket\":\"b\",\"endpoint\":\"ftp://x\"}");
        assert_eq!(e, "line 1, field endpoint: scheme must be http or https");
        let e = error_of("{\"bucket\":\"b\",\"endpoint\":\"http://x\",\"max_attempts\":3}");
        assert!(e.starts_with("line 1") && e.contains("max_attempts"), "{e}");
        let e = error_of(&format!("{} {}", ok.trim(), ok.trim()));
        assert!(
            e.starts_with("line 1, column") && e.contains("one job object per line"),
            "{e}"
        );
    }
}
