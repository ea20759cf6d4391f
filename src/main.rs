fn main() {
    // Buffers of 1 MiB and more (remote parts, computed chunks, read buffers) get mappings of
    // their own, returned to the system when freed. glibc's default raises its mmap threshold
    // after the first such free, and from then on freed parts stay in per-thread arenas: the
    // daemon's RSS then drifts far above the memory budgets it keeps (remote_memory_mb).
    // SAFETY: mallopt only tunes the allocator; it is called before any other thread exists.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
    std::process::exit(xpackfs::cli::main());
}
