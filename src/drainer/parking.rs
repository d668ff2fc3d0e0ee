//! Parking: a job a live Director refuses to import for good ends `discarded` in the retired
//! JobDB, with `error_type` `import-refused` and the Director's answer, instead of blocking the
//! drain forever.

use chrono::Utc;

use super::{Drain, DrainerError, Owned};
use crate::job::{AttemptRecord, ErrorType, JobId, Transition};

impl Drain {
    /// Ends a job the target refused for good: `discarded`, `error_type` `import-refused`,
    /// with the target's answer, so it is visible in SQL and archived with the JobDB's
    /// history instead of blocking the drain forever.
    pub(super) async fn park_refused(
        &self,
        o: &Owned,
        job: JobId,
        reason: &str,
    ) -> Result<(), DrainerError> {
        let latest = o.db.latest_of(&[job]).await?;
        let Some(last) = latest.get(&job).filter(|t| !t.state.is_terminal()) else {
            return Ok(());
        };
        tracing::error!(
            jobdb = o.db.name(),
            job = %job,
            reason,
            "a live director refuses this job for good: parked as discarded (import-refused)"
        );
        let row = Transition::discarded(
            job,
            last.attempts,
            Utc::now(),
            AttemptRecord {
                error_type: Some(ErrorType::ImportRefused.into()),
                error_response: Some(bytes::Bytes::from(reason.to_owned())),
                ..AttemptRecord::default()
            },
        );
        self.append(o, vec![row]).await?;
        self.metrics.jobs_import_refused.inc();
        Ok(())
    }
}
