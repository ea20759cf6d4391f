//! Object stores through the `object_store` crate: S3 (and S3-compatible servers), GCS,
//! Azure Blob and plain HTTP(S). One [`Bucket`] per bucket, container or host.
//!
//! `object_store` does the protocol work: signing, credential chains, retries with
//! full-jitter backoff, resuming a cut body under the same ETag, and refusing a ranged
//! answer that is not a 206 with the `Content-Range` asked for. Here: the client options
//! (no whole-request timeout, which would fail a large part on a slow link; a stall timeout
//! instead), listings cached per directory, every read conditional on the pinned ETag and
//! version, the body's length and ETag checked again, and errors mapped to what a user
//! can act on. By hand, because `object_store` has no call for it: S3's stated full-object
//! `x-amz-checksum-sha256`, which only a HEAD with `x-amz-checksum-mode: ENABLED` returns
//! (one SigV4-signed request with `object_store`'s own signer, credentials and connector).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::client::{HttpClient, HttpConnector, HttpErrorKind, HttpRequestBody};
use object_store::path::Path as OsPath;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};
use parking_lot::Mutex;

use super::stats::{self, CountingConnector};
use super::{Config, Kind, Listing, Meta, Namespace, Pin, RemoteError, RemoteUrl, Scheme, block_on};

#[derive(Debug)]
pub struct Bucket {
    /// `s3://bucket`, for messages.
    base: String,
    scheme: Scheme,
    store: Arc<dyn ObjectStore>,
    config: Config,
    /// Directory listings, by directory key ("" is the root).
    listings: Mutex<HashMap<String, Arc<Listing>>>,
    /// S3 only: what the checksum HEAD needs.
    s3: Option<S3Checksums>,
}

/// The pieces of an S3 client the checksum HEAD ([`Bucket::s3_stated_sha256`]) is made of.
#[derive(Debug)]
struct S3Checksums {
    store: Arc<object_store::aws::AmazonS3>,
    http: HttpClient,
    /// `ENDPOINT/BUCKET` (path style, as the object client addresses it).
    bucket_url: String,
    region: String,
    sign: bool,
}

fn client_options(config: &Config, allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_allow_http(allow_http)
        .with_timeout_disabled()
        .with_read_timeout(config.stall_timeout)
        .with_connect_timeout(config.connect_timeout)
        .with_pool_idle_timeout(Duration::from_secs(60))
}

fn retry_config(config: &Config) -> RetryConfig {
    RetryConfig {
        backoff: object_store::BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(15), base: 2.0 },
        max_retries: config.max_attempts.saturating_sub(1),
        retry_timeout: Duration::from_secs(180),
    }
}

