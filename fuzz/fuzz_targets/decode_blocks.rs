//! One block or record, its kind picked by the first input byte; header fixed and checksum
//! recomputed before decoding. See `anvil_fuzz::decode_block`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    anvil_fuzz::decode_block(data);
});
