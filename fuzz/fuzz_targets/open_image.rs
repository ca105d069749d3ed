//! A small valid image with the input's patches applied (checksums fixed), opened, walked,
//! read and checked. See `anvil_fuzz::open_image`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: {
    anvil_fuzz::seed_image();
}, |data: &[u8]| {
    anvil_fuzz::open_image(data);
});