impl Bucket {
    pub fn open(url: &RemoteUrl, config: &Config) -> Result<Bucket, RemoteError> {
        let base = url.namespace();
        let bad = |e: object_store::Error| RemoteError::Unsupported { url: base.clone(), what: format!("cannot set up the client: {}", clip(&e.to_string())) };
        // What every store's client gets the same way: the timeouts, the retries, the
        // counting connector (the builders share no trait for these).
        macro_rules! finish {
            ($builder:expr, $allow_http:expr) => {
                Arc::new(
                    $builder
                        .with_client_options(client_options(config, $allow_http))
                        .with_retry(retry_config(config))
                        .with_http_connector(CountingConnector::default())
                        .build()
                        .map_err(bad)?,
                )
            };
        }
        let mut s3 = None;
        let store: Arc<dyn ObjectStore> = match url.scheme {
            Scheme::S3 => {
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(&url.root);
                let endpoint = config.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT_URL_S3").ok()).or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
                let allow_http = endpoint.as_deref().is_some_and(|e| e.starts_with("http://"));
                if let Some(e) = &endpoint {
                    b = b.with_endpoint(e.trim_end_matches('/')).with_virtual_hosted_style_request(false);
                }
                let profile = super::creds::aws_profile();
                let region = config.region.clone().or_else(|| std::env::var("AWS_REGION").ok()).or_else(|| std::env::var("AWS_DEFAULT_REGION").ok());
                let region = region.or_else(|| profile.as_ref().and_then(|p| p.region.clone())).unwrap_or_else(|| "us-east-1".into());
                b = b.with_region(&region);
                if config.no_sign_request {
                    b = b.with_skip_signature(true);
                } else if std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
                    && let Some(p) = profile.filter(|p| p.access_key_id.is_some())
                {
                    b = b.with_access_key_id(p.access_key_id.unwrap_or_default()).with_secret_access_key(p.secret_access_key.unwrap_or_default());
                    if let Some(t) = p.session_token {
                        b = b.with_token(t);
                    }
                }
                let store: Arc<object_store::aws::AmazonS3> = finish!(b, allow_http);
                let http = CountingConnector::default().connect(&client_options(config, allow_http)).map_err(bad)?;
                let bucket_url = match &endpoint {
                    Some(e) => format!("{}/{}", e.trim_end_matches('/'), url.root),
                    None => format!("https://s3.{region}.amazonaws.com/{}", url.root),
                };
                s3 = Some(S3Checksums { store: store.clone(), http, bucket_url, region, sign: !config.no_sign_request });
                store
            }
            Scheme::Gs => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_bucket_name(&url.root);
                // `STORAGE_EMULATOR_HOST`, as Google's own clients read it: requests go to
                // that host, unauthenticated (they use anonymous credentials with it). An
                // explicit `GOOGLE_BASE_URL` (read by `from_env`) wins.
                let emulator = std::env::var("STORAGE_EMULATOR_HOST").ok().filter(|h| !h.is_empty());
                if let Some(host) = &emulator {
                    let host = if host.contains("://") { host.clone() } else { format!("http://{host}") };
                    if std::env::var_os("GOOGLE_BASE_URL").is_none() {
                        b = b.with_base_url(host.trim_end_matches('/'));
                    }
                    b = b.with_skip_signature(true);
                }
                let allow_http = emulator.is_some() || std::env::var("GOOGLE_BASE_URL").is_ok_and(|u| u.starts_with("http://"));
                finish!(b, allow_http)
            }
            Scheme::Az => finish!(object_store::azure::MicrosoftAzureBuilder::from_env().with_container_name(&url.root), true),
            Scheme::Http | Scheme::Https => {
                let scheme = if url.scheme == Scheme::Http { "http" } else { "https" };
                finish!(object_store::http::HttpBuilder::new().with_url(format!("{scheme}://{}", url.root)), url.scheme == Scheme::Http)
            }
            Scheme::Hf => return Err(RemoteError::Unsupported { url: base.clone(), what: "an hf:// URL is a Hub repository, not an object store".into() }),
        };
        Ok(Bucket { base, scheme: url.scheme, store, config: config.clone(), listings: Mutex::new(HashMap::new()), s3 })
    }

    fn map(&self, key: &str, e: object_store::Error) -> RemoteError {
        let url = self.url(key);
        match e {
            object_store::Error::NotFound { .. } => RemoteError::NotFound { url, hint: String::new() },
            object_store::Error::Precondition { .. } => RemoteError::Changed { url, what: "the ETag no longer matches (412)".into() },
            object_store::Error::PermissionDenied { .. } => RemoteError::Denied { url, status: 403, hint: self.credentials_hint() },
            object_store::Error::Unauthenticated { .. } => RemoteError::Denied { url, status: 401, hint: self.credentials_hint() },
            other => {
                let text = clip(&super::with_root_cause(&other));
                if http_error_kind(&other) == Some(HttpErrorKind::Connect) {
                    RemoteError::Unreachable { url, cause: text }
                } else if text.contains("Content-Range") || text.contains("non-partial") || text.contains("Range") {
                    // `object_store`'s range checks (its `GetResultError`) are private types:
                    // only their text says what the server did.
                    RemoteError::BadResponse { url, what: text }
                } else {
                    RemoteError::Failed { url, cause: text }
                }
            }
        }
    }

    fn credentials_hint(&self) -> String {
        match self.scheme {
            Scheme::S3 => "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, instance role) and the bucket policy, or -o no_sign_request for a public bucket".into(),
            Scheme::Gs => "check GOOGLE_APPLICATION_CREDENTIALS and the bucket's permissions".into(),
            Scheme::Az => "check AZURE_STORAGE_ACCOUNT_NAME and its key or SAS (AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY)".into(),
            _ => "the server refused the request".into(),
        }
    }

    /// S3's full-object sha256 of `key` as pinned by `meta`, where the object carries one:
    /// a HEAD with `x-amz-checksum-mode: ENABLED` (signed like every other request), checked
    /// against the pinned ETag. `None` for objects stored without a SHA256 checksum and for
    /// multipart objects, whose SHA256 is a checksum of the parts' checksums.
    fn s3_stated_sha256(&self, s3: &S3Checksums, key: &str, meta: &Meta) -> Result<Option<String>, RemoteError> {
        let url = self.url(key);
        let encoded: Vec<String> = key.split('/').map(|seg| percent_encoding::utf8_percent_encode(seg, &STRICT_PATH).to_string()).collect();
        let mut uri = format!("{}/{}", s3.bucket_url, encoded.join("/"));
        if let Some(v) = &meta.pin.version {
            uri.push_str(&format!("?versionId={}", percent_encoding::utf8_percent_encode(v, &STRICT_PATH)));
        }
        let bad = |what: String| RemoteError::Failed { url: url.clone(), cause: what };
        let answer = block_on(async {
            let mut req = http::Request::builder()
                .method(http::Method::HEAD)
                .uri(&uri)
                .header("x-amz-checksum-mode", "ENABLED")
                .body(HttpRequestBody::empty())
                .map_err(|e| bad(format!("cannot form the checksum request: {e}")))?;
            if s3.sign {
                let cred = s3.store.credentials().get_credential().await.map_err(|e| self.map(key, e))?;
                object_store::aws::AwsAuthorizer::new(&cred, "s3", &s3.region)
                    .with_sign_payload(false)
                    .try_authorize(&mut req, None)
                    .map_err(|e| bad(format!("cannot sign the checksum request: {}", clip(&e.to_string()))))?;
            }
            tokio::time::timeout(self.config.deadline(0), s3.http.execute(req))
                .await
                .map_err(|_| bad(format!("no answer to the checksum request within {:?}", self.config.deadline(0))))?
                .map_err(|e| bad(format!("checksum request: {}", clip(&e.to_string()))))
        })?;
        let status = answer.status().as_u16();
        let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        match status {
            200 => {}
            404 => return Err(RemoteError::NotFound { url, hint: String::new() }),
            412 => return Err(RemoteError::Changed { url, what: "412 to the checksum request".into() }),
            401 | 403 => return Err(RemoteError::Denied { url, status, hint: self.credentials_hint() }),
            _ => return Err(bad(format!("{status} to the checksum request"))),
        }
        if let (Some(pinned), Some(now)) = (&meta.pin.etag, header("etag"))
            && pinned != &now
        {
            return Err(RemoteError::Changed { url, what: format!("ETag {now} where {pinned} was pinned") });
        }
        parse_s3_sha256(header("x-amz-checksum-sha256").as_deref(), header("x-amz-checksum-type").as_deref()).map_err(|e| bad(e.to_string()))
    }

    fn listing(&self, dir: &str) -> Result<Arc<Listing>, RemoteError> {
        if let Some(l) = self.listings.lock().get(dir) {
            return Ok(l.clone());
        }
        if matches!(self.scheme, Scheme::Http | Scheme::Https) {
            return Err(RemoteError::Unsupported { url: self.url(dir), what: "an http(s) source is a single file (a server cannot be listed)".into() });
        }
        let prefix = (!dir.is_empty()).then(|| OsPath::from(dir));
        let listed = block_on(self.store.list_with_delimiter(prefix.as_ref())).map_err(|e| self.map(dir, e))?;
        let mut v = Vec::new();
        for o in listed.objects {
            let name = o.location.filename().unwrap_or_default().to_string();
            v.push((name, Kind::File(Meta { size: o.size, pin: Pin { etag: o.e_tag, version: o.version, sha256: None } })));
        }
        for p in listed.common_prefixes {
            v.push((p.filename().unwrap_or_default().to_string(), Kind::Dir));
        }
        let v = Arc::new(v);
        self.listings.lock().insert(dir.to_string(), v.clone());
        Ok(v)
    }
}

