//! The Prometheus endpoint (`-o metrics=ADDR:PORT`), through a real mount: OpenMetrics text
//! whose byte counters move with reads and agree with `.xpackfs/stats.json`, listening only
//! on the address given, and a mount refused when that address is taken.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use common::*;

/// A port free now on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn http(port: u16, request: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn scrape(port: u16) -> String {
    let out = http(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(out.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"), "{out}");
    out
}

/// The value of the sample named exactly `name` (labels included) in `text`.
fn sample_value(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Local addresses (hex `ADDR:PORT` as /proc/net/tcp{,6} writes them) of sockets listening
/// on `port`.
fn listeners_on(port: u16) -> Vec<String> {
    let want = format!(":{port:04X}");
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 && f[3] == "0A" && f[1].ends_with(&want) {
                out.push(f[1].to_string());
            }
        }
    }
    out
}

fn stats_json(m: &Mount) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(m.path(".xpackfs/stats.json")).unwrap()).unwrap()
}

#[test]
fn metrics_endpoint_serves_counters_that_move_with_reads() {
    let port = free_port();
    let m = Mount::new(&sample(), &[&format!("metrics=127.0.0.1:{port}")]);
    // Bound to exactly the address given: loopback, never all interfaces.
    assert_eq!(listeners_on(port), [format!("0100007F:{port:04X}")]);

    let before = scrape(port);
    for t in [
        "# TYPE xpackfs_bytes_served counter",
        "# TYPE xpackfs_read_latency_seconds histogram",
        "# TYPE xpackfs_cache_hits counter",
        "# HELP xpackfs_bytes_served ",
        "# TYPE xpackfs_compute_run_seconds histogram",
    ] {
        assert!(before.contains(t), "{t} not in:\n{before}");
    }
    let body = before.split_once("\r\n\r\n").unwrap().1;
    assert!(body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).all(|l| l.starts_with("xpackfs_")), "{body}");
    assert!(before.trim_end().ends_with("# EOF"), "{before}");

    let pack = std::fs::read(m.path("sample-moe.pack")).unwrap();
    let after = scrape(port);
    let served = sample_value(&after, "xpackfs_bytes_served_total");
    assert!(served >= sample_value(&before, "xpackfs_bytes_served_total") + pack.len() as u64, "{after}");
    assert_eq!(sample_value(&after, "xpackfs_served_bytes_total{origin=\"identity\"}"), served);
    assert!(sample_value(&after, "xpackfs_read_latency_seconds_count") >= 1);
    // stats.json is rendered from the same metrics (reading it is not a read of a view file).
    let stats = stats_json(&m);
    assert_eq!(stats["bytes_served"].as_u64().unwrap(), served);
    assert_eq!(stats["reads"].as_u64().unwrap(), sample_value(&after, "xpackfs_reads_total"));
    assert_eq!(stats["bytes_served_by_origin"]["identity"].as_u64().unwrap(), served);

    // Failures of other operations, by operation and errno: a missing name (a write open
    // never reaches the daemon: the kernel refuses it on the read-only mount).
    assert!(std::fs::metadata(m.path("no-such-file")).is_err());
    let after = scrape(port);
    let stats = stats_json(&m);
    let lookups = sample_value(&after, "xpackfs_op_errors_total{op=\"lookup\",errno=\"ENOENT\"}");
    assert!(lookups >= 1, "{after}");
    assert!(stats["op_errors"]["lookup"]["ENOENT"].as_u64().unwrap() >= lookups, "{stats}");

    assert!(http(port, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    assert!(http(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").starts_with("HTTP/1.1 405 "));
    m.unmount();
    // The daemon's command line goes before its descriptors do (exit_mm, then exit_files).
    wait_until("the endpoint to close with its mount", std::time::Duration::from_secs(10), || listeners_on(port).is_empty());
}

#[test]
fn a_taken_metrics_address_refuses_the_mount() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let out = match Mount::try_new(&sample(), &[&format!("metrics={addr}")]) {
        Ok(_) => panic!("mounted although {addr} is taken"),
        Err(out) => out,
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("metrics endpoint {addr}")) && err.contains("in use"), "{err}");
    drop(taken);

    // Off by default; a value that is not IP:PORT is refused before anything starts.
    let bad = Mount::try_new(&sample(), &["metrics=localhost"]).err().expect("metrics=localhost accepted");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not IP:PORT"), "{}", String::from_utf8_lossy(&bad.stderr));
}
