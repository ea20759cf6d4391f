//! The Hugging Face Hub's file protocol (`hf://ORG/NAME[@REVISION][/PATH]`), which
//! `object_store` does not speak; on reqwest, the HTTP stack `object_store` uses.
//!
//! At open the revision is resolved to its commit (`/api/models/REPO/revision/REV`), and
//! everything after reads at that commit, so a later push changes nothing. The file list
//! is the tree API's at that commit (`?recursive=true`, following `Link: rel="next"`
//! pages); LFS files carry their sha256 (`lfs.oid`), kept as the pin. Reads of an LFS file
//! go to the presigned CDN URL that `resolve` redirects to (resolved once per file and
//! again when it expires or the CDN answers 403), with the `X-Linked-Etag` of the redirect
//! checked against the pinned sha256; small files are read from `resolve` itself. The
//! token goes to the Hub's own host only, never to the CDN. Every read is a ranged GET
//! checked as the module docs of `remote` say (206, `Content-Range`, exact length),
//! retried with backoff on 5xx, 429, transport errors, stalls and cut bodies (resumed from
//! the last byte).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use super::stats;
use super::{Config, Kind, Listing, Meta, Namespace, Pin, RemoteError, RemoteUrl, block_on};

/// Caps on what the Hub's API may send (a server is input too).
const MAX_API_BODY: usize = 64 << 20;
const MAX_TREE_PAGES: usize = 10_000;

#[derive(Debug)]
pub struct Repo {
    /// `hf://org/name@rev`, for messages.
    base: String,
    endpoint: String,
    repo: String,
    commit: String,
    token: Option<String>,
    hub: reqwest::Client,
    cdn: reqwest::Client,
    entries: HashMap<String, Kind>,
    children: HashMap<String, Listing>,
    /// Keys of LFS files (read through the CDN).
    lfs: std::collections::HashSet<String>,
    /// Presigned CDN URLs by key, with when to resolve again.
    resolved: Mutex<HashMap<String, (String, Instant)>>,
    attempts: usize,
    config: Config,
}

fn unquote(s: &str) -> String {
    s.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

/// The origin (`scheme://host[:port]`) of a URL.
fn origin(u: &str) -> String {
    match u.find("://") {
        Some(i) => {
            let rest = &u[i + 3..];
            let end = rest.find('/').unwrap_or(rest.len());
            format!("{}{}", &u[..i + 3], &rest[..end])
        }
        None => String::new(),
    }
}

/// A URL without its query string (presigned URLs carry credentials there).
fn no_query(u: &str) -> &str {
    u.split('?').next().unwrap_or(u)
}

/// `X-Amz-Expires` (seconds) of a presigned URL, if it has one.
fn expires_in(u: &str) -> Option<u64> {
    let q = u.split_once('?')?.1;
    q.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| k.eq_ignore_ascii_case("X-Amz-Expires")).and_then(|(_, v)| v.parse().ok()))
}

fn encode_path(p: &str) -> String {
    p.split('/').map(|c| url::form_urlencoded::byte_serialize(c.as_bytes()).collect::<String>().replace('+', "%20")).collect::<Vec<_>>().join("/")
}

/// Why [`body_capped`] gave no body.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("{0}")]
    Read(#[from] reqwest::Error),
    #[error("the answer is over {0} bytes")]
    TooLarge(usize),
}

/// Read a body up to `cap` bytes.
async fn body_capped(mut r: reqwest::Response, cap: usize) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::new();
    while let Some(c) = r.chunk().await? {
        if out.len() + c.len() > cap {
            return Err(BodyError::TooLarge(cap));
        }
        out.extend_from_slice(&c);
    }
    Ok(out)
}

/// The `rel="next"` URL of a `Link` header.
fn next_link(h: &HeaderMap) -> Option<String> {
    let v = h.get(reqwest::header::LINK)?.to_str().ok()?;
    v.split(',').find(|p| p.contains("rel=\"next\"")).and_then(|p| Some(p.split('<').nth(1)?.split('>').next()?.to_string()))
}

