//! Handing freed heap memory back to the kernel.

/// Starts a thread that hands the heap's free pages back to the kernel once they add up to
/// `TRIM_FREE_BYTES` (looked at every second).
///
/// Why: pending changes pass through the allocator in large amounts (up to a quarter of
/// the cache budget) and are freed by each commit, but glibc keeps freed memory in its
/// arenas. A FUSE daemon shares a memory cgroup with the programs using the mount, and an
/// embedding program shares its own heap: memory kept but not used is memory the kernel's
/// page cache (or the program) cannot have. Trimming less than that is not worth it: the
/// next allocations fault the pages back in (trimming every second cost small-file
/// workloads about 8% of the daemon's time in page faults and heap growth).
///
/// This is for programs that allocate through glibc's malloc. The `anvil` binary allocates
/// through jemalloc, which returns freed pages from its own thread (its settings are in
/// the binary's `main.rs`), so its daemon does not start this thread; the bench's
/// library targets still do, for the `anvil-bench` binary, which keeps glibc's malloc.
pub fn start_heap_trimmer() {
    let spawned = std::thread::Builder::new()
        .name("anvil-trim".into())
        .spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            trim_heap();
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the heap trimmer: {e}");
    }
}

/// Free heap memory worth returning to the kernel.
const TRIM_FREE_BYTES: usize = 32 << 20;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    // SAFETY: mallinfo2 reads the allocator's statistics; malloc_trim only returns free
    // pages of its arenas to the kernel.
    unsafe {
        if libc::mallinfo2().fordblks >= TRIM_FREE_BYTES {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}
