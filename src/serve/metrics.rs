//! The mount's metrics registry and the Prometheus endpoint (`-o metrics=ADDR:PORT`).
//!
//! [`registry`] gathers every metric of a mount under the prefix `xpackfs_`: the read
//! counters, errors and latency ([`super::fs::Stats`]), the memory tier (`xpackfs_cache_*`)
//! and the disk cache (`xpackfs_disk_cache_*`), each declared once with
//! [`crate::metrics::metric_set!`]; and values the storage layer keeps in its own structures
//! (the compute pool's counters, sizes and bounds, passthrough), read from their snapshots
//! at each scrape. `/.xpackfs/stats.json` shows the same metrics (same atomics, same
//! snapshots).
//!
//! The endpoint is a minimal HTTP/1.1 server on one plain thread (the daemon has no async
//! runtime): it listens on exactly the address given, answers `GET /metrics` (and `HEAD`)
//! with the registry as OpenMetrics text, other paths with 404 and other methods with 405,
//! reads at most [`MAX_HEAD`] bytes of request head, times out slow clients, and closes
//! every connection after one answer. Scrapes are rare and cheap, so connections are served
//! one at a time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::{Registry, Sample, Snapshot};
use crate::store::FileEntries;
use crate::view::Tiers;

use super::fs::Stats;
use super::passthrough::Passthrough;