/// The kind of the HTTP failure behind an `object_store` error (a connection that could not
/// be made, a timeout, ...), found down its source chain.
fn http_error_kind(e: &object_store::Error) -> Option<HttpErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<object_store::client::HttpError>() {
            return Some(h.kind());
        }
        cur = err.source();
    }
    None
}

/// What S3 percent-encodes in a key's path segments for SigV4: everything but the
/// unreserved characters (as `object_store`'s own client encodes them).
const STRICT_PATH: percent_encoding::AsciiSet = percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The sha256 (lowercase hex) that S3's `x-amz-checksum-sha256` (base64) states for the
/// whole object, or `None` where it states none: no header, a multipart object's checksum of
/// checksums (`...-N`, or `x-amz-checksum-type: COMPOSITE`). A value that is not 32 bytes of
/// base64 is an error: the server's word cannot be read.
fn parse_s3_sha256(value: Option<&str>, kind: Option<&str>) -> Result<Option<String>, NotSha256> {
    use base64::Engine;
    let Some(v) = value.map(str::trim) else { return Ok(None) };
    if v.contains('-') || kind.is_some_and(|k| !k.eq_ignore_ascii_case("FULL_OBJECT")) {
        return Ok(None);
    }
    match base64::engine::general_purpose::STANDARD.decode(v) {
        Ok(b) if b.len() == 32 => Ok(Some(hex::encode(b))),
        _ => Err(NotSha256(clip(v))),
    }
}

