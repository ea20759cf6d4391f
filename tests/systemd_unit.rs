//! The systemd unit's own ExecStart line, run as systemd would (foreground, NOTIFY_SOCKET
//! set): READY=1 arrives only once the mount is live, SIGTERM unmounts and exits 0.

mod common;

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

use common::*;

fn unit_value(unit: &str, key: &str) -> String {
    unit.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("unit has no {key}")).to_string()
}

#[test]
fn unit_execstart_notifies_ready_after_mount_and_stops_cleanly() {
    let unit = std::fs::read_to_string(repo().join("systemd/xpackfs@.service")).unwrap();
    assert_eq!(unit_value(&unit, "Type"), "notify");
    assert_eq!(unit_value(&unit, "Restart"), "on-failure");
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let env: HashMap<&str, String> = HashMap::from([
        ("XPACKFS_SOURCE", sample().to_string_lossy().into_owned()),
        ("XPACKFS_MOUNTPOINT", mnt.to_string_lossy().into_owned()),
        ("XPACKFS_OPTIONS", "digest_store=none,top_k=2".to_string()),
    ]);
    let exec = unit_value(&unit, "ExecStart");
    let mut argv: Vec<String> = exec
        .split_whitespace()
        .map(|w| {
            let mut w = w.to_string();
            for (k, v) in &env {
                w = w.replace(&format!("${{{k}}}"), v);
            }
            w
        })
        .collect();
    assert_eq!(argv[0], "/usr/local/bin/xpackfs");
    argv[0] = bin().to_string();

    let sock_path = tmp.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut child = Command::new(&argv[0]).args(&argv[1..]).env("NOTIFY_SOCKET", &sock_path).spawn().unwrap();
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("no notification from the daemon");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.contains("READY=1"), "{msg}");
    // READY=1 means the mount is live.
    assert!(mounts_line(&mnt).is_some_and(|l| l.contains("fuse.xpackfs")), "READY=1 before the mount was live");
    assert_eq!(std::fs::metadata(mnt.join("sample-moe.pack")).unwrap().len(), 1302528);
    // SAFETY: kill() takes plain integers; the pid is a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = sock.recv(&mut buf).expect("no STOPPING notification");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    let status = child.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(mounts_line(&mnt).is_none(), "still mounted after SIGTERM");
}

#[test]
fn fstab_and_mount_unit_examples_use_the_helper_type() {
    let fstab = std::fs::read_to_string(repo().join("systemd/fstab.example")).unwrap();
    let line = fstab.lines().find(|l| !l.starts_with('#') && !l.trim().is_empty()).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[2], "fuse.xpackfs");
    // Every option in the examples is one xpackfs accepts.
    xpackfs::cli::check_mount_options(fields[3]).unwrap();
    let unit = std::fs::read_to_string(repo().join("systemd/mnt-deepseek\\x2dv4\\x2dflash.mount")).unwrap();
    assert_eq!(unit_value(&unit, "Type"), "fuse.xpackfs");
    xpackfs::cli::check_mount_options(&unit_value(&unit, "Options")).unwrap();
    for name in ["example.env", "example-requant.env", "example-s3.env"] {
        let env = std::fs::read_to_string(repo().join("systemd").join(name)).unwrap();
        let o = env.lines().find_map(|l| l.strip_prefix("XPACKFS_OPTIONS=")).unwrap();
        xpackfs::cli::check_mount_options(o).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(o.contains("disk_cache=/var/cache/xpackfs"), "{name}: the examples keep computed chunks in the unit's CacheDirectory");
    }
    assert_eq!(unit_value(&std::fs::read_to_string(repo().join("systemd/xpackfs@.service")).unwrap(), "CacheDirectory"), "xpackfs");
    // The README's fstab line for a remote source.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let line = readme.lines().find(|l| l.starts_with("s3://") && l.contains("fuse.xpackfs")).expect("the README's fstab line for s3://");
    xpackfs::cli::check_mount_options(line.split_whitespace().nth(3).unwrap()).unwrap();
}
