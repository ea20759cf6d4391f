//! Remote sources: checkpoints read where they live, on S3 (and S3-compatible servers),
//! GCS, Azure Blob, any HTTP(S) server with Range support, or the Hugging Face Hub.
//!
//! A remote URL travels through the program as a path (`s3://bucket/dir/model.gguf`); the
//! source layer asks this module what is at such a path ([`stat`], [`list_dir`]) and opens
//! objects ([`open`]) as it would local files. Each bucket (container, host, Hub repository
//! at a revision) is a [`Namespace`], made once per process and shared by every file in it.
//!
//! What this module guarantees:
//! - **Pinned identity.** An object's size and ETag (and version id where the store has
//!   them; for the Hub, the revision resolved to its commit) are taken when it is first
//!   seen, and every ranged read is conditional on them: an object replaced while in use
//!   fails the reads it affects ([`RemoteError::Changed`]), never mixing old and new bytes.
//! - **Bytes checked.** A reply is used only if it is a 206 whose `Content-Range` is the
//!   range asked for and whose body is exactly that long; anything else is an error naming
//!   what the server did.
//! - **Bounded retries.** Transient failures (5xx, throttling, resets, cut bodies, stalls)
//!   are retried with full-jitter exponential backoff, a cut body resumed from its last
//!   byte; a stall (no byte for the read timeout) abandons the connection. When retries are
//!   spent the read fails (EIO at the FUSE edge) and later reads try again.
//! - **No secrets out.** Tokens, keys and presigned query strings never appear in errors,
//!   logs or statistics.
//!
//! The network clients are `object_store` (S3, GCS, Azure, HTTP: `objects.rs`) and, for
//! the Hub's file protocol, which `object_store` does not speak, a small client on the same
//! HTTP stack (`hub.rs`). Both run on one process-wide tokio runtime; callers are ordinary
//! threads that block on it.

mod creds;
mod hub;
mod objects;
pub mod parts;
pub mod stats;
mod url;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

pub use url::{RemoteUrl, Scheme, UrlError};

/// How remote sources are reached: set once per process from the command line
/// ([`configure`]); the environment fills in the rest (credentials, `AWS_ENDPOINT_URL`,
/// `HF_ENDPOINT`, ...).
#[derive(Debug, Clone)]
pub struct Config {
    /// S3-compatible endpoint (`-o endpoint=URL`; else `AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
    /// S3 region (`-o region=`; else the environment or the profile; else us-east-1).
    pub region: Option<String>,
    /// Read public buckets without credentials (`-o no_sign_request`).
    pub no_sign_request: bool,
    /// Attempts per request before a read fails.
    pub max_attempts: usize,
    /// No byte for this long abandons a connection (and retries).
    pub stall_timeout: Duration,
    pub connect_timeout: Duration,
    /// The slowest transfer accepted, bytes per second: a request for `n` bytes is given
    /// `stall_timeout + n / min_rate` in all before it is abandoned (and retried), so a
    /// server that trickles bytes cannot hold a read forever, and a large part on a slow
    /// link is not failed by a fixed whole-request timeout.
    pub min_rate: u64,
}

impl Config {
    /// The time a request for `n` bytes may take in all.
    pub fn deadline(&self, n: u64) -> Duration {
        self.stall_timeout + Duration::from_secs_f64(n as f64 / self.min_rate.max(1) as f64)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            endpoint: None,
            region: None,
            no_sign_request: false,
            max_attempts: 10,
            stall_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            min_rate: 64 << 10,
        }
    }
}