/// An `x-amz-checksum-sha256` value (cut to a readable length) that is not 32 bytes of base64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("x-amz-checksum-sha256 {0:?} is not the base64 of 32 bytes")]
struct NotSha256(String);

/// An error text cut to a readable length (an error body can be anything a server sends).
fn clip(s: &str) -> String {
    if s.len() <= 400 {
        return s.to_string();
    }
    let mut end = 400;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

impl Namespace for Bucket {
    fn url(&self, key: &str) -> String {
        if key.is_empty() { self.base.clone() } else { format!("{}/{key}", self.base) }
    }

    fn stat(&self, key: &str) -> Result<Option<Kind>, RemoteError> {
        if key.is_empty() {
            return Ok(Some(Kind::Dir));
        }
        let (parent, name) = key.rsplit_once('/').unwrap_or(("", key));
        if let Some(l) = self.listings.lock().get(parent) {
            return Ok(l.iter().find(|(n, _)| n == name).map(|(_, k)| k.clone()));
        }
        match block_on(self.store.head(&OsPath::from(key))) {
            Ok(o) => Ok(Some(Kind::File(Meta { size: o.size, pin: Pin { etag: o.e_tag, version: o.version, sha256: None } }))),
            Err(object_store::Error::NotFound { .. }) if !matches!(self.scheme, Scheme::Http | Scheme::Https) => {
                let l = self.listing(key)?;
                Ok((!l.is_empty()).then_some(Kind::Dir))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.map(key, e)),
        }
    }

    fn list_dir(&self, dir: &str) -> Result<Listing, RemoteError> {
        Ok(self.listing(dir)?.as_ref().clone())
    }

    fn stated_sha256(&self, key: &str, meta: &Meta) -> Result<Option<String>, RemoteError> {
        match &self.s3 {
            Some(s3) => self.s3_stated_sha256(s3, key, meta),
            None => Ok(meta.pin.sha256.clone()),
        }
    }

    fn read(&self, key: &str, meta: &Meta, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        let len = buf.len();
        self.read_retrying(key, meta, offset, len, |store, path, options, deadline| {
            // The timer is made inside the runtime's context (`block_on` enters it).
            block_on(async { tokio::time::timeout(deadline, get_into(store.as_ref(), path, options, offset, &mut *buf)).await.ok() })
        })
    }

    /// As `read`, but each attempt runs as a task on the network runtime's workers, which
    /// take the body's bytes as the socket delivers them: the calling thread is woken once,
    /// when the part is complete, not once per chunk of the body (`block_on` from an outside
    /// thread is woken by the runtime's I/O driver for every readiness event).
    fn read_owned(&self, key: &str, meta: &Meta, offset: u64, buf: Vec<u8>) -> Result<Vec<u8>, RemoteError> {
        let len = buf.len();
        let mut owned = buf;
        self.read_retrying(key, meta, offset, len, |store, path, options, deadline| {
            let (store, path, options) = (store.clone(), path.clone(), options.clone());
            let mut b = std::mem::take(&mut owned);
            let task = super::runtime().spawn(async move {
                let r = tokio::time::timeout(deadline, get_into(store.as_ref(), &path, &options, offset, &mut b)).await.ok();
                (r, b)
            });
            match block_on(task) {
                Ok((r, b)) => {
                    owned = b;
                    r
                }
                // The task panicked (a bug in a dependency): its buffer went with it.
                Err(e) => {
                    owned = vec![0u8; len];
                    Some(Ok(Err(Unusable::Bad(format!("the request's task failed: {e}")))))
                }
            }
        })?;
        Ok(owned)
    }
}

/// What one attempt at a ranged GET gave: `None` when it did not complete within its
/// deadline, `Some(Err)` when the request failed, `Some(Ok(Err(what)))` when the answer
/// cannot be used.
type Attempt = Option<Result<Result<(), Unusable>, object_store::Error>>;

/// An answer that came but cannot be used.
#[derive(Debug)]
enum Unusable {
    /// Another version of the object than the one pinned.
    Changed(String),
    /// Not the bytes asked for (range, length), or no complete answer in time.
    Bad(String),
}

/// One conditional ranged GET of `buf.len()` bytes at `offset` into `buf`, the answer's
/// range, ETag and length checked.
async fn get_into(
    store: &dyn ObjectStore,
    path: &OsPath,
    options: &GetOptions,
    offset: u64,
    buf: &mut [u8],
) -> Result<Result<(), Unusable>, object_store::Error> {
    let end = offset + buf.len() as u64;
    let r = store.get_opts(path, options.clone()).await?;
    if r.range != (offset..end) {
        return Ok(Err(Unusable::Bad(format!("asked for bytes {offset}..{end}, the answer holds {:?}", r.range))));
    }
    if options.if_match.is_some() && r.meta.e_tag.is_some() && r.meta.e_tag != options.if_match {
        return Ok(Err(Unusable::Changed(format!("ETag {:?} where {:?} was pinned", r.meta.e_tag, options.if_match))));
    }
    let mut stream = r.into_stream();
    let mut filled = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if filled + chunk.len() > buf.len() {
            return Ok(Err(Unusable::Bad(format!("the body is longer than the {} bytes asked for", buf.len()))));
        }
        buf[filled..filled + chunk.len()].copy_from_slice(&chunk);
        filled += chunk.len();
    }
    if filled != buf.len() {
        return Ok(Err(Unusable::Bad(format!("the body ended after {filled} of {} bytes", buf.len()))));
    }
    Ok(Ok(()))
}

