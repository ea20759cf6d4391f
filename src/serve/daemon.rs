//! Process plumbing for `mount`: going to the background with a readiness pipe (the
//! parent returns only once the mount is live, or fails with the child's message, as
//! mountpoint-s3 does), systemd readiness, and signals.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// The child's end of the readiness pipe.
pub struct Readiness {
    pipe: Option<std::fs::File>,
}

/// Fork. The parent waits for the child's verdict and exits with it; only the child
/// returns. Must run before any thread is started.
pub fn daemonize() -> Readiness {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("xpackfs: pipe: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    // SAFETY: called before any thread is started (see above), so the child is a complete
    // copy of a single-threaded process.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!("xpackfs: fork: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
        0 => {
            // SAFETY: fds[0] is the read end this process owns and no longer needs; setsid has
            // no preconditions.
            unsafe {
                libc::close(fds[0]);
                libc::setsid();
            }
            // SAFETY: fds[1] is the write end of the pipe just created, owned by nothing else.
            Readiness { pipe: Some(unsafe { std::fs::File::from(OwnedFd::from_raw_fd(fds[1])) }) }
        }
        _child => {
            // SAFETY: fds[1] is the write end, which only the child uses.
            unsafe { libc::close(fds[1]) };
            // SAFETY: fds[0] is the read end of the pipe just created, owned by nothing else.
            let mut r = unsafe { std::fs::File::from(OwnedFd::from_raw_fd(fds[0])) };
            let mut msg = Vec::new();
            let _ = r.read_to_end(&mut msg);
            match msg.split_first() {
                Some((b'0', _)) => std::process::exit(0),
                Some((_, text)) => {
                    eprintln!("xpackfs: {}", String::from_utf8_lossy(text));
                    std::process::exit(1)
                }
                None => {
                    eprintln!("xpackfs: the daemon exited before the mount was ready");
                    std::process::exit(1)
                }
            }
        }
    }
}

impl Readiness {
    /// In the foreground: no pipe; readiness goes to systemd only.
    pub fn foreground() -> Self {
        Readiness { pipe: None }
    }

    pub fn is_background(&self) -> bool {
        self.pipe.is_some()
    }

    /// Report success: tell systemd (if it asked) and the waiting parent.
    pub fn ready(&mut self, log_file: Option<&Path>) {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(b"0");
            drop(p);
            detach_stdio(log_file);
        }
    }

    /// Report failure with a message.
    pub fn failed(&mut self, msg: &str) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(format!("1{msg}").as_bytes());
        }
    }
}

/// Point stdin at /dev/null and stdout/stderr at the log file (or /dev/null).
fn detach_stdio(log_file: Option<&Path>) {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null");
    let log = log_file.and_then(|p| std::fs::OpenOptions::new().create(true).append(true).open(p).ok());
    // SAFETY: dup2 onto the standard descriptors of descriptors that are open for the whole call.
    unsafe {
        if let Ok(n) = &null {
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(n), 0);
        }
        let out = log.as_ref().map(std::os::fd::AsRawFd::as_raw_fd).or(null.as_ref().ok().map(std::os::fd::AsRawFd::as_raw_fd));
        if let Some(fd) = out {
            libc::dup2(fd, 1);
            libc::dup2(fd, 2);
        }
    }
}

/// Block SIGTERM, SIGINT and SIGHUP in this thread and every thread started after,
/// so that [`wait_for_signal`] receives them.
pub fn block_signals() {
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

pub fn wait_for_signal() -> i32 {
    // SAFETY: `set` and `sig` are locals; `set` is initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
        sig
    }
}