/// Largest request head read (request line and headers).
pub const MAX_HEAD: usize = 8 << 10;
/// Read and write timeout of a connection.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The OpenMetrics text format `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric of a mount, under `xpackfs_` (see the module documentation).
pub fn registry(stats: &Stats, tiers: Arc<Tiers>, files: usize, entries: Option<Arc<FileEntries>>, passthrough: Arc<Passthrough>) -> Registry {
    use std::sync::atomic::Ordering::Relaxed;
    let mut r = Registry::with_prefix("xpackfs");
    stats.register(&mut r);
    tiers.mem.stats.register(r.sub_registry_with_prefix("cache"));
    r.register("compute_run_seconds", "Time each compute job ran (power-of-two buckets)", tiers.pool.stats().run_latency.clone());
    if let Some(d) = &tiers.disk {
        d.stats.register(r.sub_registry_with_prefix("disk_cache"));
    }
    let started = Instant::now();
    r.register_collector(Box::new(Snapshot(move || {
        use Sample::{Counter as C, Gauge as G};
        let g = |v: u64| G(v.min(i64::MAX as u64) as i64);
        let mem = tiers.mem.snapshot();
        let cs = tiers.compute_snapshot();
        let mut v = vec![
            ("uptime_seconds", "Seconds since the mount started", g(started.elapsed().as_secs())),
            ("files", "Files of the view", g(files as u64)),
            ("cache_budget_bytes", "Byte budget of the memory tier (cache_mb)", g(mem.budget_bytes as u64)),
            ("cache_size_bytes", "Bytes of chunks held in the memory tier", g(mem.bytes as u64)),
            ("compute_threads", "Threads of the compute pool", g(cs.threads as u64)),
            ("compute_in_flight", "Compute jobs queued or running", g(cs.in_flight as u64)),
            ("compute_runs_read", "Compute jobs run at read priority", C(cs.runs_read)),
            ("compute_runs_background", "Compute jobs run at background priority", C(cs.runs_background)),
            ("compute_joined", "Requests that joined a compute job already queued or running (single-flight)", C(cs.joined)),
            ("compute_promoted", "Background compute jobs promoted to read priority by a reader", C(cs.promoted)),
            ("compute_hedged", "Background compute jobs a reader computed again at read priority instead of waiting", C(cs.hedged)),
            ("compute_wasted", "Compute results discarded because another run of the job finished first", C(cs.wasted)),
            ("compute_failed", "Compute jobs that failed", C(cs.failed)),
            ("compute_panics", "Compute jobs that panicked", C(cs.panics)),
            ("compute_prefetch_queued", "Read-ahead prefetches queued or running", g(cs.prefetch_queued as u64)),
            ("compute_prefetch_requested", "Read-ahead prefetches asked for", C(cs.prefetch_requested)),
            ("compute_prefetch_dropped", "Read-ahead prefetches dropped (queue full)", C(cs.prefetch_dropped)),
            ("passthrough_enabled", "1 if opens may be handed to the kernel as FUSE passthrough", g(passthrough.is_enabled() as u64)),
            ("passthrough_opens", "Opens served by the kernel from a backing file (FUSE passthrough)", C(passthrough.opens.load(Relaxed))),
            ("passthrough_file_entries_pending", "Whole-file entries waiting to be written behind", g(entries.as_ref().map_or(0, |e| e.pending() as u64))),
        ];
        let remote = crate::source::remote::stats::snapshot();
        v.push(("remote_requests", "HTTP requests sent to remote sources (retries included)", C(remote.requests)));
        v.push(("remote_bytes", "Bytes of remote sources delivered to reads", C(remote.bytes)));
        v.push(("remote_reads", "Remote ranged reads completed", C(remote.reads)));
        v.push(("remote_request_seconds_sum", "Seconds to the answer's headers, summed over remote requests", G(remote.latency_sum_s as i64)));
        let parts = &remote.parts;
        v.push(("remote_parts_fetched", "Parts of remote objects fetched over the network", C(parts.parts_fetched)));
        v.push(("remote_parts_from_disk", "Parts of remote objects read from the disk cache instead of the network", C(parts.parts_from_disk)));
        v.push(("remote_part_hits", "Reads of remote parts already held in memory", C(parts.part_hits)));
        v.push(("remote_prefetch_hits", "Reads of remote parts that read-ahead had fetched", C(parts.prefetch_hits)));
        v.push(("remote_direct_reads", "Remote reads served by a GET of their own range (no sequential stream)", C(parts.direct_reads)));
        v.push(("remote_window_resets", "Remote reads that broke a sequential stream with a read-ahead window", C(parts.window_resets)));
        v.push((
            "remote_prefetch_skipped",
            "Remote read-ahead not started: for want of memory or queue room, or its readers had gone past the part",
            C(parts.prefetch_skipped),
        ));
        v.push(("remote_parts_recycled", "Remote parts every sequential reader had passed, their memory taken over by a new part", C(parts.parts_recycled)));
        v.push(("remote_pressed_reads", "Remote reads served by GETs of their own range (no room in the memory budget)", C(parts.pressed_reads)));
        v.push(("remote_parts_in_flight", "Remote part GETs in flight now", g(parts.in_flight)));
        v.push(("remote_memory_used_bytes", "Bytes of remote parts held or being fetched", g(parts.memory_used_bytes)));
        v.push(("remote_memory_budget_bytes", "Bound of remote parts in memory (remote_memory_mb)", g(parts.memory_budget_bytes)));
        for (answer, n) in &remote.answers {
            if let Some(name) = crate::source::remote::stats::answer_metric(answer) {
                v.push((name, "Remote requests by answer (status class, or a transport error)", C(*n)));
            }
        }
        for (cause, n) in &remote.failures {
            if let Some(name) = crate::source::remote::stats::failure_metric(cause) {
                v.push((name, "Remote reads that failed, or requests abandoned and retried, by cause", C(*n)));
            }
        }
        if let Some(d) = &tiers.disk {
            v.push(("disk_cache_budget_bytes", "Bound of the disk cache in bytes (disk_cache_gb)", g(d.budget())));
            v.push(("disk_cache_size_bytes", "Bytes of entries in the disk cache directory (shared by every process using it)", g(d.size_bytes())));
        }
        v
    })));
    r
}

