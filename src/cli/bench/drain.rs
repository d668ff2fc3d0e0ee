//! `spindle bench --drain` and `--drop`: the JobDB cycle's two costs.
//!
//! `--drain` fills a retired JobDB with `--jobs` jobs as a Director leaves them (awaiting a
//! retry, every seventh with its attempt under way, `--expired-percent` of them past their
//! expiry), beside one live Director, and times a drainer child emptying it: the retrying jobs
//! moved to the live JobDB, the expired ones archived (to a directory, so S3 is not what is
//! measured). `--drop` fills two JobDBs the same way and times what a DROP of a retired JobDB
//! replaces: DELETEs of 10,000 rows each, against one DROP.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use super::topology::{jobdb_url, Topology};
use super::BenchArgs;
use crate::job::{AttemptRecord, Job, JobId, RetryPolicy, Transition};
use crate::jobdb::{self, JobDb};
use crate::registry::consul::ConsulClient;
use crate::registry::inventory::{Inventory, JobDbRecord, JobDbState};

/// The key prefix of the drain's archive (the drainer's `--s3-prefix`).
pub const ARCHIVE_PREFIX: &str = "bench/";

/// The jobs a retired JobDB was filled with: those still retrying, and those expired.
#[derive(Debug, Default)]
pub struct Filled {
    /// Awaiting a retry (or under way), not expired: a drain moves them.
    pub retrying: HashSet<JobId>,
    /// Past their expiry: a drain archives them.
    pub expired: HashSet<JobId>,
}

/// Fills `db` as a Director would have left it: `n` jobs to `endpoint` awaiting a retry,
/// `expired_percent` of every hundred already expired, every seventh with its attempt under
/// way; written 1,000 jobs per append under an ownership of its own.
pub async fn fill_retired(
    db: &JobDb,
    endpoint: &str,
    n: usize,
    expired_percent: usize,
) -> anyhow::Result<Filled> {
    let token = db.take_ownership("bench").await?;
    let now = chrono::Utc::now();
    let mut next_id = 1u64;
    let mut filled = Filled::default();
    let mut ids = ulid::Generator::new();
    let mut i = 0;
    while i < n {
        let mut jobs = Vec::new();
        let mut rows = Vec::new();
        for i in i..n.min(i + 1000) {
            let id = JobId(ids.generate().context("job ids")?);
            let expired = i % 100 < expired_percent;
            let job = Job {
                id,
                bucket: format!("b{}", i % 3).into(),
                endpoint: endpoint.into(),
                method: "POST".into(),
                headers: vec![("content-type".into(), "application/json".into())],
                payload: bytes::Bytes::from(format!("{{\"n\":{i}}}")),
                execution_timeout: Duration::from_secs(5),
                retry: RetryPolicy {
                    min_delay: Duration::from_millis(100),
                    coefficient: 2.0,
                },
                created_at: now - chrono::Duration::seconds(60),
                expire_at: match expired {
                    true => now - chrono::Duration::seconds(1),
                    false => now + chrono::Duration::hours(1),
                },
                idempotency_key: None,
                on_complete: None,
                ordering: None,
                event: None,
                trace: None,
            };
            let mut push = |t: Transition| {
                rows.push((next_id, t));
                next_id += 1;
            };
            push(Transition::awaiting_scheduling(&job));
            push(Transition::executing(id, 1, now));
            if i % 7 != 3 {
                let failed = AttemptRecord {
                    error_type: Some("status".into()),
                    response_status: Some(503),
                    ..Default::default()
                };
                push(Transition::awaiting_retry(id, 1, now, now, failed));
            }
            match expired {
                true => filled.expired.insert(id),
                false => filled.retrying.insert(id),
            };
            jobs.push(Arc::new(job));
        }
        db.append(token, &jobs, &rows).await?;
        i += jobs.len();
    }
    Ok(filled)
}