impl Repo {
    pub fn open(url: &RemoteUrl, config: &Config) -> Result<Repo, RemoteError> {
        let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into()).trim_end_matches('/').to_string();
        let rev = url.revision.clone().unwrap_or_else(|| "main".into());
        let base = url.namespace();
        let build = |timeout: Duration| {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(config.connect_timeout)
                .read_timeout(timeout)
                .user_agent(concat!("xpackfs/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| RemoteError::Unsupported { url: base.clone(), what: format!("cannot set up the HTTP client: {e}") })
        };
        let mut repo = Repo {
            base: base.clone(),
            endpoint,
            repo: url.root.clone(),
            commit: String::new(),
            token: super::creds::hf_token(),
            hub: build(config.stall_timeout)?,
            cdn: build(config.stall_timeout)?,
            entries: HashMap::new(),
            children: HashMap::new(),
            lfs: Default::default(),
            resolved: Mutex::new(HashMap::new()),
            attempts: config.max_attempts.max(1),
            config: config.clone(),
        };
        let info = repo.api(&format!("/api/models/{}/revision/{}", repo.repo, encode_path(&rev)), &rev)?;
        repo.commit = info
            .get("sha")
            .and_then(|s| s.as_str())
            .filter(|s| s.len() >= 7 && s.bytes().all(|b| b.is_ascii_alphanumeric()))
            .ok_or_else(|| RemoteError::BadResponse { url: base.clone(), what: "the revision API answered without a commit sha".into() })?
            .to_string();
        repo.list_tree(&rev)?;
        tracing::info!("{base}: revision {rev} is commit {}; {} entries", repo.commit, repo.entries.len());
        Ok(repo)
    }

    fn authorized(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Map a refused API answer to what the user should do.
    fn refused(&self, status: StatusCode, headers: &HeaderMap, rev: &str) -> RemoteError {
        let code = headers.get("x-error-code").and_then(|v| v.to_str().ok()).unwrap_or("");
        let url = self.base.clone();
        match (status.as_u16(), code) {
            (_, "GatedRepo") => RemoteError::Gated { url },
            (401, _) if self.token.is_none() => RemoteError::Denied {
                url,
                status: 401,
                hint: "the repository is private or does not exist: set HF_TOKEN (or log in with `hf auth login`)".into(),
            },
            (401 | 403, _) => RemoteError::Denied { url, status: status.as_u16(), hint: "the token (HF_TOKEN) has no access to this repository".into() },
            (404, "RevisionNotFound") => RemoteError::NotFound { url, hint: format!(": no revision {rev:?} in the repository") },
            (404, "EntryNotFound") => RemoteError::NotFound { url, hint: String::new() },
            (404, _) => RemoteError::NotFound { url, hint: ": no such repository (or it is private: set HF_TOKEN)".into() },
            (s, _) => RemoteError::Failed { url, cause: format!("the Hub answered {s}") },
        }
    }

    /// GET a JSON API path on the Hub, with retries on transient failures.
    fn api(&self, path_and_query: &str, rev: &str) -> Result<serde_json::Value, RemoteError> {
        let (v, _) = self.api_page(&format!("{}{path_and_query}", self.endpoint), rev)?;
        Ok(v)
    }

    fn api_page(&self, full_url: &str, rev: &str) -> Result<(serde_json::Value, Option<String>), RemoteError> {
        let mut last = String::new();
        for attempt in 1..=self.attempts as u32 {
            if attempt > 1 {
                std::thread::sleep(super::backoff(attempt - 1));
            }
            let started = Instant::now();
            let got = block_on(async {
                let r = self.authorized(self.hub.get(full_url)).send().await;
                match r {
                    Err(e) => Err(Err(e)),
                    Ok(r) => {
                        let status = r.status();
                        let headers = r.headers().clone();
                        if !status.is_success() {
                            return Err(Ok((status, headers)));
                        }
                        let body = body_capped(r, MAX_API_BODY).await;
                        Ok((status, headers, body))
                    }
                }
            });
            match got {
                Ok((status, headers, body)) => {
                    stats::note_response(Some(status.as_u16()), started.elapsed());
                    let body = body.map_err(|e| RemoteError::BadResponse { url: self.base.clone(), what: e.to_string() })?;
                    let v = serde_json::from_slice(&body)
                        .map_err(|e| RemoteError::BadResponse { url: self.base.clone(), what: format!("the API's answer is not JSON: {e}") })?;
                    return Ok((v, next_link(&headers)));
                }
                Err(Ok((status, headers))) => {
                    stats::note_response(Some(status.as_u16()), started.elapsed());
                    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                        last = format!("the Hub answered {status}");
                        continue;
                    }
                    return Err(self.refused(status, &headers, rev));
                }
                Err(Err(e)) => {
                    stats::note_response(None, started.elapsed());
                    if e.is_connect() && attempt >= 3 {
                        return Err(RemoteError::Unreachable { url: self.base.clone(), cause: format!("{} ({})", self.endpoint, super::with_root_cause(&e)) });
                    }
                    last = e.to_string();
                }
            }
        }
        Err(RemoteError::Failed { url: self.base.clone(), cause: format!("gave up after {} attempts: {last}", self.attempts) })
    }

    fn list_tree(&mut self, rev: &str) -> Result<(), RemoteError> {
        let mut next = Some(format!("{}/api/models/{}/tree/{}?recursive=true", self.endpoint, self.repo, self.commit));
        let mut pages = 0;
        while let Some(u) = next.take() {
            pages += 1;
            if pages > MAX_TREE_PAGES {
                return Err(RemoteError::BadResponse { url: self.base.clone(), what: format!("the tree listing goes on past {MAX_TREE_PAGES} pages") });
            }
            // A next page must be on the Hub's own host (the token goes with it).
            if origin(&u) != origin(&self.endpoint) {
                return Err(RemoteError::BadResponse { url: self.base.clone(), what: "the tree listing's next page is on another host".into() });
            }
            let (v, link) = self.api_page(&u, rev)?;
            let list = v.as_array().ok_or_else(|| RemoteError::BadResponse { url: self.base.clone(), what: "the tree API's answer is not a list".into() })?;
            for e in list {
                let path = e.get("path").and_then(|p| p.as_str()).unwrap_or("").trim_matches('/');
                if path.is_empty() || path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
                    continue;
                }
                let kind = match e.get("type").and_then(|t| t.as_str()) {
                    Some("directory") => Kind::Dir,
                    Some("file") => {
                        let size = e.get("size").and_then(|s| s.as_u64()).unwrap_or(0);
                        let lfs = e.get("lfs").and_then(|l| l.get("oid")).and_then(|o| o.as_str()).map(|s| s.to_ascii_lowercase());
                        let lfs = lfs.filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()));
                        if lfs.is_some() {
                            self.lfs.insert(path.to_string());
                        }
                        let etag = e.get("oid").and_then(|o| o.as_str()).map(str::to_string);
                        Kind::File(Meta { size, pin: Pin { etag, version: Some(self.commit.clone()), sha256: lfs } })
                    }
                    _ => continue,
                };
                self.entries.insert(path.to_string(), kind);
            }
            next = link;
        }
        // Directories implied by paths, and each directory's children.
        let paths: Vec<String> = self.entries.keys().cloned().collect();
        for p in &paths {
            let mut cur = p.as_str();
            while let Some((parent, _)) = cur.rsplit_once('/') {
                self.entries.entry(parent.to_string()).or_insert(Kind::Dir);
                cur = parent;
            }
        }
        for (p, k) in &self.entries {
            let (parent, name) = p.rsplit_once('/').unwrap_or(("", p));
            self.children.entry(parent.to_string()).or_default().push((name.to_string(), k.clone()));
        }
        Ok(())
    }

    fn resolve_url(&self, key: &str) -> String {
        format!("{}/{}/resolve/{}/{}", self.endpoint, self.repo, self.commit, encode_path(key))
    }

    /// The URL to read `key` from: the presigned CDN URL for an LFS file (resolved when not
    /// held or about to expire), `resolve` itself for a small file.
    fn read_url(&self, key: &str, meta: &Meta) -> Result<String, RemoteError> {
        if !self.lfs.contains(key) {
            return Ok(self.resolve_url(key));
        }
        if let Some((u, until)) = self.resolved.lock().get(key)
            && Instant::now() < *until
        {
            return Ok(u.clone());
        }
        let started = Instant::now();
        let url = self.url(key);
        let request = self.authorized(self.hub.head(self.resolve_url(key)).header("Accept-Encoding", "identity"));
        let r = block_on(async move { request.send().await });
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                stats::note_response(None, started.elapsed());
                return Err(RemoteError::Failed { url, cause: format!("resolving the file failed: {}", e.without_url()) });
            }
        };
        stats::note_response(Some(r.status().as_u16()), started.elapsed());
        let status = r.status();
        if status.is_success() {
            return Ok(self.resolve_url(key));
        }
        if !status.is_redirection() {
            return Err(match status.as_u16() {
                500..=599 | 429 => RemoteError::Failed { url, cause: format!("resolving the file: the Hub answered {status}") },
                _ => self.refused(status, r.headers(), &self.commit),
            });
        }
        let h = r.headers();
        let location = h
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| RemoteError::BadResponse { url: url.clone(), what: "a redirect without a Location".into() })?;
        let location = if location.starts_with('/') { format!("{}{location}", self.endpoint) } else { location.to_string() };
        if let (Some(linked), Some(pinned)) = (h.get("x-linked-etag").and_then(|v| v.to_str().ok()), meta.pin.sha256.as_ref())
            && unquote(linked).to_ascii_lowercase() != *pinned
        {
            return Err(RemoteError::Changed { url, what: format!("X-Linked-Etag is {} where sha256 {pinned} was pinned", unquote(linked)) });
        }
        let life = expires_in(&location).unwrap_or(3600);
        let until = Instant::now() + Duration::from_secs(life.saturating_mul(9) / 10);
        self.resolved.lock().insert(key.to_string(), (location.clone(), until));
        Ok(location)
    }
}

