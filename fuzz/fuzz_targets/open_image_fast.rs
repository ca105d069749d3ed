//! `open_image` over a small seed image built once per process and cloned copy-on-write per
//! input: the same input format and walk, many times the executions per second. See
//! `anvil_fuzz::open_image_fast`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: {
    anvil_fuzz::small_seed_image();
}, |data: &[u8]| {
    anvil_fuzz::open_image_fast(data);
});
