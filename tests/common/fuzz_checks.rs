//! What every accepted submission must satisfy: shared by the fuzz target
//! (`fuzz/fuzz_targets/submit.rs`) and `tests/fuzz_smoke.rs`.

use spindle::rpc::api::IntakeLimits;

/// Parses and validates `data` as the handler does; panics if it accepts anything that could
/// not be delivered as-is.
pub fn check(data: &[u8]) {
    let limits = IntakeLimits::default();
    let mut n: u128 = 0;
    let accepted = spindle::rpc::check_submission(data, &limits, None, || {
        n += 1;
        spindle::job::JobId(ulid::Ulid::from(n))
    });
    let Ok((jobs, scheduled)) = accepted else {
        return;
    };
    assert!(!jobs.is_empty() && jobs.len() <= limits.max_jobs_per_request);
    for (id, at) in &scheduled {
        let job = jobs
            .iter()
            .find(|j| j.id == *id)
            .expect("a scheduled job is one of the jobs");
        assert!(*at > job.created_at && *at < job.expire_at);
    }
    for job in jobs {
        assert!(!job.bucket.is_empty() && job.bucket.chars().count() <= 128);
        let url = url::Url::parse(&job.endpoint).expect("accepted endpoints parse");
        assert!(matches!(url.scheme(), "http" | "https"));
        assert!(job.payload.len() <= limits.max_payload_bytes);
        assert!(job.expire_at > job.created_at);
        for (name, value) in &job.headers {
            http::HeaderName::from_bytes(name.as_bytes()).expect("accepted header names are valid");
            http::HeaderValue::from_str(value).expect("accepted header values are valid");
        }
        assert!(http::Method::from_bytes(job.method.as_bytes()).is_ok());
    }
}
