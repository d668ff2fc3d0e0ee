//! `spindle subscriptions add|list|show|disable|enable|rm` and `spindle publish`: events and
//! subscriptions over the RPC API of a Director or a router, through the `spindle-client`
//! crate.

use anyhow::Context;
use clap::{Args, Subcommand};
use spindle_client::{
    Client, NewEvent, NewSubscription, OrderingFailure, PayloadFilter, SubscriptionPatch,
    SubscriptionView,
};

use std::sync::Arc;

use crate::events::Subscriptions;
use crate::rpc::api::IntakeLimits;
use crate::secret::{Secret, SecretUrl};

/// Where the API is, and the token to use.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// The RPC API of a Director or a router.
    #[arg(
        long,
        env = "SPINDLE_API",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    pub api: String,
    /// An API token (of the subscription's bucket, or admin).
    #[arg(long, env = "SPINDLE_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
}

impl ApiArgs {
    fn client(&self) -> anyhow::Result<Client> {
        Client::new(
            &self.api,
            self.token.as_ref().map(|t| t.expose().to_owned()),
        )
        .with_context(|| format!("--api {}", self.api))
    }
}

/// The control database of a Director or a router.
#[derive(Debug, Clone, Args)]
pub struct ControlArgs {
    /// The control database that keeps subscriptions (`mysql://user@host/spindle_control`,
    /// created when missing; a password comes from the URL): turns on `/v1/events` and
    /// `/v1/subscriptions`. Without it both answer 503.
    #[arg(long, env = "SPINDLE_CONTROL_DB", hide_env_values = true)]
    pub control_db: Option<SecretUrl>,
}

impl ControlArgs {
    /// Opens the control database (migrating it) and loads its subscriptions, when one is
    /// given; jobs they make must pass `intake`.
    pub async fn subscriptions(
        &self,
        intake: IntakeLimits,
    ) -> anyhow::Result<Option<Arc<Subscriptions>>> {
        let Some(url) = &self.control_db else {
            return Ok(None);
        };
        let url = url.expose().parse().context("--control-db")?;
        let db = crate::events::ControlDb::open(&url)
            .await
            .context("opening the control database (--control-db)")?;
        let subscriptions = Subscriptions::load(db, intake)
            .await
            .context("reading subscriptions")?;
        Ok(Some(subscriptions))
    }
}

