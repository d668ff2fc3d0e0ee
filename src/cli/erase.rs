//! `spindle erase`: a bucket's payloads, headers and answer bodies removed from every JobDB
//! (from `--jobdb`, or the Consul inventory: every JobDB not spare and not dropped) and from
//! the archive, with a receipt printed, stored beside the archive, and optionally written to a
//! file ([`crate::erasure`] has the steps). Exits non-zero when anything was not reached.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;

use super::dashboard::DashboardRegistry;
use super::{ConsulArgs, S3Args};
use crate::erasure::{Options, Receipt, Selector};
use crate::jobdb::{JobDb, JobDbUrl};
use crate::registry::inventory::{Inventory, JobDbState};
use crate::secret::SecretUrl;

/// Options of `spindle erase`.
#[derive(Debug, Clone, Args)]
pub struct EraseArgs {
    /// The bucket whose jobs are erased.
    #[arg(long)]
    pub bucket: String,
    /// Only jobs whose idempotency key starts with this (the bucket's events are then left).
    #[arg(long)]
    pub idempotency_key_prefix: Option<String>,
    /// Only jobs and events created before this time (RFC 3339); never later than the start
    /// of the run, the default.
    #[arg(long, conflicts_with = "older_than_secs")]
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs and events older than this many seconds: a bucket's payload retention, run
    /// from cron.
    #[arg(long)]
    pub older_than_secs: Option<u64>,
    /// A JobDB to erase in, `mysql://user[:password]@host[:port]/database` or `sqlite://...`
    /// (repeatable; comma-separated in the environment).
    #[arg(
        long = "jobdb",
        env = "SPINDLE_ERASE_JOBDBS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub jobdbs: Vec<SecretUrl>,
    /// Where else JobDBs come from: `consul` adds every JobDB of the inventory that holds jobs
    /// (not `spare`, not `dropped`).
    #[arg(long, env = "SPINDLE_REGISTRY", value_enum, default_value_t = DashboardRegistry::None)]
    pub registry: DashboardRegistry,
    /// With `--registry consul`: the agent.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// The archive (the `--s3-*` options, or `--archive-dir`); the receipt is stored there.
    #[command(flatten)]
    pub s3: S3Args,
    /// Say there is no archive to erase in (otherwise one must be given).
    #[arg(long, conflicts_with_all = ["s3_bucket", "archive_dir"])]
    pub no_archive: bool,
    /// How long to wait, per JobDB, for the named jobs still in flight to end, in seconds.
    #[arg(long, default_value_t = 60)]
    pub wait_secs: u64,
    /// Skip rebuilding the tables after erasing (the bytes then stay in the database's free
    /// pages until they are reused).
    #[arg(long)]
    pub no_rebuild: bool,
    /// Also write the receipt (JSON) to this file.
    #[arg(long)]
    pub receipt: Option<PathBuf>,
    /// Print the receipt as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One JobDB to erase in: its name, its state, its URL.
struct Place {
    name: String,
    state: Option<JobDbState>,
    url: String,
}

impl Place {
    /// Whether it may still take jobs (live, or given by URL). Those that take none go
    /// first: a job a drain moves is then found either where it was or where it went.
    fn takes_jobs(&self) -> bool {
        matches!(self.state, Some(JobDbState::Active) | None)
    }