/// The command-line options of remote sources (flattened into every command that takes a
/// source; `-o endpoint=URL,region=R,no_sign_request` in mount form).
#[derive(Debug, Clone, clap::Args)]
#[group(id = "remote")]
pub struct Options {
    /// S3-compatible endpoint for s3:// sources (default: $AWS_ENDPOINT_URL, else AWS)
    #[arg(long, value_name = "URL", help_heading = "Remote sources")]
    pub endpoint: Option<String>,
    /// Region of s3:// sources (default: $AWS_REGION, the profile's, else us-east-1)
    #[arg(long, value_name = "REGION", help_heading = "Remote sources")]
    pub region: Option<String>,
    /// Read s3:// sources without signing (public buckets, no credentials)
    #[arg(long, help_heading = "Remote sources")]
    pub no_sign_request: bool,
    /// Attempts per remote request before the read fails (EIO)
    #[arg(long, default_value = "10", value_parser = crate::util::args::int_in::<usize>(1, 100), help_heading = "Remote sources")]
    pub remote_attempts: usize,
    /// Seconds without a byte after which a remote connection is abandoned and retried
    #[arg(long, default_value = "30", value_parser = crate::util::args::int_in::<u64>(1, 3600), help_heading = "Remote sources")]
    pub remote_stall_timeout_s: u64,
    /// Slowest accepted transfer, KiB/s: a request for N bytes gets the stall timeout plus
    /// N at this rate in all, then is abandoned and retried
    #[arg(long, default_value = "64", value_parser = crate::util::args::int_in::<u64>(1, 1 << 30), help_heading = "Remote sources")]
    pub remote_min_rate_kib: u64,
    /// Bytes per remote GET of a sequential reader (a part), MiB
    #[arg(long, default_value = "8", value_parser = crate::util::args::int_in::<u64>(1, 1024), help_heading = "Remote sources")]
    pub remote_part_mb: u64,
    /// Memory for remote parts held and in flight, every object together, MiB (default: an
    /// eighth of RAM, 256 MiB to 4 GiB)
    #[arg(long, value_parser = crate::util::args::int_in::<u64>(16, 1 << 20), help_heading = "Remote sources")]
    pub remote_memory_mb: Option<u64>,
    /// Remote GETs in flight ahead of readers, every object together
    #[arg(long, default_value = "16", value_parser = crate::util::args::int_in::<usize>(1, 256), help_heading = "Remote sources")]
    pub remote_concurrency: usize,
}

impl Options {
    /// Make these the process's settings ([`configure`]).
    pub fn apply(&self) {
        configure(Config {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            no_sign_request: self.no_sign_request,
            max_attempts: self.remote_attempts,
            stall_timeout: Duration::from_secs(self.remote_stall_timeout_s),
            min_rate: self.remote_min_rate_kib << 10,
            ..Config::default()
        });
        let part_size = self.remote_part_mb << 20;
        let mut memory_budget = self.remote_memory_mb.map_or_else(parts::default_memory_budget, |m| m << 20);
        if memory_budget < part_size {
            // Not even one part would fit: every read would be a GET of its own range.
            tracing::warn!("remote_memory_mb ({} MiB) is smaller than one part (remote_part_mb={}): using one part", memory_budget >> 20, self.remote_part_mb);
            memory_budget = part_size;
        }
        parts::configure(parts::PartConfig { part_size, memory_budget, concurrency: self.remote_concurrency, ..parts::PartConfig::default() });
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Set how remote sources are reached (once, before the first remote path is touched; a
/// later call is ignored and says so).
pub fn configure(config: Config) {
    if CONFIG.set(config).is_err() {
        tracing::debug!("remote sources were configured already");
    }
}

fn config() -> &'static Config {
    CONFIG.get_or_init(Config::default)
}

/// The process's runtime for network I/O (two workers: the work is waiting, not computing).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("xpackfs-net")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the network runtime: {e}"))
    })
}

/// Run a future to completion on the network runtime from an ordinary thread.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RemoteError {
    #[error("{url}: not found{hint}")]
    NotFound { url: String, hint: String },
    #[error("{url}: access denied ({status}): {hint}")]
    Denied { url: String, status: u16, hint: String },
    #[error("{url}: the repository is gated: request access on its page, then use a token of an account that has it (HF_TOKEN)")]
    Gated { url: String },
    #[error("{url}: cannot reach the server: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("{url}: changed on the server since it was opened ({what}): remount to see the new version")]
    Changed { url: String, what: String },
    #[error("{url}: the server's answer is unusable: {what}")]
    BadResponse { url: String, what: String },
    #[error("{url}: {cause}")]
    Failed { url: String, cause: String },
    #[error("{url}: {what}")]
    Unsupported { url: String, what: String },
    /// A path that looks like a remote URL but is not a valid one.
    #[error("{url}: {source}")]
    BadUrl { url: String, source: UrlError },
}