/// `spindle subscriptions` subcommands.
#[derive(Debug, Subcommand)]
pub enum SubscriptionsCommand {
    /// Subscribe a URL to event types of a bucket; prints the subscription and its signing
    /// secret (shown this once).
    Add(Box<AddArgs>),
    /// List subscriptions (of one bucket with --bucket).
    List {
        /// Only this bucket's.
        #[arg(long)]
        bucket: Option<String>,
        /// The API.
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Show one subscription as JSON.
    Show {
        /// Its id.
        id: String,
        /// The API.
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Disable a subscription: its events' jobs wait (until enabled again, or expiry).
    Disable {
        /// Its id.
        id: String,
        /// The API.
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Enable a subscription again: what waited is delivered.
    Enable {
        /// Its id.
        id: String,
        /// The API.
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Deliver a bucket's past events to a subscription added after them, read from a JobDB
    /// or the archive, through a Director (events it already has a job for are skipped).
    Backfill(Box<BackfillArgs>),
    /// Remove a subscription: no new event reaches it (jobs already made go on).
    Rm {
        /// Its id.
        id: String,
        /// The API.
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// `spindle subscriptions add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The bucket (tenant) whose events it gets.
    #[arg(long)]
    pub bucket: String,
    /// Where events go.
    #[arg(long)]
    pub url: String,
    /// An event type it wants (repeat it): `invoice.paid`, `invoice.*` or `*`.
    #[arg(long = "event-type", required = true)]
    pub event_types: Vec<String>,
    /// Only events whose payload has this JSON value at this pointer: `/tier=\"gold\"`.
    #[arg(long)]
    pub filter: Option<String>,
    /// An extra request header, `name: value` (repeat it).
    #[arg(long = "header", short = 'H')]
    pub headers: Vec<String>,
    /// Its signing secret (`whsec_...`); one is made when absent.
    #[arg(long, env = "SPINDLE_SUBSCRIPTION_SECRET", hide_env_values = true)]
    pub secret: Option<Secret>,
    /// A JSON pointer into the payload: events with the same value there arrive in order.
    #[arg(long)]
    pub ordering_key: Option<String>,
    /// With --ordering-key: a failure for good holds the key's later events.
    #[arg(long, requires = "ordering_key")]
    pub block_on_failure: bool,
    /// Make it disabled.
    #[arg(long)]
    pub disabled: bool,
    /// Free text for operators.
    #[arg(long)]
    pub description: Option<String>,
    /// Most requests to the URL in flight at once, per Director.
    #[arg(long)]
    pub max_concurrency: Option<u32>,
    /// Most requests to the URL started per second, per Director.
    #[arg(long)]
    pub max_per_second: Option<f64>,
    /// The API.
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `spindle publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The bucket (tenant).
    #[arg(long, required_unless_present = "ndjson")]
    pub bucket: Option<String>,
    /// The event type.
    #[arg(long = "type", required_unless_present = "ndjson")]
    pub event_type: Option<String>,
    /// The payload, JSON.
    #[arg(long, default_value = "{}")]
    pub payload: String,
    /// An idempotency key (a router drops a repeat).
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Publish the events of this file instead (`-`: standard input): one event per line, as
    /// `POST /v1/events` takes one, sent to a Director in batches of `--batch` (each batch's
    /// jobs committed together). Prints each event's answer, a line each, in order.
    #[arg(long, conflicts_with_all = ["bucket", "event_type", "idempotency_key"])]
    pub ndjson: Option<std::path::PathBuf>,
    /// With `--ndjson`: events per request (1 to 1000).
    #[arg(long, default_value_t = 1000, requires = "ndjson",
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub batch: u16,
    /// The API.
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Options of `spindle subscriptions backfill`.
#[derive(Debug, Clone, Args)]
pub struct BackfillArgs {
    /// The subscription's id.
    pub id: String,
    /// Only events published at or after this time (RFC 3339, e.g. 2026-11-21T10:00:00Z).
    #[arg(long)]
    pub since: chrono::DateTime<chrono::Utc>,
    /// Where the events are read.
    #[command(flatten)]
    pub source: super::ops::SourceArgs,
    /// The RPC API: a router (one job per event through any router, within its dedup window)
    /// or a Director (one per event in its JobDB).
    #[command(flatten)]
    pub api: ApiArgs,
    /// At most this many events.
    #[arg(long, default_value_t = 100_000)]
    pub limit: usize,
    /// Count what would be sent; send nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `spindle subscriptions ...`.
pub(super) async fn run(command: SubscriptionsCommand) -> anyhow::Result<()> {
    match command {
        SubscriptionsCommand::Add(args) => {
            let given = new_subscription(&args)?;
            let view = args.api.client()?.add_subscription(&given).await?;
            println!("{}", serde_json::to_string_pretty(&view)?);
        }
        SubscriptionsCommand::List { bucket, api } => {
            let list = api.client()?.subscriptions(bucket.as_deref()).await?;
            println!(
                "{:<26} {:<16} {:<8} {:<28} url",
                "id", "bucket", "state", "event types"
            );
            for s in &list.subscriptions {
                print_line(s);
            }
        }
        SubscriptionsCommand::Show { id, api } => {
            let view = api.client()?.subscription(&id).await?;
            println!("{}", serde_json::to_string_pretty(&view)?);
        }
        SubscriptionsCommand::Disable { id, api } => set_enabled(&api, &id, false).await?,
        SubscriptionsCommand::Enable { id, api } => set_enabled(&api, &id, true).await?,
        SubscriptionsCommand::Backfill(args) => {
            let view = args.api.client()?.subscription(&args.id).await?;
            let options = crate::cli::backfill::BackfillOptions {
                subscription: view.id.parse().context("the subscription's id")?,
                bucket: view.bucket,
                since: args.since,
                to: args.api.api.clone(),
                token: args.api.token.as_ref().map(|t| t.expose().to_owned()),
                dry_run: args.dry_run,
                limit: args.limit,
            };
            let mut report = crate::cli::backfill::BackfillReport::default();
            for source in &args.source.open().await? {
                let Some(limit) = args.limit.checked_sub(report.selected).filter(|n| *n > 0) else {
                    break;
                };
                let options = crate::cli::backfill::BackfillOptions {
                    limit,
                    ..options.clone()
                };
                let read = crate::cli::backfill::backfill(source, &options).await?;
                report.selected += read.selected;
                report.delivered += read.delivered;
                report.skipped += read.skipped;
                report.unreadable += read.unreadable;
            }
            println!(
                "selected {}, delivered {}, skipped {}, unreadable {}{}",
                report.selected,
                report.delivered,
                report.skipped,
                report.unreadable,
                if args.dry_run { " (dry run)" } else { "" }
            );
        }
        SubscriptionsCommand::Rm { id, api } => {
            let view = api.client()?.remove_subscription(&id).await?;
            println!("removed {}", view.id);
        }
    }
    Ok(())
}

/// Runs `spindle publish`: prints the event id and each subscription's job.
pub(super) async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.ndjson {
        return publish_ndjson(&args.api, path, usize::from(args.batch)).await;
    }
    let payload = serde_json::value::RawValue::from_string(args.payload.clone())
        .context("--payload must be JSON")?;
    let event = NewEvent {
        bucket: args.bucket.context("--bucket is required")?,
        event_type: args.event_type.context("--type is required")?,
        payload,
        idempotency_key: args.idempotency_key,
        deliver_at: None,
        on_complete: None,
        traceparent: None,
        tracestate: None,
    };
    let reply = args.api.client()?.publish(&event).await?;
    println!("{}", serde_json::to_string_pretty(&reply)?);
    Ok(())
}

/// `spindle publish --ndjson`: the file's events, a batch at a time. A bad line stops it
/// before its batch is sent (the batches before it stay published).
async fn publish_ndjson(api: &ApiArgs, path: &std::path::Path, batch: usize) -> anyhow::Result<()> {
    use std::io::BufRead;
    let input: Box<dyn BufRead> = match path.to_str() {
        Some("-") => Box::new(std::io::stdin().lock()),
        _ => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
    };
    let client = api.client()?;
    let mut pending: Vec<NewEvent> = Vec::with_capacity(batch);
    let (mut published, mut first_line) = (0usize, 1usize);
    let mut lines = input.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let line = line.with_context(|| format!("reading line {}", i + 1))?;
        if !line.trim().is_empty() {
            let event: NewEvent = serde_json::from_str(&line)
                .with_context(|| format!("line {}: not an event", i + 1))?;
            pending.push(event);
        }
        if pending.len() == batch || (lines.peek().is_none() && !pending.is_empty()) {
            let reply = client.publish_batch(&pending).await.with_context(|| {
                format!(
                    "publishing lines {first_line} to {} ({published} events published before \
                     them)",
                    i + 1
                )
            })?;
            for event in &reply.events {
                println!("{}", serde_json::to_string(event)?);
            }
            published += pending.len();
            pending.clear();
            first_line = i + 2;
        }
    }
    Ok(())
}

async fn set_enabled(api: &ApiArgs, id: &str, enabled: bool) -> anyhow::Result<()> {
    let patch = SubscriptionPatch {
        enabled: Some(enabled),
        ..SubscriptionPatch::default()
    };
    let view = api.client()?.update_subscription(id, &patch).await?;
    print_line(&view);
    Ok(())
}

fn print_line(s: &SubscriptionView) {
    println!(
        "{:<26} {:<16} {:<8} {:<28} {}",
        s.id,
        s.bucket,
        if s.enabled { "enabled" } else { "disabled" },
        s.event_types.join(","),
        s.url
    );
}

/// The request `add` sends: filter and headers parsed from their command-line forms.
fn new_subscription(args: &AddArgs) -> anyhow::Result<NewSubscription> {
    let filter = match &args.filter {
        None => None,
        Some(text) => {
            let (pointer, value) = text
                .split_once('=')
                .context("--filter must be POINTER=JSON, e.g. /tier=\"gold\"")?;
            let equals = serde_json::from_str(value)
                .with_context(|| format!("--filter: {value:?} is not JSON"))?;
            Some(PayloadFilter {
                pointer: pointer.to_owned(),
                equals,
            })
        }
    };
    let mut headers = std::collections::BTreeMap::new();
    for h in &args.headers {
        let (name, value) = h
            .split_once(':')
            .with_context(|| format!("--header {h:?} must be 'name: value'"))?;
        headers.insert(name.trim().to_owned(), value.trim().to_owned());
    }
    Ok(NewSubscription {
        filter,
        headers: (!headers.is_empty()).then_some(headers),
        secret: args.secret.as_ref().map(|s| s.expose().to_owned()),
        ordering_key: args.ordering_key.clone(),
        ordering_failure: args.block_on_failure.then_some(OrderingFailure::Block),
        enabled: Some(!args.disabled),
        description: args.description.clone(),
        max_concurrency: args.max_concurrency,
        max_per_second: args.max_per_second,
        ..NewSubscription::new(&args.bucket, &args.url, args.event_types.iter().cloned())
    })
}
