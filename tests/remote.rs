//! Remote sources against real protocol servers started here on 127.0.0.1
//! (`tools/peers/remote/`): moto's S3 server (objects uploaded through the S3 API, single-part
//! and multipart), a plain HTTP server that honours Range, the Hub stand-in (checked
//! against huggingface_hub by `tools/peers/remote/check_hub_standin.py`), and a fault-injecting
//! proxy; Azure through Azurite, GCS through gcp-storage-emulator (with what it lacks added
//! by `servers.py gcs`). Each view of a remote source must equal the same view of the same files on
//! local disk, through the `xpackfs` binary (one process per command: remote settings are
//! per process) and through a real FUSE mount.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A test server (a Python process from tools/peers/remote/), killed when dropped.
struct Server {
    child: Child,
    info: Value,
}

impl Server {
    fn start(script: &str, args: &[&str]) -> Server {
        use std::os::unix::process::CommandExt;
        // Its own process group: the servers start children (Azurite's node, moto), and all
        // of them go when the test is done.
        let mut child = python()
            .process_group(0)
            .arg(repo().join("tools/peers/remote").join(script))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{script}: {e}"));
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the server never blocks on a full pipe.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| panic!("{script} did not become ready"));
        let info: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{script}: ready line {line:?}: {e}"));
        Server { child, info }
    }
    fn get(&self, k: &str) -> String {
        self.info[k].as_str().unwrap_or_else(|| panic!("no {k} in {}", self.info)).to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let group = -(self.child.id() as i32);
        // SAFETY: kill(2) with a process group id; no memory is involved.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// The sample GGUF uploaded to moto as `s3://bkt/m/sample-moe.gguf` (the local copy in the
/// returned directory).
fn sample_in_s3() -> (tempfile::TempDir, Server) {
    let fx = tmp();
    std::fs::copy(sample(), fx.path().join("sample-moe.gguf")).unwrap();
    let upload = format!("{}=m", fx.path().display());
    let s3 = Server::start("servers.py", &["s3", "--port", "0", "--bucket", "bkt", "--upload", &upload]);
    (fx, s3)
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Run the binary with `env`, returning its output.
fn xpackfs(env: &[(&str, String)], args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args).env_remove("AWS_PROFILE").env("XPACKFS_DIGEST_STORE", "none");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Environment variables of a command.
type Env = Vec<(&'static str, String)>;

fn s3_env(s3: &Server) -> Env {
    vec![("AWS_ENDPOINT_URL", s3.get("endpoint")), ("AWS_ACCESS_KEY_ID", s3.get("access_key_id")), ("AWS_SECRET_ACCESS_KEY", s3.get("secret_access_key"))]
}

/// `materialize` of `source` with `opts` into a new directory, which is returned.
fn materialize(env: &[(&str, String)], source: &str, opts: &[&str]) -> tempfile::TempDir {
    let out = tmp();
    let mut args = vec!["materialize", source, "--out", out.path().to_str().unwrap()];
    args.extend_from_slice(opts);
    let o = xpackfs(env, &args);
    assert!(o.status.success(), "materialize {source} {opts:?}: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// JSON with what records where and when a file was made (the command line, the source's
/// location, times, and the digests of such records) taken out.
fn normalized(mut v: Value) -> Value {
    const VOLATILE: [&str; 16] = [
        // (kimi-pack: SGLang's source inventory hashes the shards' paths)
        "inventory_sha256",
        "source_dir",
        "command",
        "elapsed_s",
        "started_at",
        "created_at",
        "completed_at",
        "path",
        "pack_path",
        "manifest_sha256",
        "source_path",
        "location",
        "generated_at",
        // The source's identity where it was read (device and inode, or URL and version),
        // and the fingerprints made of it.
        "file_identity",
        "model_name_or_path",
        "fingerprint",
    ];
    match &mut v {
        Value::Object(m) => {
            for k in VOLATILE {
                m.remove(k);
            }
            for (_, x) in m.iter_mut() {
                *x = normalized(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = normalized(x.take());
            }
        }
        _ => {}
    }
    v
}

/// Two trees of view files are the same: data files byte for byte, JSON files but for the
/// records of where and when they were made.
fn assert_same_views(local: &Path, remote: &Path, what: &str) {
    let (a, b) = (tree_files(local), tree_files(remote));
    assert_eq!(a, b, "{what}: file lists");
    assert!(!a.is_empty(), "{what}: no files");
    for f in &a {
        let (x, y) = (std::fs::read(local.join(f)).unwrap(), std::fs::read(remote.join(f)).unwrap());
        if f.ends_with(".json") {
            let (x, y): (Value, Value) = (serde_json::from_slice(&x).unwrap(), serde_json::from_slice(&y).unwrap());
            let (x, y) = (serde_json::to_string_pretty(&normalized(x)).unwrap(), serde_json::to_string_pretty(&normalized(y)).unwrap());
            if let Some((i, (l, r))) = x.lines().zip(y.lines()).enumerate().find(|(_, (l, r))| l != r) {
                panic!("{what}: {f} differs at line {i}: {l:?} vs {r:?}");
            }
            assert_eq!(x.lines().count(), y.lines().count(), "{what}: {f}");
        } else {
            assert!(x == y, "{what}: {f} differs ({} vs {} bytes)", x.len(), y.len());
        }
    }
}

/// Fixtures: the sample GGUF, a DeepSeek-V4-style safetensors checkpoint (bf16-cache), a
/// V4.1 one with 256-wide experts (requant), an HF MoE (kt-int8) and a two-part Kimi GGUF
/// split set (kimi-pack), in one directory.
fn fixtures() -> tempfile::TempDir {
    let d = tmp();
    let p = d.path();
    std::fs::create_dir_all(p.join("gguf")).unwrap();
    std::fs::copy(sample(), p.join("gguf/sample-moe.gguf")).unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(p.join("v4")));
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(p.join("v41")).args(["--variant", "v41", "--inter", "256"]));
    run_ok(python().arg(repo().join("tools/fixtures/make_hf_moe_fixture.py")).arg(p.join("hf")));
    run_ok(python().arg(repo().join("tools/fixtures/make_kimi_fixture.py")).arg(p.join("kimi")).args(["--layers", "3", "--experts", "4", "--shards", "2"]));
    d
}

fn kimi_parts(dir: &Path) -> Vec<String> {
    kimi_parts_in(&dir.join("kimi/gguf"))
}

#[test]
fn every_view_of_an_s3_source_equals_the_same_view_of_the_local_files() {
    let fx = fixtures();
    let root = fx.path();
    let upload = format!("{}=ckpt", root.display());
    let s3 = Server::start("servers.py", &["s3", "--port", "0", "--bucket", "models", "--upload", &upload]);
    let env = s3_env(&s3);
    let local = |p: &str| root.join(p).to_str().unwrap().to_string();
    let kimi = kimi_parts(root);
    let (cfg, tok) = (format!("--model-config={}", local("kimi/config.json")), format!("--tokenizer-dir={}", local("kimi/tokenizer")));
    let cases: Vec<(&str, String, String, Vec<&str>)> = vec![
        ("expert-pack of a GGUF", local("gguf/sample-moe.gguf"), "s3://models/ckpt/gguf/sample-moe.gguf".into(), vec![]),
        ("bf16-cache of a safetensors directory", local("v4"), "s3://models/ckpt/v4/".into(), vec!["--view=bf16-cache"]),
        ("requant of a safetensors directory", local("v41"), "s3://models/ckpt/v41".into(), vec!["--view=requant"]),
        ("kt-int8 of an HF MoE", local("hf"), "s3://models/ckpt/hf/".into(), vec!["--view=kt-int8", "--numa-count=2"]),
        (
            "kimi-pack of a split set named by its second part",
            local(&format!("kimi/gguf/{}", kimi[1])),
            format!("s3://models/ckpt/kimi/gguf/{}", kimi[1]),
            vec!["--view=kimi-pack", "--model-check=layout", &cfg, &tok],
        ),
    ];
    for (what, l, r, opts) in &cases {
        let a = materialize(&[], l, opts);
        let b = materialize(&env, r, opts);
        assert_same_views(a.path(), b.path(), what);
    }
}

#[test]
fn an_s3_mount_serves_the_local_bytes_and_counts_its_requests() {
    require_fuse();
    let (_fx, s3) = sample_in_s3();
    // The mount helper's form (what `mount -t fuse.xpackfs` and fstab run), the endpoint as
    // an -o option.
    let env: Env = s3_env(&s3).into_iter().filter(|(k, _)| *k != "AWS_ENDPOINT_URL").collect();
    let want = materialize(&[], sample().to_str().unwrap(), &[]);
    let mnt = tmp();
    let started = Instant::now();
    let o = xpackfs(&env, &["s3://bkt/m/sample-moe.gguf", mnt.path().to_str().unwrap(), "-o", &format!("endpoint={},ro,_netdev", s3.get("endpoint"))]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    let mount_s = started.elapsed().as_secs_f64();
    let got = std::fs::read(mnt.path().join("sample-moe.pack"));
    let stats: Value = serde_json::from_slice(&std::fs::read(mnt.path().join(".xpackfs/stats.json")).unwrap_or_default()).unwrap_or(Value::Null);
    umount(mnt.path());
    assert!(got.unwrap() == std::fs::read(want.path().join("sample-moe.pack")).unwrap(), "the mounted pack differs from the local one");
    let remote = &stats["remote"];
    assert!(remote["requests"].as_u64().unwrap_or(0) > 0, "stats.json has no remote requests: {stats}");
    assert!(remote["bytes"].as_u64().unwrap_or(0) > 0, "{stats}");
    assert!(mount_s < 30.0, "mount took {mount_s} s");
}

#[test]
fn a_multipart_object_and_a_plain_http_server_read_the_same() {
    // A one-shard checkpoint over moto's 5 MiB minimum part, uploaded in parts (its ETag is
    // "...-N", not an MD5), and the sample GGUF from a plain HTTP server with Range.
    let fx = tmp();
    let big = fx.path().join("big");
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(&big).args(["--layers", "6", "--experts", "24", "--shards", "1"]));
    let upload = format!("{}=big", big.display());
    let s3 = Server::start(
        "servers.py",
        &["s3", "--port", "0", "--bucket", "bkt", "--upload", &upload, "--multipart-threshold", "5242880", "--part-size", "5242880"],
    );
    let etag = s3.info["objects"]["big/model-00001-of-00001.safetensors"]["etag"].as_str().unwrap_or_default().to_string();
    assert!(etag.contains('-'), "not a multipart upload: {}", s3.info);
    let want = materialize(&[], big.to_str().unwrap(), &["--view=bf16-cache"]);
    let got = materialize(&s3_env(&s3), "s3://bkt/big", &["--view=bf16-cache"]);
    assert_same_views(want.path(), got.path(), "bf16-cache of a multipart object");

    let web = fx.path().join("web");
    std::fs::create_dir_all(&web).unwrap();
    std::fs::copy(sample(), web.join("sample-moe.gguf")).unwrap();
    let http = Server::start("servers.py", &["http", "--port", "0", "--root", web.to_str().unwrap()]);
    let want = materialize(&[], sample().to_str().unwrap(), &[]);
    let got = materialize(&[], &format!("{}/sample-moe.gguf", http.get("http")), &[]);
    assert_same_views(want.path(), got.path(), "expert-pack over http://");
}

#[test]
fn an_https_server_is_read_through_tls_and_its_certificate_is_checked() {
    // rustls (with ring) against Python's ssl, a certificate for 127.0.0.1 from a test CA:
    // trusted through SSL_CERT_FILE, the views equal the local file's; trusting only a
    // certificate that did not sign the server's, the command fails naming the URL and the
    // certificate, and writes nothing.
    let fx = tmp();
    let web = fx.path().join("web");
    std::fs::create_dir_all(&web).unwrap();
    std::fs::copy(sample(), web.join("sample-moe.gguf")).unwrap();
    let tls = fx.path().join("tls");
    let https = Server::start("servers.py", &["http", "--port", "0", "--root", web.to_str().unwrap(), "--tls", tls.to_str().unwrap()]);
    let url = format!("{}/sample-moe.gguf", https.get("http"));
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let want = materialize(&[], sample().to_str().unwrap(), &[]);
    let got = materialize(&[("SSL_CERT_FILE", https.get("ca"))], &url, &[]);
    assert_same_views(want.path(), got.path(), "expert-pack over https://");

    let out = tmp();
    let dest = out.path().join("pack");
    let leaf = tls.join("leaf.pem").to_str().unwrap().to_string();
    let o = xpackfs(&[("SSL_CERT_FILE", leaf)], &["materialize", &url, "--out", dest.to_str().unwrap(), "--remote-attempts", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "an untrusted certificate was accepted: {err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains(&https.get("http")) && last.contains("invalid peer certificate"), "the error does not say why: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!dest.exists() || std::fs::read_dir(&dest).unwrap().next().is_none(), "files were written: {err}");
}

/// A request to a test server's control endpoint (through Python's urllib: no curl needed).
fn http(url: &str, method: &str) -> Output {
    run_ok(python().args(["-c", "import sys, urllib.request as u; sys.stdout.buffer.write(u.urlopen(u.Request(sys.argv[1], method=sys.argv[2], data=b'' if sys.argv[2] == 'POST' else None)).read())", url, method]))
}

fn hub_fixture() -> (tempfile::TempDir, PathBuf) {
    let d = tmp();
    let repo_dir = d.path().join("repo");
    std::fs::create_dir_all(repo_dir.join("gguf")).unwrap();
    std::fs::copy(sample(), repo_dir.join("gguf/sample-moe.gguf")).unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(repo_dir.join("v4")));
    (d, repo_dir)
}

#[test]
fn a_hub_repository_reads_at_its_pinned_commit_and_the_token_stays_on_the_hub() {
    let (_d, repo_dir) = hub_fixture();
    let spec = format!("org/model={}", repo_dir.display());
    let hub = Server::start("hub_standin.py", &["--port", "0", "--repo", &spec, "--token", "hf_secret_token_1234", "--expires", "2"]);
    let commit = hub.info["commits"]["org/model"].as_str().unwrap().to_string();
    let env = vec![("HF_ENDPOINT", hub.get("hub")), ("HF_TOKEN", "hf_secret_token_1234".to_string()), ("HF_HOME", tmp().path().display().to_string())];
    let want = materialize(&[], repo_dir.join("gguf/sample-moe.gguf").to_str().unwrap(), &[]);
    let got = materialize(&env, "hf://org/model/gguf/sample-moe.gguf", &[]);
    assert_same_views(want.path(), got.path(), "expert-pack of a Hub GGUF");
    let want = materialize(&[], repo_dir.join("v4").to_str().unwrap(), &["--view=bf16-cache"]);
    let got = materialize(&env, "hf://org/model/v4", &["--view=bf16-cache"]);
    assert_same_views(want.path(), got.path(), "bf16-cache of a Hub safetensors directory");

    // A push changes main; the old commit still reads the old bytes.
    let mut changed = std::fs::read(sample()).unwrap();
    let n = changed.len();
    changed[n - 1] ^= 0xff;
    std::fs::write(repo_dir.join("gguf/sample-moe.gguf"), &changed).unwrap();
    let c = http(&format!("{}/_control/push?repo=org/model", hub.get("hub")), "POST");
    assert!(c.status.success());
    let pinned = materialize(&env, &format!("hf://org/model@{commit}/gguf/sample-moe.gguf"), &[]);
    let original = materialize(&[], sample().to_str().unwrap(), &[]);
    assert_same_views(original.path(), pinned.path(), "the pinned commit after a push");

    // Without the token: refused, naming the repository and what to do; the token never
    // reached the CDN.
    let o = xpackfs(&[("HF_ENDPOINT", hub.get("hub")), ("HF_HOME", tmp().path().display().to_string())], &["digest", "hf://org/model/gguf/sample-moe.gguf"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("hf://org/model") && err.contains("HF_TOKEN"), "{err}");
    let log = http(&format!("{}/_control/log", hub.get("hub")), "GET");
    let log: Value = serde_json::from_slice(&log.stdout).unwrap();
    assert_eq!(log["authorization_seen_on_cdn"], 0, "{log}");
    assert!(!err.contains("hf_secret_token_1234"));
}

#[test]
fn faults_on_the_way_are_retried_and_every_byte_is_still_right() {
    let (fx, s3) = sample_in_s3();
    let log = fx.path().join("proxy.log");
    let proxy = Server::start(
        "fault_proxy.py",
        &[
            "--upstream",
            &s3.get("endpoint"),
            "--port",
            "0",
            "--seed",
            "7",
            "--p503",
            "0.15",
            "--p500",
            "0.1",
            "--pcut",
            "0.15",
            "--pstall",
            "0.05",
            "--stall-s",
            "4",
            "--log",
            log.to_str().unwrap(),
        ],
    );
    let mut env = s3_env(&s3);
    env[0].1 = proxy.get("proxy");
    let want = materialize(&[], sample().to_str().unwrap(), &["--cache-mb=1"]);
    let got = materialize(&env, "s3://bkt/m/sample-moe.gguf", &["--cache-mb=1", "--remote-stall-timeout-s=1"]);
    assert_same_views(want.path(), got.path(), "through the fault proxy");
    std::thread::sleep(Duration::from_millis(300));
    let mut text = String::new();
    std::fs::File::open(&log).unwrap().read_to_string(&mut text).unwrap();
    let faults: Vec<&str> = text.lines().filter(|l| !l.contains("\"fault\": null") && l.contains("\"fault\"")).collect();
    assert!(faults.len() >= 3, "the proxy injected too few faults to test anything: {text}");
}

#[test]
fn a_misbehaving_server_never_yields_wrong_bytes_or_a_hung_read() {
    let fx = tmp();
    std::fs::copy(sample(), fx.path().join("sample-moe.gguf")).unwrap();
    let http = Server::start("servers.py", &["http", "--port", "0", "--root", fx.path().to_str().unwrap()]);
    for mode in ["full200", "shifted-range", "short-body", "long-body", "etag-flip", "redirect-loop", "huge-error", "trickle"] {
        let proxy = Server::start("fault_proxy.py", &["--upstream", &http.get("http"), "--port", "0", "--seed", "1", "--mode", mode]);
        let started = Instant::now();
        let out = tmp();
        let url = format!("{}/sample-moe.gguf", proxy.get("proxy"));
        let o = xpackfs(
            &[],
            &["materialize", &url, "--out", out.path().to_str().unwrap(), "--remote-attempts=2", "--remote-stall-timeout-s=1", "--remote-min-rate-kib=256"],
        );
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(took < Duration::from_secs(90), "{mode}: took {took:?}");
        // Every ranged answer misbehaves: nothing may be written as if it were right.
        assert!(!o.status.success(), "{mode}: materialize succeeded through a server that misbehaves on every range");
        assert!(err.contains("sample-moe.gguf"), "{mode}: the error does not name the URL: {err}");
        assert!(!out.path().join("sample-moe.pack").exists(), "{mode}: a pack was left in place");
    }
}

#[test]
fn refusals_at_mount_name_the_url_and_what_to_do() {
    let fx = tmp();
    std::fs::copy(sample(), fx.path().join("sample-moe.gguf")).unwrap();
    let upload = format!("{}=m", fx.path().display());
    let s3 = Server::start("servers.py", &["s3", "--port", "0", "--bucket", "bkt", "--upload", &upload, "--auth"]);
    let mnt = tmp();
    let m = mnt.path().to_str().unwrap();
    let quick = ["--remote-attempts=2"];
    let mut bad = s3_env(&s3);
    bad[2].1 = "wrong-secret".into();
    let cases: Vec<(&str, Env, &str, &str)> = vec![
        ("bad credentials", bad, "s3://bkt/m/sample-moe.gguf", "credentials"),
        ("missing object", s3_env(&s3), "s3://bkt/m/nothing.gguf", "s3://bkt/m/nothing.gguf"),
        ("missing prefix", s3_env(&s3), "s3://bkt/none/", "s3://bkt/none"),
        (
            "unreachable endpoint",
            vec![("AWS_ENDPOINT_URL", "http://127.0.0.1:9".into()), ("AWS_ACCESS_KEY_ID", "k".into()), ("AWS_SECRET_ACCESS_KEY", "s".into())],
            "s3://bkt/m/sample-moe.gguf",
            "cannot reach the server",
        ),
    ];
    for (what, env, url, needle) in cases {
        let mut args = vec!["mount", url, m];
        args.extend_from_slice(&quick);
        let started = Instant::now();
        let o = xpackfs(&env, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what}: mounted");
        assert!(err.contains(needle) && err.contains(url.trim_end_matches('/')), "{what}: {err}");
        assert!(!err.contains("wrong-secret"), "{what}: the secret is in the message: {err}");
        assert!(started.elapsed() < Duration::from_secs(60), "{what}: took {:?}", started.elapsed());
        assert!(mounts_line(mnt.path()).is_none());
    }
}

#[test]
fn an_object_replaced_while_mounted_fails_its_reads_and_never_mixes_versions() {
    require_fuse();
    let (fx, s3) = sample_in_s3();
    let env = s3_env(&s3);
    let mnt = tmp();
    let o = xpackfs(&env, &["mount", "s3://bkt/m/sample-moe.gguf", mnt.path().to_str().unwrap(), "--cache-mb=1", "--remote-attempts=2"]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    let pack = mnt.path().join("sample-moe.pack");
    let mut head = vec![0u8; 4096];
    std::fs::File::open(&pack).unwrap().read_exact(&mut head).unwrap();
    // Replace the object: the same size, other bytes in the tensor data.
    let mut other = std::fs::read(sample()).unwrap();
    let n = other.len();
    for b in &mut other[n / 2..] {
        *b ^= 0x5a;
    }
    let replacement = fx.path().join("other.gguf");
    std::fs::write(&replacement, &other).unwrap();
    let put = python()
        .arg(repo().join("tools/peers/remote/servers.py"))
        .args(["s3-put", "--endpoint", &s3.get("endpoint"), "--bucket", "bkt", "--key", "m/sample-moe.gguf", "--file", replacement.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    let whole = std::fs::read(&pack);
    umount(mnt.path());
    let want = materialize(&[], sample().to_str().unwrap(), &[]);
    match whole {
        Ok(bytes) => assert!(bytes == std::fs::read(want.path().join("sample-moe.pack")).unwrap(), "a read after the replacement mixed versions"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
}

#[test]
fn an_azure_blob_source_through_azurite_equals_the_local_one() {
    let fx = tmp();
    std::fs::copy(sample(), fx.path().join("sample-moe.gguf")).unwrap();
    let upload = format!("{}=m", fx.path().display());
    let az = Server::start("servers.py", &["azurite", "--port", "0", "--upload", &upload]);
    let blob_url = az.get("azure");
    let env =
        vec![("AZURE_STORAGE_USE_EMULATOR", "true".to_string()), ("AZURITE_BLOB_STORAGE_URL", blob_url.trim_end_matches("/devstoreaccount1").to_string())];
    let want = materialize(&[], sample().to_str().unwrap(), &[]);
    let got = materialize(&env, &format!("az://{}/m/sample-moe.gguf", az.get("container")), &[]);
    assert_same_views(want.path(), got.path(), "expert-pack of an Azure blob");
}

/// `validate-int8` of `root` with `env`: exit status, stdout as JSON (or Null), stderr.
fn validate_int8(env: &[(&str, String)], root: &str) -> (bool, Value, String) {
    let o = xpackfs(env, &["validate-int8", root, "--verify-hashes"]);
    let out = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.success(), out, String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn an_int8_tree_in_s3_validates_and_mounts_as_the_local_tree_does() {
    // An INT8 tree (the kt-int8 view of an HF MoE, materialized), then the same tree with one
    // byte of one file flipped, and one with a file missing: uploaded side by side.
    let fx = tmp();
    let p = fx.path();
    run_ok(python().arg(repo().join("tools/fixtures/make_hf_moe_fixture.py")).arg(p.join("hf")));
    let good = materialize(&[], p.join("hf").to_str().unwrap(), &["--view=kt-int8", "--numa-count=2"]);
    let trees = p.join("trees");
    let copy = |name: &str| {
        let dst = trees.join(name);
        for f in tree_files(good.path()) {
            std::fs::create_dir_all(dst.join(&f).parent().unwrap()).unwrap();
            std::fs::copy(good.path().join(&f), dst.join(&f)).unwrap();
        }
        dst
    };
    let local_good = copy("good");
    let flipped = copy("flipped");
    let victim = tree_files(&flipped).into_iter().find(|f| f.ends_with("_quant_.kt")).unwrap();
    let mut bytes = std::fs::read(flipped.join(&victim)).unwrap();
    bytes[7] ^= 1;
    std::fs::write(flipped.join(&victim), bytes).unwrap();
    let missing = copy("missing");
    std::fs::remove_file(missing.join(&victim)).unwrap();
    let upload = format!("{}=t", trees.display());
    let s3 = Server::start("servers.py", &["s3", "--port", "0", "--bucket", "int8", "--upload", &upload]);
    let env = s3_env(&s3);

    // The same verdict as on local disk, hashes verified, for a tree named with and without
    // the trailing slash.
    let (ok, local, err) = validate_int8(&[], local_good.to_str().unwrap());
    assert!(ok, "local: {err}");
    for url in ["s3://int8/t/good/", "s3://int8/t/good"] {
        let (ok, remote, err) = validate_int8(&env, url);
        assert!(ok, "{url}: {err}");
        for k in ["schema_version", "layout", "layer_indices", "file_count", "size_bytes"] {
            assert_eq!(remote[k], local[k], "{url}: {k}");
        }
        assert!(remote["root"].as_str().unwrap().starts_with("s3://int8/t/good"), "{remote}");
    }
    // The faults, with the local validator's message but for where the tree is.
    for (name, local_root) in [("flipped", &flipped), ("missing", &missing)] {
        let (ok, _, local_err) = validate_int8(&[], local_root.to_str().unwrap());
        assert!(!ok, "local {name} validated");
        let url = format!("s3://int8/t/{name}");
        let (ok, _, err) = validate_int8(&env, &url);
        assert!(!ok, "{url} validated");
        assert_eq!(err.replace(&url, "ROOT"), local_err.replace(local_root.to_str().unwrap(), "ROOT"), "{name}");
    }

    // Served (view=auto picks the INT8 tree) exactly as the local tree is; with
    // --verify-hashes, a tree whose bytes differ from its manifest is refused.
    let a = materialize(&[], local_good.to_str().unwrap(), &[]);
    let b = materialize(&env, "s3://int8/t/good/", &[]);
    assert_same_views(a.path(), b.path(), "the INT8 tree from s3://");
    assert_eq!(tree_files(b.path()), tree_files(good.path()));
    let out = tmp();
    let o = xpackfs(&env, &["materialize", "s3://int8/t/flipped/", "--out", out.path().to_str().unwrap(), "--verify-hashes"]);
    assert!(!o.status.success(), "a tree with a flipped byte was served with --verify-hashes");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("SHA256 mismatch") && err.contains("s3://int8/t/flipped/"), "{err}");
}

#[test]
fn a_hub_split_set_takes_its_shard_digests_from_the_hub_and_verify_checks_them() {
    let d = tmp();
    let repo_dir = d.path().join("repo");
    run_ok(python().arg(repo().join("tools/fixtures/make_kimi_fixture.py")).arg(&repo_dir).args(["--layers", "3", "--experts", "16", "--shards", "2"]));
    let parts = kimi_parts_in(&repo_dir.join("gguf"));
    let total: u64 = parts.iter().map(|p| std::fs::metadata(repo_dir.join("gguf").join(p)).unwrap().len()).sum();
    let spec = format!("org/kimi={}", repo_dir.display());
    // --no-copy: the CDN serves the files as they are on disk now (for the last part below).
    let hub = Server::start("hub_standin.py", &["--port", "0", "--repo", &spec, "--no-copy"]);
    let env = vec![("HF_ENDPOINT", hub.get("hub")), ("HF_HOME", tmp().path().display().to_string())];
    let (cfg, tok) =
        (format!("--model-config={}", repo_dir.join("config.json").display()), format!("--tokenizer-dir={}", repo_dir.join("tokenizer").display()));
    let opts = ["--view=kimi-pack", "--model-check=layout", &cfg, &tok, "--full-source-hashes"];
    let local = materialize(&[], repo_dir.join("gguf").join(&parts[0]).to_str().unwrap(), &opts);
    let manifest = tree_files(local.path()).into_iter().find(|f| f.ends_with(".manifest.json")).unwrap();

    // The mount reads headers (the parser's first 256 KiB of each part, and the few payload
    // samples the manifest reports), not the shards: the per-shard sha256 are the Hub's LFS
    // oids, and equal what hashing gives.
    let url = format!("hf://org/kimi/gguf/{}", parts[0]);
    assert_manifest_from_headers(&env, &url, &opts, (local.path(), &manifest), total);

    // A store whose word and bytes disagree (the last part changed on the CDN's disk, its
    // LFS oid not): materialize --verify refuses, naming the part.
    let last = repo_dir.join("gguf").join(&parts[1]);
    let mut bytes = std::fs::read(&last).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0x40;
    std::fs::write(&last, bytes).unwrap();
    let out = tmp();
    let mut args = vec!["materialize", &url, "--out", out.path().to_str().unwrap(), "--verify"];
    args.extend_from_slice(&opts);
    let o = xpackfs(&env, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "materialize --verify accepted bytes the Hub's sha256 does not match");
    assert!(err.contains(&parts[1]) && err.contains("the store states sha256"), "{err}");
    // The digest pass checks what it hashes against the statement too, and stores nothing.
    let o = xpackfs(&env, &["digest", &url]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(&parts[1]) && err.contains("the store states sha256"), "{err}");
}

/// S3 states a full-object sha256 for objects uploaded with a SHA256 checksum in one part
/// (`x-amz-checksum-sha256`, returned to a HEAD with `x-amz-checksum-mode: ENABLED`): a split
/// set uploaded so takes its shard digests from it, as from the Hub, and the mount reads
/// headers only. moto checks the signature of that HEAD (`--auth`).
#[test]
fn an_s3_split_set_with_sha256_checksums_takes_its_shard_digests_from_s3() {
    let d = tmp();
    let repo_dir = d.path().join("repo");
    run_ok(python().arg(repo().join("tools/fixtures/make_kimi_fixture.py")).arg(&repo_dir).args(["--layers", "3", "--experts", "16", "--shards", "2"]));
    let gguf = repo_dir.join("gguf");
    let parts = kimi_parts_in(&gguf);
    let total: u64 = parts.iter().map(|p| std::fs::metadata(gguf.join(p)).unwrap().len()).sum();
    let upload = format!("{}=k", gguf.display());
    let big = (total + 1).to_string();
    let s3 = Server::start(
        "servers.py",
        &["s3", "--port", "0", "--bucket", "bkt", "--upload", &upload, "--auth", "--checksum-sha256", "--multipart-threshold", &big],
    );
    let objects = s3.info["objects"].clone();
    for p in &parts {
        assert!(objects[format!("k/{p}")]["checksum_sha256"].is_string(), "{p} went up without a checksum: {objects}");
    }
    let env = s3_env(&s3);
    let (cfg, tok) =
        (format!("--model-config={}", repo_dir.join("config.json").display()), format!("--tokenizer-dir={}", repo_dir.join("tokenizer").display()));
    let opts = ["--view=kimi-pack", "--model-check=layout", &cfg, &tok, "--full-source-hashes"];
    let local = materialize(&[], gguf.join(&parts[0]).to_str().unwrap(), &opts);
    let manifest = tree_files(local.path()).into_iter().find(|f| f.ends_with(".manifest.json")).unwrap();

    let url = format!("s3://bkt/k/{}", parts[0]);
    let want = assert_manifest_from_headers(&env, &url, &opts, (local.path(), &manifest), total);

    // materialize --verify hashes what it read and agrees with S3's statement.
    let out = tmp();
    let mut args = vec!["materialize", &url, "--out", out.path().to_str().unwrap(), "--verify"];
    args.extend_from_slice(&opts);
    let o = xpackfs(&env, &args);
    assert!(o.status.success(), "materialize --verify: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(normalized(serde_json::from_slice(&std::fs::read(out.path().join(&manifest)).unwrap()).unwrap()), normalized(want));
}

/// Mount `url` with `opts`: its `manifest` equals the one in `local` (returned), and the mount
/// fetched under a quarter of the `total` source bytes (headers, not shards).
fn assert_manifest_from_headers(env: &[(&str, String)], url: &str, opts: &[&str], (local, manifest): (&Path, &str), total: u64) -> Value {
    let (served, remote) = mount_read(env, url, opts, manifest);
    let want: Value = serde_json::from_slice(&std::fs::read(local.join(manifest)).unwrap()).unwrap();
    let got: Value = serde_json::from_slice(&served).unwrap();
    assert_eq!(normalized(got), normalized(want.clone()), "the manifest of {url}");
    let fetched = remote["bytes"].as_u64().unwrap();
    assert!(fetched * 4 < total, "the mount fetched {fetched} of {total} source bytes: {remote}");
    want
}

fn kimi_parts_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Mount `url` with `opts`, read `file` whole, and return its bytes and stats.json's remote
/// section.
fn mount_read(env: &[(&str, String)], url: &str, opts: &[&str], file: &str) -> (Vec<u8>, Value) {
    let mnt = tmp();
    let mut args = vec!["mount", url, mnt.path().to_str().unwrap()];
    args.extend_from_slice(opts);
    let o = xpackfs(env, &args);
    assert!(o.status.success(), "mount {url}: {}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(mnt.path().join(file));
    let stats: Value = serde_json::from_slice(&std::fs::read(mnt.path().join(".xpackfs/stats.json")).unwrap_or_default()).unwrap_or(Value::Null);
    umount(mnt.path());
    (bytes.unwrap(), stats["remote"].clone())
}

/// The disk-cache tests' setting: the sample in moto (`sample_in_s3`), read through a mount
/// with fetched parts kept in a cache directory.
struct CachedPack;

impl CachedPack {
    const URL: &str = "s3://bkt/m/sample-moe.gguf";

    /// Mount options: the cache directory, bounded explicitly (a nearly full filesystem
    /// would otherwise bound it at 0), and small parts, so the sample spans many.
    /// Whole-file entries off: these tests are about the parts (a restart would otherwise
    /// serve the pack from its file entry, [`a_remote_pack_read_once_is_served_whole_by_the_kernel_after_a_restart`]).
    fn opts(cache: &Path) -> Vec<String> {
        vec![
            format!("--disk-cache={}", cache.display()),
            "--disk-cache-gb=1".into(),
            "--remote-part-mb=1".into(),
            "--cache-mb=1".into(),
            "--disk-cache-files=off".into(),
        ]
    }

    /// The expert pack of the local sample.
    fn local_pack() -> Vec<u8> {
        std::fs::read(materialize(&[], sample().to_str().unwrap(), &[]).path().join("sample-moe.pack")).unwrap()
    }

    /// Replace the object with a new version (its last 4 KiB changed, uploaded through the
    /// S3 API: a new ETag) made in `dir`; the expert pack of the new version, made locally.
    fn replace(dir: &Path, s3: &Server) -> Vec<u8> {
        let mut other = std::fs::read(sample()).unwrap();
        let n = other.len();
        for b in &mut other[n - 4096..] {
            *b ^= 0x5a;
        }
        std::fs::write(dir.join("other.gguf"), &other).unwrap();
        let put = python()
            .arg(repo().join("tools/peers/remote/servers.py"))
            .args([
                "s3-put",
                "--endpoint",
                &s3.get("endpoint"),
                "--bucket",
                "bkt",
                "--key",
                "m/sample-moe.gguf",
                "--file",
                dir.join("other.gguf").to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
        let local = tmp();
        std::fs::write(local.path().join("sample-moe.gguf"), &other).unwrap();
        std::fs::read(materialize(&[], local.path().join("sample-moe.gguf").to_str().unwrap(), &[]).path().join("sample-moe.pack")).unwrap()
    }
}

/// A view file made of remote source ranges (the expert pack over `s3://`), read whole once,
/// is kept whole in the disk cache as computed files are: a restart hands it to the kernel
/// (FUSE passthrough): no GET of data and no byte of the pack through the daemon (the
/// mount still reads the GGUF's header from the fetched parts). A replaced object (a new
/// ETag) never meets that entry.
#[test]
fn a_remote_pack_read_once_is_served_whole_by_the_kernel_after_a_restart() {
    require_fuse();
    let (fx, s3) = sample_in_s3();
    let env = s3_env(&s3);
    let cache = tmp();
    let opts = [format!("--disk-cache={}", cache.path().display()), "--disk-cache-gb=1".into(), "--remote-part-mb=1".into()];
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let (url, want) = (CachedPack::URL, CachedPack::local_pack());
    assert!(want.len() >= 1 << 20, "the sample's pack is too small for a file entry");
    let stats = |mnt: &Path| -> Value { serde_json::from_slice(&std::fs::read(mnt.join(".xpackfs/stats.json")).unwrap()).unwrap() };
    let mount = |want: &[u8], settle: bool| -> Value {
        let mnt = tmp();
        let mut args = vec!["mount", url, mnt.path().to_str().unwrap()];
        args.extend_from_slice(&opts);
        let o = xpackfs(&env, &args);
        assert!(o.status.success(), "mount {url}: {}", String::from_utf8_lossy(&o.stderr));
        let pack = mnt.path().join("sample-moe.pack");
        assert!(std::fs::read(&pack).unwrap() == want, "the pack differs");
        if settle {
            wait_until("the pack's file entry to be written", Duration::from_secs(60), || {
                stats(mnt.path())["passthrough"]["file_entries_pending"].as_u64() == Some(0)
                    && stats(mnt.path())["disk_cache"]["file_writes"].as_u64() > Some(0)
            });
        }
        let out = run_ok(python().arg("-c").arg(ODIRECT_AND_MMAP).arg(&pack));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), sha256_hex(want), "O_DIRECT / mmap of the pack");
        let s = stats(mnt.path());
        umount(mnt.path());
        s
    };

    let s1 = mount(&want, true);
    assert!(s1["remote"]["bytes"].as_u64().unwrap() > 0, "{s1}");
    assert_eq!(s1["disk_cache"]["file_writes"].as_u64(), Some(1), "{s1}");
    // The restart: the kernel reads the file entry; no GET of data, no byte through the
    // daemon (the mount still reads the GGUF's header, from the fetched parts on disk).
    let s2 = mount(&want, false);
    assert!(s2["passthrough"]["opens"].as_u64().unwrap() >= 1, "not passed through: {s2}");
    assert_eq!(s2["remote"]["bytes"], 0, "{s2}");
    assert_eq!(s2["bytes_served"], 0, "read through the daemon, not from the file entry: {s2}");

    // A new version of the object: another key, so the old entry is never served.
    let want_other = CachedPack::replace(fx.path(), &s3);
    assert!(want_other != want);
    let s3stats = mount(&want_other, false);
    // (Its bytes were checked above, buffered, O_DIRECT and mmap: the first read went to
    // the network, and the old version's entry, under another key, was not found.)
    assert!(s3stats["remote"]["bytes"].as_u64().unwrap() > 0, "{s3stats}");
    assert!(s3stats["disk_cache"]["file_misses"].as_u64().unwrap() >= 1, "{s3stats}");
}

/// A pack of a remote source larger than one part (the sample's 1.3 MB expert pack over
/// `s3://`, with 1 MiB parts) is read around the mount's page cache under `direct_io=auto`,
/// as `O_DIRECT` readers read it: a buffered read leaves none of it cached, and a second
/// buffered read reaches the daemon again. With 2 MiB parts it is under one part and is
/// cached, as it is with `direct_io=off` (a second read then never reaches the daemon), and
/// so are files that are not remote bytes (the manifest); buffered reads of odd sizes,
/// `O_DIRECT` and mmap give the local bytes in every case.
#[test]
fn a_large_remote_pack_is_read_around_the_page_cache_and_small_files_are_cached() {
    require_fuse();
    let (_fx, s3) = sample_in_s3();
    let env = s3_env(&s3);
    let want = CachedPack::local_pack();
    assert!(want.len() > 1 << 20, "the sample's pack must span more than one 1 MiB part");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let served = |mnt: &Path| -> u64 {
        let s: Value = serde_json::from_slice(&std::fs::read(mnt.join(".xpackfs/stats.json")).unwrap()).unwrap();
        s["bytes_served"].as_u64().unwrap_or_else(|| panic!("no bytes_served in {s}"))
    };
    for (part_mb, opts, pack_cached) in [("1", "", false), ("2", "", true), ("1", "direct_io=off", true)] {
        let shown = format!("remote_part_mb={part_mb} {opts}");
        let shown = shown.trim();
        let mnt = tmp();
        let mut args = vec!["mount", CachedPack::URL, mnt.path().to_str().unwrap(), "--remote-part-mb", part_mb];
        if !opts.is_empty() {
            args.extend(["-o", opts]);
        }
        let o = xpackfs(&env, &args);
        assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
        let (pack, manifest) = (mnt.path().join("sample-moe.pack"), mnt.path().join("sample-moe.pack.manifest.json"));
        // Buffered reads of an odd size, so that reads straddle the kernel's and the parts' boundaries.
        let read_odd = || {
            let mut got = Vec::with_capacity(want.len());
            let mut f = std::fs::File::open(&pack).unwrap();
            let mut buf = vec![0u8; 65_537];
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got
        };
        let got = read_odd();
        let small = std::fs::read(&manifest).unwrap();
        // (fincore opens the file too: an open keeps the file's cached pages either way.)
        let (pack_res, small_res) = (cached_bytes(&pack), cached_bytes(&manifest));
        let before = served(mnt.path());
        let again = read_odd();
        let second = served(mnt.path()) - before;
        let out = run_ok(python().arg("-c").arg(ODIRECT_AND_MMAP).arg(&pack));
        umount(mnt.path());
        assert!(got == want && again == want, "[{shown}] the pack read buffered differs from the local one");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), sha256_hex(&want), "[{shown}] O_DIRECT / mmap of the pack");
        assert!(!small.is_empty() && (small.len() as u64) < 1 << 20);
        assert_eq!(small_res, small.len().next_multiple_of(page) as u64, "[{shown}] the manifest is not in the page cache");
        if pack_cached {
            assert_eq!(pack_res, want.len().next_multiple_of(page) as u64, "[{shown}] the pack is not all in the page cache");
            assert_eq!(second, 0, "[{shown}] a second buffered read of the cached pack reached the daemon");
        } else {
            assert_eq!(pack_res, 0, "[{shown}] the pack read buffered left {pack_res} bytes in the mount's page cache");
            assert!(second >= want.len() as u64, "[{shown}] a second buffered read served {second} bytes through the daemon, want the whole pack");
        }
    }
}

/// Two mounts of one object at the same time, one cache directory (SGLang's tensor-parallel
/// ranks, each mounting the model): what one fetched, the other reads from disk.
#[test]
fn two_live_mounts_sharing_a_cache_directory_download_once() {
    require_fuse();
    let (_fx, s3) = sample_in_s3();
    let env = s3_env(&s3);
    let cache = tmp();
    let opts = CachedPack::opts(cache.path());
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let (url, want) = (CachedPack::URL, CachedPack::local_pack());
    let (a, b) = (tmp(), tmp());
    for m in [&a, &b] {
        let mut args = vec!["mount", url, m.path().to_str().unwrap()];
        args.extend_from_slice(&opts);
        let o = xpackfs(&env, &args);
        assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    }
    let stats = |m: &tempfile::TempDir| -> Value { serde_json::from_slice(&std::fs::read(m.path().join(".xpackfs/stats.json")).unwrap()).unwrap() };
    let got_a = std::fs::read(a.path().join("sample-moe.pack"));
    let before_b = stats(&b)["remote"]["bytes"].as_u64().unwrap();
    let got_b = std::fs::read(b.path().join("sample-moe.pack"));
    let (sa, sb) = (stats(&a)["remote"].clone(), stats(&b)["remote"].clone());
    umount(a.path());
    umount(b.path());
    assert!(got_a.unwrap() == want, "first mount: the pack differs");
    assert!(got_b.unwrap() == want, "second mount: the pack differs");
    let size = std::fs::metadata(sample()).unwrap().len();
    assert!(sa["bytes"].as_u64().unwrap() >= size / 2, "{sa}");
    assert_eq!(sb["bytes"].as_u64().unwrap(), before_b, "the second live mount fetched what the first had: {sb}");
    assert!(sb["parts"]["parts_from_disk"].as_u64().unwrap() > 0, "{sb}");
}

#[test]
fn fetched_parts_are_kept_on_disk_across_mounts_checked_and_keyed_by_version() {
    require_fuse();
    let (fx, s3) = sample_in_s3();
    let env = s3_env(&s3);
    let cache = tmp();
    let opts = CachedPack::opts(cache.path());
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let (url, want) = (CachedPack::URL, CachedPack::local_pack());

    let (first, s1) = mount_read(&env, url, &opts, "sample-moe.pack");
    assert!(first == want, "first mount: the pack differs");
    let size = std::fs::metadata(sample()).unwrap().len();
    assert!(s1["bytes"].as_u64().unwrap() >= size / 2, "{s1}");
    // A restart: every byte read before comes from the disk cache, none from the network.
    let (second, s2) = mount_read(&env, url, &opts, "sample-moe.pack");
    assert!(second == want, "second mount: the pack differs");
    assert_eq!(s2["bytes"], 0, "the second mount fetched bytes: {s2}");
    assert!(s2["parts"]["parts_from_disk"].as_u64().unwrap() > 0, "{s2}");

    // Damaged entries are detected, refetched, and the bytes are still right.
    let mut damaged = 0;
    for shard in std::fs::read_dir(cache.path().join("entries")).unwrap() {
        for e in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let p = e.unwrap().path();
            let mut b = std::fs::read(&p).unwrap();
            if b.len() > 100 {
                let i = b.len() - 1;
                b[i] ^= 0x10;
                std::fs::write(&p, b).unwrap();
                damaged += 1;
            }
        }
    }
    assert!(damaged > 0);
    let (third, s3stats) = mount_read(&env, url, &opts, "sample-moe.pack");
    assert!(third == want, "after damage: the pack differs");
    assert!(s3stats["bytes"].as_u64().unwrap() > 0, "damaged entries were not refetched: {s3stats}");

    // The object replaced (a new ETag): its parts are new keys; the old ones are never served.
    let want_other = CachedPack::replace(fx.path(), &s3);
    let (fourth, s4) = mount_read(&env, url, &opts, "sample-moe.pack");
    assert!(fourth == want_other, "the replaced object's pack differs (old parts served?)");
    assert!(s4["bytes"].as_u64().unwrap() > 0, "{s4}");

    // `warm URL` fills a fresh cache before any mount: the mount then reads no byte from the
    // network.
    let cache2 = tmp();
    let disk2 = format!("--disk-cache={}", cache2.path().display());
    let o = xpackfs(&env, &["warm", url, &disk2, "--disk-cache-gb=1", "--remote-part-mb=1", "--json"]);
    assert!(o.status.success(), "warm: {}", String::from_utf8_lossy(&o.stderr));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["fetched"]["bytes"].as_u64().unwrap() > 0 && report["fetched"]["failed"] == 0, "{report}");
    let (fifth, s5) = mount_read(&env, url, &[disk2.as_str(), "--disk-cache-gb=1", "--remote-part-mb=1", "--cache-mb=1"], "sample-moe.pack");
    assert!(fifth == want_other, "after warm: the pack differs");
    assert_eq!(s5["bytes"], 0, "the mount after warm fetched bytes: {s5}");
}

/// `gs://` against `gcp-storage-emulator` (PyPI), with what it lacks for `object_store`'s GCS
/// client added by `tools/peers/remote/servers.py gcs` (a HEAD, ETag and Last-Modified on its GETs,
/// If-Match, the XML listing: see there and README, "Remote sources").
/// `STORAGE_EMULATOR_HOST` sends the requests to the emulator, unauthenticated, as Google's
/// clients do, never to Google. Every view must equal the same view of the local files, and
/// an object replaced while mounted fails its reads instead of mixing versions.
#[test]
fn a_gcs_source_through_the_emulator() {
    let installed = python().args(["-c", "import gcp_storage_emulator, google.cloud.storage"]).output().is_ok_and(|o| o.status.success());
    if !installed {
        eprintln!("SKIPPED a_gcs_source_through_the_emulator: gcp-storage-emulator or google-cloud-storage is not installed (tools/deps.sh installs them)");
        return;
    }
    let fx = tmp();
    let root = fx.path().join("ckpt");
    std::fs::create_dir_all(root.join("gguf")).unwrap();
    std::fs::copy(sample(), root.join("gguf/sample-moe.gguf")).unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(root.join("v4")));
    let upload = format!("{}=ckpt", root.display());
    let gcs = Server::start("servers.py", &["gcs", "--port", "0", "--upload", &upload]);
    let (host, bucket) = (gcs.get("gcs"), gcs.get("bucket"));
    // No gcloud credentials of the machine's user come into it.
    let home = tmp();
    let env: Env = vec![("STORAGE_EMULATOR_HOST", host.clone()), ("HOME", home.path().display().to_string())];
    let local = |p: &str| root.join(p).to_str().unwrap().to_string();
    let gguf = format!("gs://{bucket}/ckpt/gguf/sample-moe.gguf");
    // A single object (pinned by a HEAD, read by conditional ranged GETs) and a directory
    // (listed; HEAD answers 404 for the prefix), as the S3 test names them.
    let cases: Vec<(&str, String, String, Vec<&str>)> = vec![
        ("expert-pack of a GCS GGUF object", local("gguf/sample-moe.gguf"), gguf.clone(), vec![]),
        ("bf16-cache of a GCS safetensors prefix", local("v4"), format!("gs://{bucket}/ckpt/v4/"), vec!["--view=bf16-cache"]),
        ("bf16-cache of a GCS prefix named without the slash", local("v4"), format!("gs://{bucket}/ckpt/v4"), vec!["--view=bf16-cache"]),
    ];
    for (what, l, r, opts) in &cases {
        let a = materialize(&[], l, opts);
        let b = materialize(&env, r, opts);
        assert_same_views(a.path(), b.path(), what);
    }

    // Replaced while mounted (the same size, other bytes from the middle on): what was read
    // before is the old object's, and a read after fails (the pinned ETag's If-Match gets
    // 412) instead of mixing versions; a new materialize reads the new object. The source's
    // digests are stored first, so the mount reads headers and not the whole object (which a
    // part of the memory tier would then hold), and its parts are 1 MiB: the read after the
    // replacement has to fetch.
    require_fuse();
    let want = std::fs::read(materialize(&[], sample().to_str().unwrap(), &[]).path().join("sample-moe.pack")).unwrap();
    let store = tmp();
    let mut env = env;
    env.push(("XPACKFS_DIGEST_STORE", store.path().display().to_string()));
    let o = xpackfs(&env, &["digest", &gguf]);
    assert!(o.status.success(), "digest: {}", String::from_utf8_lossy(&o.stderr));
    let mnt = tmp();
    let o = xpackfs(&env, &["mount", &gguf, mnt.path().to_str().unwrap(), "--cache-mb=1", "--remote-part-mb=1", "--remote-attempts=2"]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    let pack = mnt.path().join("sample-moe.pack");
    let mut head = vec![0u8; 4096];
    let first = std::fs::File::open(&pack).and_then(|mut f| f.read_exact(&mut head));
    let mut other = std::fs::read(sample()).unwrap();
    let n = other.len();
    for b in &mut other[n / 2..] {
        *b ^= 0x5a;
    }
    let replacement = fx.path().join("other.gguf");
    std::fs::write(&replacement, &other).unwrap();
    let put = python()
        .arg(repo().join("tools/peers/remote/servers.py"))
        .args(["gcs-put", "--endpoint", &host, "--bucket", &bucket, "--key", "ckpt/gguf/sample-moe.gguf", "--file", replacement.to_str().unwrap()])
        .output()
        .unwrap();
    let whole = std::fs::read(&pack);
    let stats: Value = serde_json::from_slice(&std::fs::read(mnt.path().join(".xpackfs/stats.json")).unwrap_or_default()).unwrap_or(Value::Null);
    umount(mnt.path());
    assert!(put.status.success(), "gcs-put: {}", String::from_utf8_lossy(&put.stderr));
    first.unwrap();
    assert!(head[..] == want[..4096], "the first 4 KiB of the mounted pack differ from the local one");
    match whole {
        Ok(bytes) => panic!("a read after the replacement succeeded ({} bytes, the old pack: {})", bytes.len(), bytes == want),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
    let remote = &stats["remote"];
    assert!(remote["answers"]["412"].as_u64().unwrap_or(0) > 0 && remote["failures"]["changed"].as_u64().unwrap_or(0) > 0, "no 412 seen: {stats}");
    let new_local = tmp();
    std::fs::write(new_local.path().join("sample-moe.gguf"), &other).unwrap();
    let a = materialize(&[], new_local.path().join("sample-moe.gguf").to_str().unwrap(), &[]);
    let b = materialize(&env, &gguf, &[]);
    assert_same_views(a.path(), b.path(), "expert-pack of the replaced GCS object");
}