/// What identifies one version of an object: checked on every read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pin {
    pub etag: Option<String>,
    pub version: Option<String>,
    /// The content's sha256 where the store states it (the Hub's LFS oid), lowercase hex.
    pub sha256: Option<String>,
}

impl Pin {
    /// The pin as one string, for identity keys.
    pub fn describe(&self) -> String {
        format!("etag={};version={};sha256={}", self.etag.as_deref().unwrap_or(""), self.version.as_deref().unwrap_or(""), self.sha256.as_deref().unwrap_or(""))
    }
}

/// An object's size and pin, as seen when it was first listed or opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub size: u64,
    pub pin: Pin,
}

/// What is at a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File(Meta),
    Dir,
}

/// A directory's entries: names and what each is.
pub type Listing = Vec<(String, Kind)>;

/// One bucket, container, host or Hub repository at a revision.
pub(crate) trait Namespace: Send + Sync + std::fmt::Debug {
    /// The URL of `key` in this namespace, for messages.
    fn url(&self, key: &str) -> String;
    /// What is at `key` ("" is the root), or `None`.
    fn stat(&self, key: &str) -> Result<Option<Kind>, RemoteError>;
    /// The entries directly under directory `dir` ("" is the root), names only.
    fn list_dir(&self, dir: &str) -> Result<Listing, RemoteError>;
    /// Fill `buf` with the object's bytes from `offset`, as pinned by `meta`, within
    /// [`Config::deadline`] per request.
    fn read(&self, key: &str, meta: &Meta, offset: u64, buf: &mut [u8]) -> Result<(), RemoteError>;
    /// [`Namespace::read`] into a buffer it owns and gives back filled (a part): a namespace
    /// may then run the request off the calling thread.
    fn read_owned(&self, key: &str, meta: &Meta, offset: u64, mut buf: Vec<u8>) -> Result<Vec<u8>, RemoteError> {
        self.read(key, meta, offset, &mut buf)?;
        Ok(buf)
    }
    /// The content's sha256 (lowercase hex) where the store states it for the version
    /// `meta` pins: what was pinned with it (the Hub's LFS oid), or what the store answers
    /// when asked (S3's full-object checksum).
    fn stated_sha256(&self, _key: &str, meta: &Meta) -> Result<Option<String>, RemoteError> {
        Ok(meta.pin.sha256.clone())
    }
}

fn namespaces() -> &'static Mutex<HashMap<String, Arc<dyn Namespace>>> {
    static NS: OnceLock<Mutex<HashMap<String, Arc<dyn Namespace>>>> = OnceLock::new();
    NS.get_or_init(Default::default)
}

/// Is `p` a remote URL (rather than a local path)?
pub fn is_remote(p: &Path) -> bool {
    RemoteUrl::parse_path(p).is_some()
}

/// An error's text with the innermost error of its chain added when the text leaves it out:
/// `object_store` says "error sending request" where the reason is three sources down
/// ("invalid peer certificate: UnknownIssuer", "Connection refused").
pub(super) fn with_root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let text = e.to_string();
    let mut root = e;
    while let Some(next) = root.source() {
        root = next;
    }
    let cause = root.to_string();
    if std::ptr::addr_eq(root, e) || cause.is_empty() || text.contains(&cause) {
        return text;
    }
    // The reason first: a long message is clipped at its end.
    format!("{cause} ({text})")
}