enum Attempt {
    Done,
    /// Retry (after backoff) from where the body stopped.
    Retry(String),
    /// Resolve the URL again and retry at once.
    Reresolve(String),
    Fail(RemoteError),
}

impl Namespace for Repo {
    fn url(&self, key: &str) -> String {
        if key.is_empty() { self.base.clone() } else { format!("{}/{key}", self.base) }
    }

    fn stat(&self, key: &str) -> Result<Option<Kind>, RemoteError> {
        if key.is_empty() {
            return Ok(Some(Kind::Dir));
        }
        Ok(self.entries.get(key).cloned())
    }

    fn list_dir(&self, dir: &str) -> Result<Listing, RemoteError> {
        Ok(self.children.get(dir).cloned().unwrap_or_default())
    }

    fn read(&self, key: &str, meta: &Meta, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError> {
        let url = self.url(key);
        let mut filled = 0usize;
        let mut last = String::new();
        let mut attempt = 0u32;
        while (attempt as usize) < self.attempts {
            attempt += 1;
            let target = match self.read_url(key, meta) {
                Ok(t) => t,
                Err(e @ RemoteError::Failed { .. }) => {
                    last = e.to_string();
                    std::thread::sleep(super::backoff(attempt));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let to_hub = origin(&target) == origin(&self.endpoint);
            let start = offset + filled as u64;
            let end = offset + buf.len() as u64;
            let started = Instant::now();
            let deadline = self.config.deadline((end - start).max(1));
            let outcome = block_on(async {
                let work = async {
                    let client = if to_hub { &self.hub } else { &self.cdn };
                    let mut rb = client.get(&target).header("Range", format!("bytes={start}-{}", end - 1)).header("Accept-Encoding", "identity");
                    if to_hub {
                        rb = self.authorized(rb);
                    }
                    let mut r = match rb.send().await {
                        Ok(r) => r,
                        Err(e) => {
                            stats::note_response(None, started.elapsed());
                            return Attempt::Retry(format!("request failed: {}", e.without_url()));
                        }
                    };
                    stats::note_response(Some(r.status().as_u16()), started.elapsed());
                    let status = r.status();
                    match status.as_u16() {
                        206 => {}
                        200 => {
                            return Attempt::Fail(RemoteError::BadResponse {
                                url: url.clone(),
                                what: "answered 200 (the whole object) where a range was asked".into(),
                            });
                        }
                        403 if !to_hub => return Attempt::Reresolve("the CDN answered 403 (the presigned URL expired)".into()),
                        404 => return Attempt::Fail(RemoteError::NotFound { url: url.clone(), hint: String::new() }),
                        412 => return Attempt::Fail(RemoteError::Changed { url: url.clone(), what: "412".into() }),
                        416 => {
                            return Attempt::Fail(RemoteError::BadResponse { url: url.clone(), what: "416: the server says the range is past the end".into() });
                        }
                        429 | 500..=599 => return Attempt::Retry(format!("the server answered {status}")),
                        300..=399 => {
                            return Attempt::Fail(RemoteError::BadResponse {
                                url: url.clone(),
                                what: format!("answered {status}, a redirect, to a ranged read"),
                            });
                        }
                        _ => return Attempt::Fail(self.refused(status, r.headers(), &self.commit)),
                    }
                    let cr = r.headers().get(reqwest::header::CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or("");
                    let want = format!("bytes {start}-{}/{}", end - 1, meta.size);
                    if cr != want {
                        return Attempt::Fail(RemoteError::BadResponse { url: url.clone(), what: format!("Content-Range {cr:?} where {want:?} was asked") });
                    }
                    if let Some(len) = r.content_length()
                        && len != end - start
                    {
                        return Attempt::Fail(RemoteError::BadResponse {
                            url: url.clone(),
                            what: format!("Content-Length {len} for a range of {} bytes", end - start),
                        });
                    }
                    loop {
                        match r.chunk().await {
                            Ok(Some(c)) => {
                                if filled + c.len() > buf.len() {
                                    return Attempt::Fail(RemoteError::BadResponse { url: url.clone(), what: "the body is longer than the range".into() });
                                }
                                buf[filled..filled + c.len()].copy_from_slice(&c);
                                filled += c.len();
                            }
                            Ok(None) if filled == buf.len() => return Attempt::Done,
                            Ok(None) => return Attempt::Retry(format!("the body ended after {} of {} bytes", filled, buf.len())),
                            Err(e) => return Attempt::Retry(format!("the body broke off after {filled} of {} bytes: {}", buf.len(), e.without_url())),
                        }
                    }
                };
                tokio::time::timeout(deadline, work)
                    .await
                    .unwrap_or_else(|_| Attempt::Retry(format!("no complete answer within {deadline:?} (a stalled or trickling server)")))
            });
            match outcome {
                Attempt::Done => {
                    stats::note_bytes(buf.len() as u64, started.elapsed());
                    return Ok(());
                }
                Attempt::Fail(e) => {
                    stats::note_error("bad_response");
                    tracing::warn!("{e}");
                    return Err(e);
                }
                Attempt::Reresolve(why) => {
                    tracing::info!("{url}: {why}: resolving again");
                    self.resolved.lock().remove(key);
                    last = why;
                }
                Attempt::Retry(why) => {
                    tracing::info!(
                        "{url}: {why} (attempt {attempt} of {}, from {}; going on from byte {})",
                        self.attempts,
                        no_query(&target),
                        offset + filled as u64
                    );
                    last = why;
                    std::thread::sleep(super::backoff(attempt));
                }
            }
        }
        stats::note_error("retries_spent");
        let e = RemoteError::Failed { url, cause: format!("gave up after {} attempts: {last}", self.attempts) };
        tracing::warn!("{e}");
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn url_pieces() {
        assert_eq!(origin("https://cdn.example:8443/a/b?x=1"), "https://cdn.example:8443");
        assert_eq!(no_query("https://h/p?X-Amz-Signature=s"), "https://h/p");
        assert_eq!(expires_in("https://h/p?a=1&X-Amz-Expires=60&b=2"), Some(60));
        assert_eq!(expires_in("https://h/p"), None);
        assert_eq!(unquote("\"abc\""), "abc");
        assert_eq!(encode_path("a b/c+d.gguf"), "a%20b/c%2Bd.gguf");
        let mut h = HeaderMap::new();
        h.insert(reqwest::header::LINK, HeaderValue::from_static("<https://hub/api/x?cursor=2>; rel=\"next\""));
        assert_eq!(next_link(&h).as_deref(), Some("https://hub/api/x?cursor=2"));
    }
}
