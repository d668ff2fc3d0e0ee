//! `spindle jobs`: jobs over the RPC API of a Director or a router — one job and its trace
//! (`show`), or pages of them by filter (`list`).

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use crate::rpc::api::{JobFilter, ListOrder, MAX_LISTED_PER_PAGE};
use crate::secret::Secret;
use spindle_client::JobState;

/// `spindle jobs` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Print a job and its full trace: every state it entered, when, after how many attempts,
    /// and why (status, error type, the start of the failed answer, operator commands).
    Show {
        /// The job id: a ULID, or 32 hex digits as SQL's `HEX(id)` prints it.
        id: String,
        /// Where and as whom.
        #[command(flatten)]
        api: ApiArgs,
        /// Print the API's JSON answer as it is.
        #[arg(long)]
        json: bool,
    },
    /// List jobs, newest first (`--oldest` for oldest first), by bucket, endpoint, state,
    /// ordering key and creation time; through a router, every live JobDB's.
    List(Box<ListArgs>),
}

/// The API `spindle jobs` reads.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The RPC API of a Director or a router.
    #[arg(
        long,
        env = "SPINDLE_API",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    api: String,
    /// An API token (read scope for the jobs' buckets, or admin).
    #[arg(long, env = "SPINDLE_TOKEN", hide_env_values = true)]
    token: Option<Secret>,
}

/// `spindle jobs list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Where and as whom.
    #[command(flatten)]
    api: ApiArgs,
    /// Only this bucket's jobs.
    #[arg(long)]
    bucket: Option<String>,
    /// Only jobs sent to this URL (exactly as submitted).
    #[arg(long)]
    endpoint: Option<String>,
    /// Only jobs in this state now (awaiting-scheduling, executing, awaiting-retry,
    /// succeeded, discarded, archiving, archived, moved).
    #[arg(long)]
    state: Option<JobState>,
    /// Only jobs of this ordering key.
    #[arg(long)]
    ordering_key: Option<String>,
    /// Only jobs created at or after this time (RFC 3339).
    #[arg(long)]
    created_after: Option<DateTime<Utc>>,
    /// Only jobs created before this time (RFC 3339).
    #[arg(long)]
    created_before: Option<DateTime<Utc>>,
    /// Oldest first.
    #[arg(long)]
    oldest: bool,
    /// At most this many jobs in all.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Go on after this job (the `next after` a previous listing printed).
    #[arg(long)]
    after: Option<String>,
    /// Print each job as a JSON line (as the API describes it, trace included).
    #[arg(long)]
    json: bool,
}

/// `spindle jobs ...`: reads jobs over the RPC API.
pub(super) async fn jobs(command: JobsCommand) -> anyhow::Result<()> {
    match command {
        JobsCommand::Show { id, api, json } => {
            show(&id, &api.api, api.token.as_ref().map(Secret::expose), json).await
        }
        JobsCommand::List(args) => list(*args).await,
    }
}

/// `spindle jobs list`: pages until `--limit` jobs are printed or none is left; prints where
/// to go on when more may follow.
async fn list(args: ListArgs) -> anyhow::Result<()> {
    let api = &args.api.api;
    let client = spindle_client::Client::builder(api)
        .token(args.api.token.as_ref().map(|t| t.expose().to_owned()))
        .build()
        .with_context(|| format!("--api {api}"))?;
    let filter = JobFilter {
        bucket: args.bucket,
        endpoint: args.endpoint,
        state: args.state,
        ordering_key: args.ordering_key,
        created_after: args.created_after,
        created_before: args.created_before,
        order: if args.oldest {
            ListOrder::Oldest
        } else {
            ListOrder::Newest
        },
    };
    let mut after = args.after;
    let mut printed = 0;
    if !args.json {
        println!(
            "{:<26} {:<19} {:>3}  {:<24} {:<16} endpoint",
            "job", "state", "n", "created", "bucket"
        );
    }
    while printed < args.limit {
        let page_size = (args.limit - printed).min(MAX_LISTED_PER_PAGE);
        let page = client
            .jobs_page(&filter, after.as_deref(), page_size)
            .await
            .with_context(|| format!("listing jobs at {api}"))?;
        for job in &page.jobs {
            if args.json {
                println!("{}", serde_json::to_string(job)?);
            } else {
                println!(
                    "{:<26} {:<19} {:>3}  {:<24} {:<16} {} {}",
                    job.id,
                    job.state.as_str(),
                    job.attempts,
                    job.created_at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                    job.bucket,
                    job.method,
                    job.endpoint,
                );
            }
        }
        printed += page.jobs.len();
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
    if let Some(next) = after {
        eprintln!("more may follow: --after {next}");
    }
    Ok(())
}

/// The body of a GET of `path` from the RPC API at `api`, with the bearer `token`; an error
/// names the API and the status when the answer is not a success.
pub(super) async fn api_get(api: &str, path: &str, token: Option<&str>) -> anyhow::Result<String> {
    let mut request = reqwest::Client::new().get(format!("{}{path}", api.trim_end_matches('/')));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("--api {api}"))?;
    let status = response.status();
    let body = response.text().await?;
    anyhow::ensure!(status.is_success(), "{api}: {status}: {body}");
    Ok(body)
}

/// `spindle jobs show`: reads the job over the RPC API and prints it.
async fn show(id: &str, api: &str, token: Option<&str>, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()),
        "the job id must be a ULID or 32 hex digits"
    );
    let body = api_get(api, &format!("/v1/jobs/{id}"), token).await?;
    if json {
        println!("{body}");
        return Ok(());
    }
    let view: crate::rpc::api::JobView = serde_json::from_str(&body).context("the api's answer")?;
    let job = &view.job;
    println!("job       {} (hex {})", job.id, job.id_hex);
    println!("state     {} after {} attempt(s)", job.state, job.attempts);
    println!("bucket    {}", job.bucket);
    println!("endpoint  {} {}", job.method, job.endpoint);
    println!("created   {}   expires {}", job.created_at, job.expire_at);
    if let Some(key) = &job.idempotency_key {
        println!("key       {key}");
    }
    if let Some(key) = &job.ordering_key {
        println!("ordered   {key}");
    }
    if let Some(to) = &job.on_complete {
        println!("notice to {to}");
    }
    println!();
    println!(
        "{:<28} {:<20} {:>3} {:>6} {:>7}  {:<18} detail",
        "time", "state", "n", "status", "ms", "error type"
    );
    for t in &job.transitions {
        let detail = match (&t.retry_at, &t.error_response) {
            (Some(at), Some(text)) => format!(
                "retry at {at}; {}",
                text.chars().take(80).collect::<String>()
            ),
            (Some(at), None) => format!("retry at {at}"),
            (None, Some(text)) => text.chars().take(100).collect(),
            (None, None) => String::new(),
        };
        println!(
            "{:<28} {:<20} {:>3} {:>6} {:>7}  {:<18} {}",
            t.time.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            t.state.to_string(),
            t.attempts,
            t.response_status.map_or("-".to_owned(), |s| s.to_string()),
            t.duration_ms.map_or("-".to_owned(), |d| d.to_string()),
            t.error_type.as_deref().unwrap_or("-"),
            detail.replace('\n', " "),
        );
    }
    Ok(())
}