/// Makes ring the process's rustls crypto provider, once, before any client exists: reqwest
/// is built without a provider of its own (`rustls-no-provider`, to keep aws-lc-sys out of
/// the build) and would panic at the first client otherwise. A provider installed earlier by
/// someone else is kept.
fn tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The parsed URL and its namespace (made on first use: for the Hub this resolves the
/// revision, which may fail).
fn resolve(p: &Path) -> Result<(RemoteUrl, Arc<dyn Namespace>), RemoteError> {
    let url = match RemoteUrl::parse_path(p) {
        Some(Ok(u)) => u,
        Some(Err(source)) => return Err(RemoteError::BadUrl { url: p.display().to_string(), source }),
        None => return Err(RemoteError::Unsupported { url: p.display().to_string(), what: "not a remote URL".into() }),
    };
    let name = url.namespace();
    if let Some(ns) = namespaces().lock().get(&name) {
        return Ok((url, ns.clone()));
    }
    // Made outside the lock: making one may take a round trip.
    tls_provider();
    let ns: Arc<dyn Namespace> = match url.scheme {
        Scheme::Hf => Arc::new(hub::Repo::open(&url, config())?),
        _ => Arc::new(objects::Bucket::open(&url, config())?),
    };
    Ok((url, namespaces().lock().entry(name).or_insert(ns).clone()))
}

/// What is at `p`: a file (with its size and pin), a directory, or nothing.
pub fn stat(p: &Path) -> Result<Option<Kind>, RemoteError> {
    let (url, ns) = resolve(p)?;
    ns.stat(&url.key)
}

/// The names directly under directory `p`, sorted, with what each is.
pub fn list_dir(p: &Path) -> Result<Listing, RemoteError> {
    let (url, ns) = resolve(p)?;
    let mut v = ns.list_dir(&url.key)?;
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

/// One remote object, pinned at open.
#[derive(Debug)]
pub struct RemoteObject {
    url: String,
    /// [`RemoteObject::identity_hash`], computed once.
    id: u128,
    fetch: parts::Fetch,
    /// [`RemoteObject::stated_sha256`], asked for once, when first needed.
    stated: OnceLock<Option<String>>,
}

/// Open the object at `p` (it must be a file).
pub fn open(p: &Path) -> Result<RemoteObject, RemoteError> {
    let (url, ns) = resolve(p)?;
    match ns.stat(&url.key)? {
        Some(Kind::File(meta)) => {
            let display = url.display();
            let id = twox_hash::XxHash3_128::oneshot(format!("{display}\0{}\0{}", meta.size, meta.pin.describe()).as_bytes());
            Ok(RemoteObject { url: display, id, fetch: parts::Fetch { ns, key: url.key.clone(), meta }, stated: OnceLock::new() })
        }
        Some(Kind::Dir) => Err(RemoteError::Unsupported { url: url.display(), what: "is a directory (a prefix), not an object".into() }),
        None => Err(RemoteError::NotFound { url: url.display(), hint: String::new() }),
    }
}

impl RemoteObject {
    pub fn url(&self) -> &str {
        &self.url
    }
    pub fn meta(&self) -> &Meta {
        &self.fetch.meta
    }
    pub fn size(&self) -> u64 {
        self.fetch.meta.size
    }

    /// Fill `buf` from `offset`, as pinned at open.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), RemoteError> {
        if buf.is_empty() {
            return Ok(());
        }
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.size()) {
            return Err(RemoteError::Failed {
                url: self.url.clone(),
                cause: format!("read of {} bytes at {offset} is beyond the end of the object ({})", buf.len(), self.size()),
            });
        }
        parts::read(self.id, &self.fetch, offset, buf)
    }

    /// `len` bytes from `offset` without a copy when they lie in one part: the part and
    /// where they start in it ([`parts::read_held`]); `None` otherwise, nothing read.
    pub fn read_held(&self, offset: u64, len: usize) -> Result<Option<parts::HeldPart>, RemoteError> {
        if offset.checked_add(len as u64).is_none_or(|end| end > self.size()) {
            return Err(RemoteError::Failed {
                url: self.url.clone(),
                cause: format!("read of {len} bytes at {offset} is beyond the end of the object ({})", self.size()),
            });
        }
        parts::read_held(self.id, &self.fetch, offset, len)
    }

    /// How far ahead of `offset`, where a read just ended, its reader should have bytes
    /// fetched ([`parts::ahead_bytes`]).
    pub fn ahead_bytes(&self, offset: u64) -> u64 {
        parts::ahead_bytes(self.id, offset)
    }

    /// Whether the parts holding `[offset, offset + len)` are in memory ([`parts::resident`]).
    pub fn resident(&self, offset: u64, len: u64) -> bool {
        parts::resident(self.id, self.fetch.meta.size, offset, len)
    }

    /// Whether reading `[offset, offset + len)` costs no GET ([`parts::kept`]).
    pub fn kept(&self, offset: u64, len: u64) -> bool {
        parts::kept(self.id, self.fetch.meta.size, offset, len)
    }

    /// Fill `buf` from `offset` with bytes already fetched only ([`parts::read_kept`]):
    /// an error naming the object when some are not.
    pub fn read_kept(&self, buf: &mut [u8], offset: u64) -> Result<(), RemoteError> {
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.size()) || !parts::read_kept(self.id, self.size(), offset, buf) {
            return Err(RemoteError::Failed {
                url: self.url.clone(),
                cause: format!("{} bytes at {offset} are not in memory or in the disk cache (not fetched for work no client waits for)", buf.len()),
            });
        }
        Ok(())
    }

    /// Whether the object's version is pinned (an ETag, a version id or a content digest):
    /// without one, a replacement of the same size could not be told from it.
    pub fn pinned(&self) -> bool {
        let p = &self.fetch.meta.pin;
        p.etag.is_some() || p.version.is_some() || p.sha256.is_some()
    }

    /// Have `[offset, offset + len)` fetched ahead ([`parts::prefetch`]); `false` when the
    /// read-ahead queue is full.
    pub fn prefetch(&self, offset: u64, len: u64) -> bool {
        parts::prefetch(self.id, &self.fetch, offset, len)
    }

    /// The content's sha256 (lowercase hex) where the store states it, asked once (one
    /// request for S3; nothing for the Hub, whose oid came with the pin). A store that cannot
    /// be asked counts as stating nothing (logged): the bytes are hashed instead.
    pub fn stated_sha256(&self) -> Option<&str> {
        self.stated
            .get_or_init(|| match self.fetch.ns.stated_sha256(&self.fetch.key, &self.fetch.meta) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("no stated sha256: {e}");
                    None
                }
            })
            .as_deref()
    }

    /// An identity for keys (digest store, disk cache, fetched parts): the URL, the size and
    /// the pin, hashed.
    pub fn identity_hash(&self) -> u128 {
        self.id
    }
}