/// `--drain`: one drain of a retired JobDB of `args.jobs` jobs into the topology's Director,
/// timed; the report as JSON.
pub async fn drain(
    args: &BenchArgs,
    topology: &mut Topology,
    endpoint: &str,
) -> anyhow::Result<serde_json::Value> {
    let consul = topology.registry_url().context("a registry")?;
    let inventory = Inventory::new(ConsulClient::new(&consul, None)?);
    wait_until(Duration::from_secs(60), "the Director's JobDB", || async {
        let listed = inventory.list().await.unwrap_or_default();
        listed.iter().any(|l| l.holder.is_some())
    })
    .await?;
    let (text, url) = jobdb_url(args, &topology.tag, Some(args.directors))?;
    let db = JobDb::open(&url, true, 4).await?;
    topology.jobdbs.push(url.clone());
    let filling = Instant::now();
    let filled = fill_retired(&db, endpoint, args.jobs, args.expired_percent).await?;
    let fill_secs = filling.elapsed().as_secs_f64();
    db.close().await;
    let record = JobDbRecord {
        name: url.database.clone(),
        url: text,
        state: JobDbState::Retiring,
        changed_at: chrono::Utc::now(),
        changed_by: "bench".into(),
    };
    let archive = std::env::temp_dir().join(format!("spindle-bench-{}", topology.tag));
    let drained = drain_into(args, topology, &inventory, &record, &consul, &archive).await;
    let _ = std::fs::remove_dir_all(&archive);
    let (secs, manifests) = drained?;
    let records = |kind: crate::archive::BatchKind| -> u64 {
        manifests
            .iter()
            .filter(|m| m.kind == kind)
            .map(|m| m.jobs)
            .sum()
    };
    let (expired, histories) = (
        records(crate::archive::BatchKind::Expired),
        records(crate::archive::BatchKind::History),
    );
    let raw: u64 = manifests.iter().map(|m| m.uncompressed_bytes).sum();
    let gzip: u64 = manifests.iter().map(|m| m.compressed_bytes).sum();
    let n = args.jobs as f64;
    println!(
        "drain           {} jobs ({} retrying moved, {} expired archived) in {secs:.1} s: \
         {:.0} jobs/s (filled in {fill_secs:.1} s)",
        args.jobs,
        filled.retrying.len(),
        filled.expired.len(),
        n / secs
    );
    println!(
        "archive         {expired} expired jobs and {histories} histories in {} objects, \
         {:.1} MB raw, {:.1} MB gzip",
        manifests.len(),
        raw as f64 / 1e6,
        gzip as f64 / 1e6
    );
    Ok(json!({
        "drain": {
            "jobs": args.jobs,
            "retrying": filled.retrying.len(),
            "expired": filled.expired.len(),
            "seconds": secs,
            "jobs_per_sec": n / secs,
            "archived_expired": expired,
            "archived_histories": histories,
            "archive_objects": manifests.len(),
            "archive_raw_bytes": raw,
            "archive_gzip_bytes": gzip,
        }
    }))
}

/// Adds the retired JobDB `record` to the inventory and times a drainer child emptying it,
/// archiving to the directory `archive`; returns the seconds and the archive's manifests.
async fn drain_into(
    args: &BenchArgs,
    topology: &mut Topology,
    inventory: &Inventory,
    record: &JobDbRecord,
    consul: &str,
    archive: &std::path::Path,
) -> anyhow::Result<(f64, Vec<crate::archive::Manifest>)> {
    let started = Instant::now();
    inventory.add(record).await?;
    topology.spawn_drainer(args, consul, archive)?;
    wait_until(Duration::from_secs(1800), "the drain", || async {
        let listed = inventory.list().await.unwrap_or_default();
        listed
            .iter()
            .any(|l| l.record.name == record.name && l.record.state == JobDbState::Drained)
    })
    .await?;
    let secs = started.elapsed().as_secs_f64();
    let mut config = crate::archive::DirConfig::new(archive);
    config.prefix = ARCHIVE_PREFIX.to_owned();
    let manifests = crate::archive::Archive::open_dir(&config)
        .await?
        .manifests(Some(&record.name))
        .await?;
    Ok((secs, manifests))
}

/// `--drop`: two JobDBs of `args.jobs` jobs each, one emptied with DELETEs of 10,000 rows,
/// the other dropped; the report as JSON.
pub async fn drop_versus_delete(args: &BenchArgs, tag: &str) -> anyhow::Result<serde_json::Value> {
    let mut seconds = Vec::new();
    for (i, how) in ["delete", "drop"].into_iter().enumerate() {
        let (_, url) = jobdb_url(args, tag, Some(i))?;
        let db = JobDb::open(&url, true, 4).await?;
        // Timed: the DELETEs of one, the DROP of the other; both are dropped in the end.
        let emptied = async {
            fill_retired(&db, "http://127.0.0.1:9/", args.jobs, 0).await?;
            let deleting = Instant::now();
            if how == "delete" {
                db.delete_all_in_chunks(10_000).await?;
            }
            let deleted = deleting.elapsed();
            db.close().await;
            let dropping = Instant::now();
            jobdb::drop_database(&url).await?;
            let timed = if how == "delete" {
                deleted
            } else {
                dropping.elapsed()
            };
            anyhow::Ok(timed.as_secs_f64())
        }
        .await;
        if emptied.is_err() {
            db.close().await;
            let _ = jobdb::drop_database(&url).await;
        }
        seconds.push(emptied?);
    }
    // Every seventh job is under way (two rows), the others await a retry (three).
    let rows = 2 * args.jobs + (0..args.jobs).filter(|i| i % 7 != 3).count();
    println!(
        "drop            {} jobs + {rows} transitions: DELETE {:.2} s, DROP {:.3} s",
        args.jobs, seconds[0], seconds[1]
    );
    Ok(json!({
        "drop": {
            "jobs": args.jobs,
            "transitions": rows,
            "delete_seconds": seconds[0],
            "drop_seconds": seconds[1],
        }
    }))
}

/// Polls `done` every 100 ms until it holds, or fails naming `what` after `limit`.
async fn wait_until<F, Fut>(limit: Duration, what: &str, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !done().await {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: not done within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
