//! The fuzz harness. Its code lives in the engine's test tree so that the stable regression
//! test (`crates/anvil/tests/fuzz_regressions.rs`) replays inputs through the very same code.

#[path = "../../crates/anvil/tests/support/fuzz_harness.rs"]
mod harness;

pub use harness::*;

use std::alloc::{GlobalAlloc, Layout, System};

/// One allocation larger than this aborts (libFuzzer reports a crash): hostile bytes must
/// not make the engine allocate without bound. Under AddressSanitizer libFuzzer's
/// `-malloc_limit_mb` checks the same, but `scripts/fuzz-count.sh` builds without a
/// sanitizer (see `docs/fuzzing.md`), where nothing else would notice a huge allocation
/// that is never touched.
pub const ALLOCATION_BYTES_MAX: usize = 256 << 20;

struct Capped;

#[cold]
fn too_big(bytes: usize) -> ! {
    // The backtrace's own allocations are small: they pass the check.
    let trace = std::backtrace::Backtrace::force_capture();
    eprintln!("==fuzz== ERROR: allocation of {bytes} bytes (over {ALLOCATION_BYTES_MAX})\n{trace}");
    std::process::abort()
}

// SAFETY: forwards to the system allocator unchanged, after a size check.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_BYTES_MAX {
            too_big(layout.size());
        }
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_BYTES_MAX {
            too_big(layout.size());
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_BYTES_MAX {
            too_big(new_size);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;
