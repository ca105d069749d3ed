//! The fuzz harness. Its code lives in the engine's test tree so that the stable regression
//! test (`crates/anvil/tests/fuzz_regressions.rs`) replays inputs through the very same code.

#[path = "../../crates/anvil/tests/support/fuzz_harness.rs"]
mod harness;

pub use harness::*;
