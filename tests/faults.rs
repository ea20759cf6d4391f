//! Faults while mounted: the source changes or disappears (EIO for affected files, with a
//! log line, never mixed bytes), and the daemon is killed (the mountpoint recovers).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const PACK: &str = "s.pack";

fn setup() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("s.gguf");
    std::fs::copy(sample(), &src).unwrap();
    let log = dir.path().join("daemon.log");
    (dir, src, log)
}

fn expect_eio(m: &Mount, log: &Path, what: &str) {
    match std::fs::read(m.path(PACK)) {
        Ok(_) => panic!("{what}: the pack was served after the source changed"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}"),
    }
    // Header and manifest are in memory and describe the source the mount was made from.
    assert!(std::fs::read(m.path("s.pack.manifest.json")).is_ok());
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.contains("source changed while in use"), "{what}: no log line:\n{text}");
}

#[test]
fn source_rewritten_in_place_truncated_replaced_or_deleted_gives_eio() {
    for case in ["rewritten", "truncated", "replaced", "deleted"] {
        let (dir, src, log) = setup();
        let m = Mount::new(&src, &[&format!("log_file={}", log.display()), "top_k=2"]);
        let size = std::fs::metadata(&src).unwrap().len();
        match case {
            "rewritten" => {
                let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &[0xAB; 64], size - 4096).unwrap();
            }
            "truncated" => std::fs::OpenOptions::new().write(true).open(&src).unwrap().set_len(size / 2).unwrap(),
            "replaced" => {
                let other = dir.path().join("other.gguf");
                std::fs::copy(&src, &other).unwrap();
                std::fs::rename(&other, &src).unwrap();
                std::thread::sleep(Duration::from_millis(1100)); // the path check runs at most once a second
            }
            "deleted" => {
                std::fs::remove_file(&src).unwrap();
                std::thread::sleep(Duration::from_millis(1100));
            }
            _ => unreachable!(),
        }
        expect_eio(&m, &log, case);
        m.unmount();
    }
}

#[test]
fn a_killed_daemon_does_not_wedge_the_mountpoint() {
    // With auto_unmount the mount goes away with the daemon.
    let (_dir, src, _log) = setup();
    let m = Mount::new(&src, &["auto_unmount"]);
    // The daemon only: fusermount3's auto_unmount helper (whose command line also names the
    // mountpoint) is what unmounts when the daemon dies.
    let pids: Vec<u32> = live_processes_mentioning(&m.mountpoint.to_string_lossy())
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "xpackfs"))
        .collect();
    assert_eq!(pids.len(), 1);
    for p in &pids {
        // SAFETY: kill() takes plain integers; the pid is a child this test started.
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    // A bound on liveness, not a speed: it took 2-3 s here, 8.5 s once on a loaded machine,
    // and exceeded 10 s once in a CI run (cause not found; 0 of 20 reruns, loaded or not).
    wait_until("auto_unmount after kill -9", Duration::from_secs(30), || mounts_line(&m.mountpoint).is_none());
    let again = Command::new(bin()).arg("mount").arg(&src).arg(&m.mountpoint).args(["-o", "digest_store=none"]).output().unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(std::fs::metadata(m.path(PACK)).is_ok());
    m.unmount();

    // Without it, the documented recovery (umount -l) clears the dead mount.
    let (_dir, src, _log) = setup();
    let m = Mount::new(&src, &[]);
    for p in live_processes_mentioning(&m.mountpoint.to_string_lossy()) {
        // SAFETY: kill() takes plain integers; the pid is a child this test started.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    wait_until("daemon gone", Duration::from_secs(10), || live_processes_mentioning(&m.mountpoint.to_string_lossy()).is_empty());
    // ENOTCONN, or ECONNABORTED for a request that was queued when the kernel aborted the
    // connection (the daemon's death closes /dev/fuse).
    let e = std::fs::metadata(m.path(PACK)).unwrap_err();
    assert!(matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)), "{e}");
    run_ok(Command::new("umount").arg("-l").arg(&m.mountpoint));
    let again = Command::new(bin()).arg("mount").arg(&src).arg(&m.mountpoint).args(["-o", "digest_store=none"]).output().unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(std::fs::metadata(m.path(PACK)).is_ok());
    m.unmount();
}

/// Unmount and mount again on the same mountpoint while the old daemon is still serving
/// (a lazy unmount with a file open, a quick remount, a service restart): the old daemon,
/// when it finally exits, must not take the new mount down with it.
#[test]
fn a_remount_survives_the_old_daemon_exiting() {
    let (dir, src, _log) = setup();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount = || run_ok(Command::new(bin()).arg("mount").arg(&src).arg(&mnt).args(["-o", "digest_store=none"]));
    mount();
    // Keep the old mount busy, detach it, mount anew at the same path, then let the old one go.
    let held = std::fs::File::open(mnt.join(PACK)).unwrap();
    run_ok(Command::new("umount").arg("-l").arg(&mnt));
    mount();
    drop(held);
    let needle = mnt.to_string_lossy().to_string();
    wait_until("the old daemon to exit", Duration::from_secs(10), || live_processes_mentioning(&needle).len() <= 1);
    std::thread::sleep(Duration::from_millis(300));
    assert!(mounts_line(&mnt).is_some(), "the new mount was unmounted by the old daemon");
    assert!(std::fs::read(mnt.join(PACK)).is_ok());
    umount(&mnt);
}
