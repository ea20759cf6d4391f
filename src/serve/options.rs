//! Serving options: FUSE transport, caching modes, access and logging. Declared once (clap
//! derive); the CLI accepts each as a `--key value` flag and as `-o key=value` (fstab,
//! `mount -t fuse.xpackfs`), mapped onto the same struct. View options are the view layer's
//! ([`crate::view::ViewOptions`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::util::args::{InvalidValue, int_in, switch};

/// `auto`, `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auto {
    Auto,
    On,
    Off,
}

impl Auto {
    pub fn parse(s: &str) -> Result<Auto, InvalidValue> {
        match s {
            "auto" => Ok(Auto::Auto),
            _ => switch(s).map(|on| if on { Auto::On } else { Auto::Off }).map_err(|_| InvalidValue::given(s, "is not auto, on or off")),
        }
    }

    /// `None` for auto.
    pub fn forced(self) -> Option<bool> {
        match self {
            Auto::Auto => None,
            Auto::On => Some(true),
            Auto::Off => Some(false),
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServeOptions {
    /// FUSE worker threads (default: the CPU count, at least 2, at most 8)
    #[arg(long, value_parser = int_in::<usize>(1, 256), help_heading = "Serving")]
    pub threads: Option<usize>,
    /// on|off: one /dev/fuse descriptor per worker thread
    #[arg(long, default_value = "on", value_parser = switch, action = clap::ArgAction::Set, help_heading = "Serving")]
    pub clone_fd: bool,
    /// Largest read request in bytes (4096 to 1 MiB)
    #[arg(long, default_value = "1048576", value_parser = int_in::<u32>(4096, 1 << 20), help_heading = "Serving")]
    pub max_read: u32,
    /// Kernel readahead of the mount in KiB (default: 8 x max_read for views with files of
    /// source bytes, whose source is read with direct I/O; max_read for views with computed
    /// files or files of remote sources; else the kernel's)
    #[arg(long, value_parser = int_in::<u32>(0, 1 << 20), help_heading = "Serving")]
    pub read_ahead_kb: Option<u32>,
    /// Pending background (readahead) requests the kernel may queue (default: 64 for mounts
    /// of remote sources, else fuser's 16)
    #[arg(long, value_parser = int_in::<u16>(1, u16::MAX), help_heading = "Serving")]
    pub max_background: Option<u16>,
    /// auto|on|off: on: reads bypass the kernel's page cache of the mount (FOPEN_DIRECT_IO;
    /// mmap keeps working with FUSE_DIRECT_IO_ALLOW_MMAP, kernel 6.6+). auto and off: the
    /// mount's page cache holds the view's files, and files made of source bytes (the
    /// packs) read their source around the page cache, so memory holds one copy; auto
    /// only: packs of remote sources larger than one part bypass it (kernel 6.6+), as
    /// O_DIRECT readers do, and re-reads come from the fetched parts, the disk cache or
    /// the network
    #[arg(long, default_value = "auto", value_parser = Auto::parse, help_heading = "Serving")]
    pub direct_io: Auto,
    /// auto|direct|buffered: how reads of a handle read the source. auto: direct for clients
    /// reading with O_DIRECT (SGLang's loader) and for files of source bytes kept in the
    /// mount's page cache, so neither leaves source pages in memory; else buffered
    #[arg(long, default_value = "auto", value_parser = SourceIoChoice::parse, help_heading = "Serving")]
    pub source_io: SourceIoChoice,
    /// Threads that serve the reads of direct handles (clients' O_DIRECT handles, and handles
    /// of packs kept in the mount's page cache, whose source is read with O_DIRECT), so that
    /// many reach the device at once while other reads stay on the FUSE workers (0: on the
    /// FUSE workers)
    #[arg(long, default_value = "32", value_parser = int_in::<usize>(0, 256), help_heading = "Serving")]
    pub direct_threads: usize,
    /// Reads of direct handles larger than this many KiB are read as parallel pieces of it
    /// (0: whole; measured no gain with the direct-read pool, see tools/bench/bench_serve.py)
    #[arg(long, default_value = "0", value_parser = direct_piece_kb, help_heading = "Serving")]
    pub direct_piece_kb: usize,
    /// on|off: FUSE_ASYNC_DIO, the kernel sends the requests of one large O_DIRECT read at once
    #[arg(long, default_value = "on", value_parser = switch, action = clap::ArgAction::Set, help_heading = "Serving")]
    pub async_dio: bool,
    /// auto|off: files that are whole source files (INT8 tree mounts), and files kept whole
    /// in the disk cache (disk_cache_files), are read by the kernel straight from the file
    /// with FUSE passthrough (kernel 6.9+, root); auto falls back to reads through the daemon
    /// where unavailable
    #[arg(long, default_value = "auto", value_parser = passthrough, action = clap::ArgAction::Set, help_heading = "Serving")]
    pub passthrough: bool,
    /// on|off: /.xpackfs/stats.json (default on; off for views whose root must hold nothing
    /// else: kt-int8 and INT8 trees)
    #[arg(long, value_parser = switch, help_heading = "Serving")]
    pub stats: Option<bool>,
    /// ADDR:PORT: serve Prometheus metrics (OpenMetrics text) at http://ADDR:PORT/metrics,
    /// listening on exactly this address, an IP literal (127.0.0.1:9100, [::1]:9100; all
    /// interfaces only if given as 0.0.0.0). Off by default
    #[arg(long, value_name = "ADDR:PORT", value_parser = metrics_addr, help_heading = "Serving")]
    pub metrics: Option<SocketAddr>,
    /// Let other users access the mount
    #[arg(long, help_heading = "Access")]
    pub allow_other: bool,
    /// Let root access the mount
    #[arg(long, help_heading = "Access")]
    pub allow_root: bool,
    /// Unmount when the daemon dies (needs fusermount3)
    #[arg(long, help_heading = "Access")]
    pub auto_unmount: bool,
    /// Path the manifests name for the mount (when the mountpoint is /dev/fd/N)
    #[arg(long, value_name = "PATH", help_heading = "Access")]
    pub mountpoint_path: Option<PathBuf>,
    /// Append logs here when running in the background
    #[arg(long, value_name = "FILE", help_heading = "Logging")]
    pub log_file: Option<PathBuf>,
    /// Debug logging
    #[arg(long, help_heading = "Logging")]
    pub debug: bool,
    /// Stay in the foreground (same as -f)
    #[arg(long, short = 'f', help_heading = "Logging")]
    pub foreground: bool,
}

/// `source_io`: `None` for auto (each handle as the client opened the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceIoChoice(pub Option<crate::source::SourceIo>);

impl SourceIoChoice {
    pub fn parse(s: &str) -> Result<SourceIoChoice, InvalidValue> {
        match s {
            "auto" => Ok(SourceIoChoice(None)),
            "direct" => Ok(SourceIoChoice(Some(crate::source::SourceIo::Direct))),
            "buffered" => Ok(SourceIoChoice(Some(crate::source::SourceIo::Buffered))),
            _ => Err(InvalidValue::given(s, "is not auto, direct or buffered")),
        }
    }
}

fn direct_piece_kb(s: &str) -> Result<usize, InvalidValue> {
    match int_in::<usize>(0, 1024)(s)? {
        v @ (0 | 4..=1024) => Ok(v),
        v => Err(InvalidValue::number(v, "must be 0 or from 4 to 1024")),
    }
}

/// Why a `metrics` address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricsAddrError {
    #[error("{0:?} is not IP:PORT (e.g. 127.0.0.1:9100 or [::1]:9100)")]
    NotAddr(String),
    #[error("{0:?}: the port must not be 0")]
    PortZero(String),
}

fn metrics_addr(s: &str) -> Result<SocketAddr, MetricsAddrError> {
    let addr: SocketAddr = s.parse().map_err(|_| MetricsAddrError::NotAddr(s.to_string()))?;
    if addr.port() == 0 {
        return Err(MetricsAddrError::PortZero(s.to_string()));
    }
    Ok(addr)
}

fn passthrough(s: &str) -> Result<bool, InvalidValue> {
    Auto::parse(s).map(|a| a != Auto::Off).map_err(|_| InvalidValue::given(s, "is not auto or off"))
}

impl ServeOptions {
    /// More workers than cores only adds context switches to the transport (measured with
    /// tools/bench/bench_serve.py: on 2 cores, 2 workers read the pack 1.1-1.4x faster than 8).
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(8).clamp(2, 8))
    }
}
