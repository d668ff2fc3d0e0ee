//! [`Client`]: one spindle API (a Director or a router) at a base URL, over reqwest.
//!
//! Each method is one HTTP request: no retries, no redirects followed on the caller's behalf
//! beyond reqwest's, no hidden fallbacks. Errors say what happened ([`Error`]), including
//! whether the request may have been stored ([`Error::stored_nothing`]), so the caller decides
//! whether and where to send it again.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use url::Url;

use crate::api::{
    AttemptList, BackfillReply, BackfillRequest, EndpointsView, ErrorBody, EventFilter, EventList,
    EventView, ImportRequest, ImportResponse, JobFilter, JobList, JobView, NewEvent, NewJob,
    NewSubscription, PublishBatchReply, PublishReply, SubmitReply, SubscriptionList,
    SubscriptionPatch, SubscriptionView,
};
use crate::error::{ApiError, Error};

/// Deadline of a whole request (connect, send, answer) unless [`ClientBuilder::timeout`] says
/// otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Deadline of establishing a connection unless [`ClientBuilder::connect_timeout`] says
/// otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes of a non-JSON error answer kept as its message.
const MAX_ERROR_TEXT: usize = 300;

/// A client of one spindle API: a Director (`spindle director`) or a router (`spindle router`),
/// which answer `POST /v1/jobs` and `GET /v1/jobs/{id}` alike.
///
/// Cheap to clone (the connection pool is shared); [`Client::with_base_url`] reaches another
/// server over the same pool.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    /// Always ends with `/`, so relative paths join below it.
    base: Url,
    /// `Bearer <token>`, marked sensitive.
    authorization: Option<HeaderValue>,
}

/// Settings of a [`Client`]: timeouts and pooling.
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    base_url: String,
    token: Option<String>,
    timeout: Option<Duration>,
    connect_timeout: Duration,
    pool_max_idle_per_host: usize,
}

impl ClientBuilder {
    /// The bearer token sent with every request (`spindle tokens new` makes one; an API
    /// without `--tokens` needs none).
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// Deadline of a whole request, from connecting to the end of the answer
    /// ([`DEFAULT_TIMEOUT`] unless set). A submission through a router can take as long as
    /// its pending wait plus forwards, so keep this above the router's `--pending-wait-ms`
    /// plus `--forward-timeout-ms`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// No deadline on a whole request (a connection must still be made within the connect
    /// timeout).
    pub fn no_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// Deadline of establishing a connection ([`DEFAULT_CONNECT_TIMEOUT`] unless set).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Most idle connections kept per host (reqwest's default: no limit).
    pub fn pool_max_idle_per_host(mut self, max: usize) -> Self {
        self.pool_max_idle_per_host = max;
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client, Error> {
        let mut http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .pool_max_idle_per_host(self.pool_max_idle_per_host);
        if let Some(timeout) = self.timeout {
            http = http.timeout(timeout);
        }
        let http = http.build().map_err(Error::Build)?;
        Client::from_reqwest(http, &self.base_url, self.token)
    }
}

impl Client {
    /// A client of the API at `base_url` (`http://127.0.0.1:8080`), sending `token` as a bearer
    /// token if given, with the default timeouts ([`DEFAULT_TIMEOUT`],
    /// [`DEFAULT_CONNECT_TIMEOUT`]). See [`Client::builder`] for other settings.
    pub fn new(base_url: &str, token: Option<String>) -> Result<Client, Error> {
        Client::builder(base_url).token(token).build()
    }