impl Bucket {
    /// A ranged read of `len` bytes at `offset`, conditional on `meta`'s pin: `attempt_once`
    /// makes one request (within the deadline it is given); timeouts are retried here with
    /// backoff (`object_store` retries the rest), and the outcome is counted and mapped.
    fn read_retrying(
        &self,
        key: &str,
        meta: &Meta,
        offset: u64,
        len: usize,
        mut attempt_once: impl FnMut(&Arc<dyn ObjectStore>, &OsPath, &GetOptions, Duration) -> Attempt,
    ) -> Result<(), RemoteError> {
        let end = offset + len as u64;
        let options = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            if_match: meta.pin.etag.clone(),
            version: meta.pin.version.clone(),
            ..Default::default()
        };
        let path = OsPath::from(key);
        let started = std::time::Instant::now();
        let deadline = self.config.deadline(len as u64);
        let mut attempt = 0u32;
        let got = loop {
            attempt += 1;
            match attempt_once(&self.store, &path, &options, deadline) {
                Some(r) => break r,
                None if (attempt as usize) < self.config.max_attempts => {
                    stats::note_error("timeout_retried");
                    tracing::info!("{}: no complete answer in {deadline:?} (attempt {attempt}): retrying", self.url(key));
                    std::thread::sleep(super::backoff(attempt));
                }
                None => {
                    break Ok(Err(Unusable::Bad(format!("no complete answer within {deadline:?} in {attempt} attempts (a stalled or trickling server)"))));
                }
            }
        };
        match got {
            Ok(Ok(())) => {
                stats::note_bytes(len as u64, started.elapsed());
                Ok(())
            }
            Ok(Err(unusable)) => {
                stats::note_error("bad_response");
                let url = self.url(key);
                match unusable {
                    Unusable::Changed(what) => {
                        tracing::warn!("{url}: {what}");
                        Err(RemoteError::Changed { url, what })
                    }
                    Unusable::Bad(what) => {
                        tracing::warn!("{url}: {what}");
                        Err(RemoteError::BadResponse { url, what })
                    }
                }
            }
            Err(e) => {
                let e = self.map(key, e);
                stats::note_error(match &e {
                    RemoteError::Changed { .. } => "changed",
                    RemoteError::BadResponse { .. } => "bad_response",
                    RemoteError::Unreachable { .. } => "unreachable",
                    RemoteError::Denied { .. } => "denied",
                    RemoteError::NotFound { .. } => "not_found",
                    _ => "failed",
                });
                tracing::warn!("read of {len} bytes at {offset} failed: {e}");
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_checksums_are_taken_only_for_the_whole_object() {
        // sha256("") in base64 and hex.
        let b64 = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=";
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(parse_s3_sha256(Some(b64), None), Ok(Some(hex.to_string())));
        assert_eq!(parse_s3_sha256(Some(b64), Some("FULL_OBJECT")), Ok(Some(hex.to_string())));
        assert_eq!(parse_s3_sha256(Some(b64), Some("COMPOSITE")), Ok(None));
        assert_eq!(parse_s3_sha256(Some(&format!("{b64}-3")), None), Ok(None));
        assert_eq!(parse_s3_sha256(None, Some("FULL_OBJECT")), Ok(None));
        assert!(parse_s3_sha256(Some("AAAA"), None).unwrap_err().to_string().contains("not the base64 of 32 bytes"));
        assert!(parse_s3_sha256(Some("not base64!"), None).is_err());
    }

    #[test]
    fn keys_are_encoded_as_s3_signs_them() {
        let enc = |k: &str| percent_encoding::utf8_percent_encode(k, &STRICT_PATH).to_string();
        assert_eq!(enc("Kimi-K3_v1.0~x.gguf"), "Kimi-K3_v1.0~x.gguf");
        assert_eq!(enc("a b+c=d:é"), "a%20b%2Bc%3Dd%3A%C3%A9");
    }
}
