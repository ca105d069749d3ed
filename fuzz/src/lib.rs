//! The fuzz harness. Its code lives in the engine's test tree so that the stable regression
//! test (`crates/anvil/tests/fuzz_regressions.rs`) replays inputs through the very same code.

#[path = "../../crates/anvil/tests/support/fuzz_harness.rs"]
mod harness;

pub use harness::*;

#[cold]
fn too_big(bytes: usize) -> ! {
    // The backtrace's own allocations are small: they pass the check.
    let trace = std::backtrace::Backtrace::force_capture();
    eprintln!("==fuzz== ERROR: allocation of {bytes} bytes (over {ALLOCATION_BYTES_MAX})\n{trace}");
    std::process::abort()
}

#[global_allocator]
static ALLOCATOR: Capped = Capped(too_big);