    /// Settings for a client of the API at `base_url`.
    pub fn builder(base_url: &str) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.to_owned(),
            token: None,
            timeout: Some(DEFAULT_TIMEOUT),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            pool_max_idle_per_host: usize::MAX,
        }
    }

    /// A client over an existing reqwest client, whose timeouts and pool it uses as they are.
    pub fn from_reqwest(
        http: reqwest::Client,
        base_url: &str,
        token: Option<String>,
    ) -> Result<Client, Error> {
        let authorization = token
            .map(|token| {
                let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                    .map_err(|_| Error::InvalidToken)?;
                value.set_sensitive(true);
                Ok::<_, Error>(value)
            })
            .transpose()?;
        Ok(Client {
            http,
            base: parse_base(base_url)?,
            authorization,
        })
    }

    /// The same client (pool, timeouts, token) for the API at another base URL.
    pub fn with_base_url(&self, base_url: &str) -> Result<Client, Error> {
        Ok(Client {
            base: parse_base(base_url)?,
            ..self.clone()
        })
    }

    /// The base URL requests go below (with a trailing `/`).
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// `POST /v1/jobs`: submits 1 to 1000 jobs, stored atomically (all or none). A Director
    /// answers every job `accepted`; a router answers each job `accepted`, `duplicate`,
    /// `pending` or `failed` (see [`crate::JobStatus`]), in request order.
    ///
    /// On an error, [`Error::stored_nothing`] says whether the batch can be sent elsewhere or
    /// must be sent again as it is (jobs with idempotency keys are safe to re-send through a
    /// router).
    pub async fn submit(&self, jobs: &[NewJob]) -> Result<SubmitReply, Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            jobs: &'a [NewJob],
        }
        let url = self.url(&["v1", "jobs"]);
        let response = self.send(self.http.post(url.clone()).json(&Body { jobs }), &url);
        read_json(response.await?, &url).await
    }

    /// `POST /v1/jobs` with a body already encoded as a [`crate::SubmitRequest`] (`{"jobs":
    /// [...]}`): for producers that keep encoded batches, like `spindle bench`.
    pub async fn submit_encoded(&self, body: impl Into<Bytes>) -> Result<SubmitReply, Error> {
        self.post_encoded(&["v1", "jobs"], body.into()).await
    }

    /// `POST` of a JSON body already encoded.
    async fn post_encoded<T: DeserializeOwned>(
        &self,
        path: &[&str],
        body: Bytes,
    ) -> Result<T, Error> {
        let url = self.url(path);
        let request = self
            .http
            .post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        read_json(self.send(request, &url).await?, &url).await
    }

    /// `GET /v1/jobs/{id}`: the job (id as a ULID or 32 hex digits), its current state and
    /// its whole trace. A Director knows the jobs of its JobDB; a router asks every Director.
    /// An unknown job is an [`Error::Api`] with status 404.
    pub async fn job(&self, id: &str) -> Result<JobView, Error> {
        let url = self.url(&["v1", "jobs", id]);
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    /// `GET /v1/jobs/{id}/attempts`: the job's delivery attempts, first first.
    pub async fn attempts(&self, id: &str) -> Result<AttemptList, Error> {
        let url = self.url(&["v1", "jobs", id, "attempts"]);
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    /// One page of `GET /v1/jobs`: up to `limit` (1 to
    /// [`crate::api::MAX_LISTED_PER_PAGE`]) jobs matching `filter` after the cursor `after`
    /// (the previous page's `next_after`). A router merges every live JobDB's jobs into the
    /// page; a Director lists its own. A page may be short and still have a `next_after`.
    pub async fn jobs_page(
        &self,
        filter: &JobFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<JobList, Error> {
        let url = self.list_url("jobs", filter.query_pairs(), after, limit);
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    /// One page of `GET /v1/events`, as [`Client::jobs_page`] for jobs.
    pub async fn events_page(
        &self,
        filter: &EventFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<EventList, Error> {
        let url = self.list_url("events", filter.query_pairs(), after, limit);
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    fn list_url(
        &self,
        what: &str,
        pairs: Vec<(&'static str, String)>,
        after: Option<&str>,
        limit: usize,
    ) -> Url {
        let mut url = self.url(&["v1", what]);
        {
            let mut query = url.query_pairs_mut();
            for (name, value) in &pairs {
                query.append_pair(name, value);
            }
            if let Some(after) = after {
                query.append_pair("after", after);
            }
            query.append_pair("limit", &limit.to_string());
        }
        url
    }

    /// `POST /v1/import` (admin token; Directors only): stores jobs that already have ids in
    /// the Director's JobDB, which must be `request.jobdb` (else 409, nothing stored).
    /// Idempotent: jobs already there are counted in `already_present`.
    pub async fn import(&self, request: &ImportRequest) -> Result<ImportResponse, Error> {
        self.import_traced(request, None, None).await
    }

    /// [`Client::import`] within the caller's trace: `traceparent` (and `tracestate`) name
    /// the caller's span (W3C trace context), as a router's forward does.
    pub async fn import_traced(
        &self,
        request: &ImportRequest,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Result<ImportResponse, Error> {
        let url = self.url(&["v1", "import"]);
        let mut builder = self.http.post(url.clone()).json(request);
        for (name, value) in [("traceparent", traceparent), ("tracestate", tracestate)] {
            if let Some(value) = value {
                builder = builder.header(name, value);
            }
        }
        read_json(self.send(builder, &url).await?, &url).await
    }

    /// `GET /v1/endpoints` (admin token; Directors only): the health of each endpoint the
    /// Director works for.
    pub async fn endpoints(&self) -> Result<EndpointsView, Error> {
        let url = self.url(&["v1", "endpoints"]);
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    /// `POST /v1/events`: publishes one event to every matching subscription of its bucket;
    /// all of its jobs are committed in one transaction before the answer.
    pub async fn publish(&self, event: &NewEvent) -> Result<PublishReply, Error> {
        let url = self.url(&["v1", "events"]);
        let response = self.send(self.http.post(url.clone()).json(event), &url);
        read_json(response.await?, &url).await
    }

    /// `POST /v1/events` with a batch of 1 to [`crate::api::MAX_EVENTS_PER_REQUEST`] events
    /// (Directors only): every job of every event committed in one transaction, or none.
    pub async fn publish_batch(&self, events: &[NewEvent]) -> Result<PublishBatchReply, Error> {
        #[derive(Serialize)]
        struct Batch<'a> {
            events: &'a [NewEvent],
        }
        let url = self.url(&["v1", "events"]);
        let response = self.send(self.http.post(url.clone()).json(&Batch { events }), &url);
        read_json(response.await?, &url).await
    }

    /// `POST /v1/subscriptions/{id}/backfill` (Directors only): delivers past events to a
    /// subscription, all of a request's jobs committed together.
    pub async fn backfill(
        &self,
        id: &str,
        request: &BackfillRequest,
    ) -> Result<BackfillReply, Error> {
        let url = self.url(&["v1", "subscriptions", id, "backfill"]);
        let response = self.send(self.http.post(url.clone()).json(request), &url);
        read_json(response.await?, &url).await
    }

    /// `GET /v1/events/{id}`: the event and its jobs, from the JobDB of the Director asked
    /// (404 when that JobDB has no row of it).
    pub async fn event(&self, id: &str) -> Result<EventView, Error> {
        let url = self.url(&["v1", "events", id]);
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    /// `POST /v1/events` with a body already encoded as a [`crate::NewEvent`] (`spindle
    /// bench --events`).
    pub async fn publish_encoded(&self, body: impl Into<Bytes>) -> Result<PublishReply, Error> {
        self.post_encoded(&["v1", "events"], body.into()).await
    }

    /// `POST /v1/events` with a body already encoded as a [`crate::EventBatch`].
    pub async fn publish_batch_encoded(
        &self,
        body: impl Into<Bytes>,
    ) -> Result<PublishBatchReply, Error> {
        self.post_encoded(&["v1", "events"], body.into()).await
    }

    /// `POST /v1/subscriptions`: stores a subscription; the answer shows its secret, once.
    pub async fn add_subscription(
        &self,
        subscription: &NewSubscription,
    ) -> Result<SubscriptionView, Error> {
        let url = self.url(&["v1", "subscriptions"]);
        let response = self.send(self.http.post(url.clone()).json(subscription), &url);
        read_json(response.await?, &url).await
    }

    /// `GET /v1/subscriptions`: every subscription the token may see, of `bucket` if given,
    /// a page at a time.
    pub async fn subscriptions(&self, bucket: Option<&str>) -> Result<SubscriptionList, Error> {
        let mut all = SubscriptionList {
            subscriptions: Vec::new(),
            next_after: None,
        };
        let mut after = None;
        loop {
            let page = self
                .subscriptions_page(
                    bucket,
                    after.as_deref(),
                    crate::api::MAX_SUBSCRIPTIONS_PER_PAGE,
                )
                .await?;
            all.subscriptions.extend(page.subscriptions);
            match page.next_after {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// One page of `GET /v1/subscriptions`: up to `limit` (1 to 1000) after the id `after`.
    pub async fn subscriptions_page(
        &self,
        bucket: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<SubscriptionList, Error> {
        let mut url = self.url(&["v1", "subscriptions"]);
        {
            let mut query = url.query_pairs_mut();
            if let Some(bucket) = bucket {
                query.append_pair("bucket", bucket);
            }
            if let Some(after) = after {
                query.append_pair("after", after);
            }
            query.append_pair("limit", &limit.to_string());
        }
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    /// `GET /v1/subscriptions/{id}`.
    pub async fn subscription(&self, id: &str) -> Result<SubscriptionView, Error> {
        let url = self.url(&["v1", "subscriptions", id]);
        read_json(self.send(self.http.get(url.clone()), &url).await?, &url).await
    }

    /// `PATCH /v1/subscriptions/{id}`: changes the fields `patch` names.
    pub async fn update_subscription(
        &self,
        id: &str,
        patch: &SubscriptionPatch,
    ) -> Result<SubscriptionView, Error> {
        self.update_subscription_if(id, patch, None).await
    }

    /// `PATCH /v1/subscriptions/{id}` with `If-Match: "<version>"` when `version` is given:
    /// the change holds only if the subscription is still at that version (a 412 otherwise,
    /// nothing changed), so an edit made from what was read never undoes another's.
    pub async fn update_subscription_if(
        &self,
        id: &str,
        patch: &SubscriptionPatch,
        version: Option<u64>,
    ) -> Result<SubscriptionView, Error> {
        let url = self.url(&["v1", "subscriptions", id]);
        let mut request = self.http.patch(url.clone()).json(patch);
        if let Some(v) = version {
            request = request.header(reqwest::header::IF_MATCH, format!("\"{v}\""));
        }
        read_json(self.send(request, &url).await?, &url).await
    }

    /// `DELETE /v1/subscriptions/{id}`: no new event reaches it; its jobs already made go on.
    pub async fn remove_subscription(&self, id: &str) -> Result<SubscriptionView, Error> {
        let url = self.url(&["v1", "subscriptions", id]);
        read_json(self.send(self.http.delete(url.clone()), &url).await?, &url).await
    }

    /// `GET /readyz`: whether the server takes jobs now (`false` on a 503: a Director without
    /// its JobDB or stopping, a router without Directors).
    pub async fn ready(&self) -> Result<bool, Error> {
        let url = self.url(&["readyz"]);
        let response = self.send(self.http.get(url.clone()), &url).await;
        match response {
            Ok(_) => Ok(true),
            Err(Error::Api(e)) if e.status == 503 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `base` with `segments` appended (each percent-encoded as one path segment).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Sends `request` with the token; a success answer, or the error.
    async fn send(&self, request: reqwest::RequestBuilder, url: &Url) -> Result<Response, Error> {
        let request = match &self.authorization {
            Some(value) => request.header(AUTHORIZATION, value.clone()),
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|e| Error::transport(url.as_str(), e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(error_answer(response, url).await)
    }
}

/// Parses a base URL: http or https, with a host; a path (behind a proxy) is kept.
fn parse_base(base_url: &str) -> Result<Url, Error> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: base_url.to_owned(),
        reason,
    };
    let mut url = Url::parse(base_url.trim()).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https".into()));
    }
    if url.host().is_none() || url.cannot_be_a_base() {
        return Err(invalid("it must name a host".into()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("it must not have a query or fragment".into()));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

/// The body of a success answer, parsed.
async fn read_json<T: DeserializeOwned>(response: Response, url: &Url) -> Result<T, Error> {
    let status = response.status().as_u16();
    let body = response
        .bytes()
        .await
        .map_err(|e| Error::transport(url.as_str(), e))?;
    serde_json::from_slice(&body).map_err(|source| Error::Decode {
        url: url.to_string(),
        status,
        source,
    })
}

/// The error of a non-success answer, with the server's message (and field) when the body is
/// spindle's error JSON.
async fn error_answer(response: Response, url: &Url) -> Error {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(e) => return Error::transport(url.as_str(), e),
    };
    let (code, message, field) = match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(ErrorBody { error }) => (Some(error.code), error.message, error.field),
        Err(_) => (None, error_text(status, &body), None),
    };
    Error::Api(Box::new(ApiError {
        url: url.to_string(),
        status: status.as_u16(),
        code,
        message,
        field,
        retry_after,
    }))
}

/// The start of a non-JSON error body, or the status's reason when it is empty.
fn error_text(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase();
    }
    let mut end = text.len().min(MAX_ERROR_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_keep_their_path_and_join_below_it() {
        let client = Client::new("http://127.0.0.1:8080", None).unwrap();
        assert_eq!(
            client.url(&["v1", "jobs"]).as_str(),
            "http://127.0.0.1:8080/v1/jobs"
        );
        let client = client.with_base_url("https://h.example/spindle").unwrap();
        assert_eq!(
            client.url(&["v1", "jobs", "a/b c"]).as_str(),
            "https://h.example/spindle/v1/jobs/a%2Fb%20c"
        );
        let client = client.with_base_url("https://h.example/spindle/").unwrap();
        assert_eq!(
            client.url(&["readyz"]).as_str(),
            "https://h.example/spindle/readyz"
        );
    }

    #[test]
    fn bad_base_urls_and_tokens_are_refused() {
        for url in [
            "",
            "127.0.0.1:8080",
            "ftp://h/",
            "http://h/?a=1",
            "mailto:x@y",
        ] {
            let err = Client::new(url, None).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err}");
            assert!(err.stored_nothing());
        }
        let err = Client::new("http://h", Some("a\nb".into())).unwrap_err();
        assert!(matches!(err, Error::InvalidToken));
    }

    #[test]
    fn error_text_is_bounded_and_never_empty() {
        assert_eq!(error_text(StatusCode::BAD_GATEWAY, b"  "), "bad gateway");
        let long = "é".repeat(400);
        let text = error_text(StatusCode::BAD_GATEWAY, long.as_bytes());
        assert!(text.len() <= MAX_ERROR_TEXT && text.starts_with('é'));
    }
}
