//! The one checksum used on media: XXH3-64 (fast, well distributed; verifies every block and
//! every extent).

pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Hash used for directory entry and xattr names. Part of the format: never change it.
pub fn name_hash(name: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name, 0x616e_7669_6c00_0001)
}
