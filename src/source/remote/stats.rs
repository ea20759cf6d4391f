//! What remote sources cost, process-wide: HTTP requests by answer (status class or
//! transport error), bytes delivered to readers, read latency, failed reads by cause.
//! Every HTTP request `object_store` and the Hub client send goes through
//! [`CountingConnector`] / [`note_response`], so retries are counted as the requests they
//! are. Serving exports a [`snapshot`] in `stats.json` and on the metrics endpoint. No URL,
//! header or query string is recorded.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use object_store::client::{HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector};
use parking_lot::Mutex;

/// Upper bounds (seconds) of the latency histogram's buckets.
pub const LATENCY_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes: AtomicU64,
    reads: AtomicU64,
    /// Requests by answer: "2xx", "3xx", "404", "412", "4xx", "5xx", "error".
    answers: Mutex<BTreeMap<&'static str, u64>>,
    /// Failed reads by cause.
    failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Time to the answer's headers, per request.
    latency: Mutex<[u64; LATENCY_BUCKETS.len() + 1]>,
    latency_sum_us: AtomicU64,
}

fn counters() -> &'static Counters {
    static C: OnceLock<Counters> = OnceLock::new();
    C.get_or_init(Counters::default)
}

/// One HTTP answer (or a transport error, `status` None) after `elapsed`.
pub fn note_response(status: Option<u16>, elapsed: Duration) {
    let c = counters();
    c.requests.fetch_add(1, Ordering::Relaxed);
    let key = match status {
        None => "error",
        Some(404) => "404",
        Some(412) => "412",
        Some(s) if (200..300).contains(&s) => "2xx",
        Some(s) if (300..400).contains(&s) => "3xx",
        Some(s) if (400..500).contains(&s) => "4xx",
        Some(_) => "5xx",
    };
    *c.answers.lock().entry(key).or_default() += 1;
    let secs = elapsed.as_secs_f64();
    let i = LATENCY_BUCKETS.iter().position(|&b| secs <= b).unwrap_or(LATENCY_BUCKETS.len());
    c.latency.lock()[i] += 1;
    c.latency_sum_us.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
}

/// A read that delivered `n` bytes.
pub fn note_bytes(n: u64, _elapsed: Duration) {
    let c = counters();
    c.bytes.fetch_add(n, Ordering::Relaxed);
    c.reads.fetch_add(1, Ordering::Relaxed);
}

/// A read that failed, by cause.
pub fn note_error(cause: &'static str) {
    *counters().failures.lock().entry(cause).or_default() += 1;
}

/// The metric name of an answer class of [`Snapshot::answers`].
pub fn answer_metric(answer: &str) -> Option<&'static str> {
    Some(match answer {
        "2xx" => "remote_answers_2xx",
        "3xx" => "remote_answers_3xx",
        "404" => "remote_answers_404",
        "412" => "remote_answers_412",
        "4xx" => "remote_answers_4xx",
        "5xx" => "remote_answers_5xx",
        "error" => "remote_answers_transport_error",
        _ => return None,
    })
}

/// The metric name of a cause of [`Snapshot::failures`].
pub fn failure_metric(cause: &str) -> Option<&'static str> {
    Some(match cause {
        "bad_response" => "remote_failures_bad_response",
        "changed" => "remote_failures_changed",
        "unreachable" => "remote_failures_unreachable",
        "denied" => "remote_failures_denied",
        "not_found" => "remote_failures_not_found",
        "failed" => "remote_failures_failed",
        "retries_spent" => "remote_failures_retries_spent",
        "timeout_retried" => "remote_failures_timeout_retried",
        _ => return None,
    })
}

/// The counters now.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Snapshot {
    pub requests: u64,
    pub bytes: u64,
    pub reads: u64,
    pub answers: BTreeMap<String, u64>,
    pub failures: BTreeMap<String, u64>,
    /// Cumulative counts per bucket of [`LATENCY_BUCKETS`] (then +Inf).
    pub latency_buckets: Vec<u64>,
    pub latency_sum_s: f64,
    /// The parts tier: memory, read-ahead, hits ([`super::parts`]).
    pub parts: super::parts::Snapshot,
}

pub fn snapshot() -> Snapshot {
    let c = counters();
    let raw = *c.latency.lock();
    let mut acc = 0;
    let latency_buckets = raw
        .iter()
        .map(|n| {
            acc += n;
            acc
        })
        .collect();
    Snapshot {
        requests: c.requests.load(Ordering::Relaxed),
        bytes: c.bytes.load(Ordering::Relaxed),
        reads: c.reads.load(Ordering::Relaxed),
        answers: c.answers.lock().iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        failures: c.failures.lock().iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        latency_buckets,
        latency_sum_s: c.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        parts: super::parts::snapshot(),
    }
}

/// `object_store`'s own HTTP client, with every request counted.
#[derive(Debug, Default)]
pub struct CountingConnector(ReqwestConnector);

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &object_store::ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Counting(self.0.connect(options)?)))
    }
}

#[derive(Debug)]
struct Counting(HttpClient);

#[async_trait::async_trait]
impl HttpService for Counting {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let started = Instant::now();
        let r = self.0.execute(req).await;
        note_response(r.as_ref().ok().map(|r| r.status().as_u16()), started.elapsed());
        r
    }
}