    fn state_label(&self) -> String {
        match self.state {
            Some(state) => format!("{state:?}").to_lowercase(),
            None => "given".to_owned(),
        }
    }
}

/// Runs `spindle erase`.
pub(super) async fn run(args: &EraseArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.bucket.is_empty(), "--bucket must not be empty");
    anyhow::ensure!(
        args.idempotency_key_prefix.as_deref() != Some(""),
        "--idempotency-key-prefix must not be empty (leave it out to erase the whole bucket)"
    );
    let archive_config = args.s3.to_config();
    anyhow::ensure!(
        archive_config.is_some() || args.no_archive,
        "give the archive (--s3-bucket ... or --archive-dir) or say --no-archive"
    );
    let started_at = Utc::now();
    let before = match args.older_than_secs {
        Some(secs) => i64::try_from(secs)
            .ok()
            .and_then(chrono::Duration::try_seconds)
            .and_then(|age| started_at.checked_sub_signed(age))
            .context("--older-than-secs is too large")?,
        None => args.created_before.unwrap_or(started_at),
    };
    let selector = Selector {
        bucket: args.bucket.clone(),
        idempotency_key_prefix: args.idempotency_key_prefix.clone(),
        created_before: before.min(started_at),
    };
    let mut places = places(args).await?;
    places.sort_by_key(|p| (p.takes_jobs(), p.name.clone()));
    let options = Options {
        wait: Duration::from_secs(args.wait_secs),
        rebuild: !args.no_rebuild,
        issued_by: format!("spindle erase@{}", hostname()),
    };
    let id = ulid::Ulid::new();
    let mut receipt = Receipt::new(id, &selector, started_at);
    let mut opened = Vec::new();
    for place in &places {
        opened.push(crate::erasure::Opened {
            name: place.name.clone(),
            state: place.state_label(),
            db: match open(&place.url).await {
                // Only a JobDB on its way out may vanish: a given or live one is a mistake.
                crate::erasure::Opening::Gone if place.takes_jobs() => {
                    crate::erasure::Opening::Failed("the database does not exist".to_owned())
                }
                opening => opening,
            },
        });
    }
    let (parts, settled) = crate::erasure::erase_jobdbs(&opened, &selector, &options).await;
    for part in parts {
        receipt.add_jobdb(part);
    }
    if !settled {
        receipt.add_unsettled();
    }
    for opened in opened {
        if let crate::erasure::Opening::Open(db) = opened.db {
            db.close().await;
        }
    }
    let archive = match &archive_config {
        Some(config) => match crate::archive::Archive::open(config).await {
            Ok(archive) => {
                receipt.add_archive(crate::erasure::erase_archive(&archive, &selector).await);
                Some(archive)
            }
            Err(e) => {
                receipt.add_archive(crate::erasure::ArchiveReceipt {
                    location: "the archive".to_owned(),
                    errors: vec![crate::delivery::error_chain(&e)],
                    ..Default::default()
                });
                None
            }
        },
        None => None,
    };
    receipt.finished_at = Utc::now();
    store(&mut receipt, archive.as_ref(), id).await;
    let json = serde_json::to_string_pretty(&receipt)?;
    if let Some(path) = &args.receipt {
        std::fs::write(path, &json).with_context(|| format!("--receipt {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{receipt}");
    }
    anyhow::ensure!(
        receipt.complete(),
        "the erasure is not complete: {} places not reached or not finished (above); run it \
         again",
        receipt.unreached.len()
    );
    Ok(())
}

/// Stores the receipt beside the archive (the key it is stored under is in it); a failure is
/// one more thing not done.
async fn store(receipt: &mut Receipt, archive: Option<&crate::archive::Archive>, id: ulid::Ulid) {
    let Some(archive) = archive else { return };
    // The key goes into the receipt before it is written, so the stored copy names itself.
    let stored_key = archive.erasure_receipt_key(id);
    if let Some(part) = receipt.archive.as_mut() {
        part.receipt_key = Some(stored_key);
    }
    let json = match serde_json::to_vec_pretty(&*receipt) {
        Ok(json) => json,
        Err(e) => {
            receipt.unreached.push(format!("the receipt: {e}"));
            return;
        }
    };
    if let Err(e) = archive.put_erasure_receipt(id, json.into()).await {
        receipt.unreached.push(format!(
            "the receipt could not be stored in the archive: {}",
            crate::delivery::error_chain(&e)
        ));
    }
}

/// The JobDBs to erase in: `--jobdb`, and the inventory's that hold jobs.
async fn places(args: &EraseArgs) -> anyhow::Result<Vec<Place>> {
    let mut places = Vec::new();
    for url in &args.jobdbs {
        let parsed: JobDbUrl = url.expose().parse().context("--jobdb")?;
        places.push(Place {
            name: parsed.database.clone(),
            state: None,
            url: url.expose().to_owned(),
        });
    }
    if args.registry == DashboardRegistry::Consul {
        let inventory = Inventory::new(args.consul.client()?);
        let listed = inventory
            .list()
            .await
            .context("reading the JobDB inventory")?;
        for l in listed {
            if matches!(l.record.state, JobDbState::Spare | JobDbState::Dropped)
                || places.iter().any(|p| p.name == l.record.name)
            {
                continue;
            }
            places.push(Place {
                name: l.record.name.clone(),
                state: Some(l.record.state),
                url: inventory.connect_url(&l.record).expose().to_owned(),
            });
        }
    }
    anyhow::ensure!(
        !places.is_empty(),
        "no JobDB to erase in: give --jobdb URL (one or more) or --registry consul"
    );
    Ok(places)
}

/// Opens a JobDB, applying this release's migrations (erasure needs its columns), within 10 s;
/// a statement waits at most a minute for a lock (the rebuild waits for the Director's
/// transactions, and they for it). A database that does not exist is
/// [`crate::erasure::Opening::Gone`].
async fn open(url: &str) -> crate::erasure::Opening {
    use crate::erasure::Opening;
    let parsed: JobDbUrl = match url.parse() {
        Ok(parsed) => parsed,
        Err(e) => return Opening::Failed(crate::delivery::error_chain(&e)),
    };
    let lock_wait = Some(Duration::from_secs(60));
    let open = JobDb::open_with_lock_wait(&parsed, false, 2, lock_wait);
    match tokio::time::timeout(Duration::from_secs(10), open).await {
        Ok(Ok(db)) => Opening::Open(db),
        Ok(Err(e)) if e.is_gone() => Opening::Gone,
        Ok(Err(e)) => Opening::Failed(crate::delivery::error_chain(&e)),
        Err(_) => Opening::Failed("no answer within 10 s".to_owned()),
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".to_owned())
}