/// Listen on exactly `addr` and serve `GET /metrics` from `registry` on a thread of its own.
/// Fails (the mount is refused) when the address cannot be bound, e.g. in use.
pub fn serve(addr: SocketAddr, registry: Arc<Registry>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new().name("xpackfs-metrics".into()).spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    if let Err(e) = answer(stream, &registry) {
                        tracing::debug!("metrics endpoint: {e}");
                    }
                }
                Err(e) => {
                    tracing::warn!("metrics endpoint: accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })?;
    tracing::info!("metrics: serving http://{local}/metrics");
    Ok(local)
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Metrics { head_only: bool },
    NotFound,
    MethodNotAllowed,
    BadRequest,
    TooLarge,
}

/// The answer to a request head (`head`: the bytes up to and including the blank line, or
/// what was read when the head did not end within [`MAX_HEAD`]).
fn route(head: &[u8], complete: bool) -> Answer {
    if !complete {
        return Answer::TooLarge;
    }
    let Ok(text) = std::str::from_utf8(head) else { return Answer::BadRequest };
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Answer::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Answer::BadRequest;
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => Answer::Metrics { head_only: false },
        ("HEAD", "/metrics") => Answer::Metrics { head_only: true },
        ("GET" | "HEAD", _) => Answer::NotFound,
        _ => Answer::MethodNotAllowed,
    }
}

/// Read the request head: up to the blank line, at most [`MAX_HEAD`] bytes.
fn read_head(stream: &mut TcpStream) -> std::io::Result<(Vec<u8>, bool)> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok((head, false));
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end + 4);
            return Ok((head, true));
        }
        if head.len() > MAX_HEAD {
            return Ok((head, false));
        }
    }
}

fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let (head, complete) = read_head(&mut stream)?;
    if head.is_empty() {
        return Ok(());
    }
    let (status, content_type, body, head_only) = match route(&head, complete) {
        Answer::Metrics { head_only } => ("200 OK", CONTENT_TYPE, crate::metrics::render(registry), head_only),
        Answer::NotFound => ("404 Not Found", "text/plain; charset=utf-8", "not found: the metrics are at /metrics\n".into(), false),
        Answer::MethodNotAllowed => ("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET and HEAD\n".into(), false),
        Answer::BadRequest => ("400 Bad Request", "text/plain; charset=utf-8", "bad request\n".into(), false),
        Answer::TooLarge => ("431 Request Header Fields Too Large", "text/plain; charset=utf-8", "request head too large\n".into(), false),
    };
    let allow = if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" };
    let mut out =
        format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n", body.len()).into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&out)?;
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let r = |s: &str| route(s.as_bytes(), true);
        assert_eq!(r("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Answer::Metrics { head_only: false });
        assert_eq!(r("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Answer::Metrics { head_only: false });
        assert_eq!(r("HEAD /metrics HTTP/1.1\r\n\r\n"), Answer::Metrics { head_only: true });
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Answer::NotFound);
        assert_eq!(r("POST /metrics HTTP/1.1\r\n\r\n"), Answer::MethodNotAllowed);
        assert_eq!(r("GET /metrics\r\n\r\n"), Answer::BadRequest);
        assert_eq!(r("GET /metrics SPDY/3\r\n\r\n"), Answer::BadRequest);
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\n", false), Answer::TooLarge);
    }

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_registry() {
        let c = crate::metrics::Counter::default();
        let mut r = Registry::with_prefix("xpackfs");
        r.register("bytes_served", "Bytes", c.clone());
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::new(r)).unwrap();
        assert!(addr.ip().is_loopback());
        c.inc_by(7);
        let ok = get(addr, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")), "{ok}");
        assert!(ok.contains("# TYPE xpackfs_bytes_served counter\n") && ok.contains("xpackfs_bytes_served_total 7\n"), "{ok}");
        assert!(get(addr, b"GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(get(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        // A head that does not end within MAX_HEAD bytes (all of it read, so no reset).
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD + 1, b'a');
        assert!(get(addr, &big).starts_with("HTTP/1.1 431 "));
        // The address is taken now: a second endpoint on it is refused.
        assert_eq!(serve(addr, Arc::new(Registry::default())).unwrap_err().kind(), std::io::ErrorKind::AddrInUse);
    }
}