/// Read a whole small object (JSON side files), refusing one over `max` bytes.
pub fn read_capped(p: &Path, max: u64) -> Result<Vec<u8>, RemoteError> {
    let o = open(p)?;
    if o.size() > max {
        return Err(RemoteError::Failed { url: o.url.clone(), cause: format!("{} bytes, over the cap of {max}", o.size()) });
    }
    let mut buf = vec![0u8; o.size() as usize];
    o.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

/// The URL path `p` names, for messages (a path that lost a slash is shown repaired).
pub fn display(p: &Path) -> PathBuf {
    match RemoteUrl::parse_path(p) {
        Some(Ok(u)) => PathBuf::from(u.display()),
        _ => p.to_path_buf(),
    }
}

/// Full-jitter exponential backoff before attempt `attempt` (1-based): uniform in
/// `0..min(cap, base * 2^attempt)`.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let cap = Duration::from_secs(15);
    let base = Duration::from_millis(100);
    let ceiling = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    let nanos = ceiling.as_nanos() as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    // A cheap per-call random value: the clock's low bits hashed.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    Duration::from_nanos(twox_hash::XxHash3_64::oneshot(&seed.to_le_bytes()) % nanos)
}

#[cfg(test)]
mod tests {
    use super::with_root_cause;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Wrap(&'static str, #[source] std::io::Error);

    #[test]
    fn an_error_names_the_innermost_cause_once() {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        // Three levels, the reason at the bottom: it comes first, the outer text after.
        let e = Wrap("error sending request", std::io::Error::other(Wrap("client error (Connect)", refused())));
        assert_eq!(with_root_cause(&e), "Connection refused (error sending request)");
        // A text that already says it is left alone; so is an error without a source.
        assert_eq!(with_root_cause(&Wrap("Connection refused while connecting", refused())), "Connection refused while connecting");
        assert_eq!(with_root_cause(&refused()), "Connection refused");
    }
}
