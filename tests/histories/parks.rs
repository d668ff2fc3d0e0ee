//! Parks inside the checker: the Directors park a lane that fails past `--park-after-secs`
//! (and operators park and unpark lanes by command); a sampler follows the park records in
//! Consul so that the checker can hold the Directors to them (`check::parks`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::ops::LANES;
use super::record::Recorder;
use super::world::World;

/// The Directors' park settings in the checker: parked after 2 s of an open breaker, one probe
/// a second, and a re-drive from 20 requests a second, doubled every second.
pub const DIRECTOR_FLAGS: [&str; 10] = [
    "--park-after-secs",
    "2",
    "--park-probe-secs",
    "1",
    "--redrive-per-second",
    "20",
    "--redrive-double-secs",
    "1",
    "--redrive-until-per-second",
    "400",
];

/// Seconds between two probes of a parked lane (`--park-probe-secs`).
pub const PROBE_EVERY_SECS: f64 = 1.0;
/// The re-drive's first pace (`--redrive-per-second`).
pub const REDRIVE_START: f64 = 20.0;

/// One park of a lane as the records showed it.
#[derive(Clone, Debug)]
pub struct Parked {
    pub lane: &'static str,
    pub parked_at: DateTime<Utc>,
    pub unparked_at: Option<DateTime<Utc>>,
    /// The last sample that saw it (a park still in force is known to hold until then).
    pub seen_at: DateTime<Utc>,
}

/// Reads the park records every 200 ms until `until`, recording each park once.
pub async fn sampler(world: Arc<World>, rec: Arc<Recorder>, until: tokio::time::Instant) {
    let urls: Vec<(String, &'static str)> = LANES
        .iter()
        .map(|l| (world.endpoint.lane_url(l), *l))
        .collect();
    while tokio::time::Instant::now() < until {
        let read =
            spindle::registry::controls::read(&world.consul.client, 0, Duration::from_secs(1))
                .await;
        if let Ok((controls, _)) = read {
            let now = Utc::now();
            let mut log = rec.log.lock().unwrap();
            for park in controls.parks.values() {
                let Some((_, lane)) = urls.iter().find(|(url, _)| *url == park.endpoint) else {
                    continue;
                };
                match log
                    .parks
                    .iter_mut()
                    .find(|p| p.lane == *lane && p.parked_at == park.parked_at)
                {
                    Some(known) => {
                        if known.unparked_at.is_none() {
                            if let Some(at) = park.unparked_at {
                                println!(
                                    "histories: {} lane {lane} unparked at {} by {}",
                                    now.format("%H:%M:%S%.3f"),
                                    at.format("%H:%M:%S%.3f"),
                                    park.unparked_by.as_deref().unwrap_or("")
                                );
                            }
                        }
                        known.unparked_at = park.unparked_at;
                        known.seen_at = now;
                    }
                    None => {
                        println!(
                            "histories: {} lane {lane} parked at {} by {}",
                            now.format("%H:%M:%S%.3f"),
                            park.parked_at.format("%H:%M:%S%.3f"),
                            park.parked_by
                        );
                        log.parks.push(Parked {
                            lane,
                            parked_at: park.parked_at,
                            unparked_at: park.unparked_at,
                            seen_at: now,
                        });
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
