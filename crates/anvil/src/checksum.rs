//! The one checksum used on media: XXH3-64 (fast, well distributed; verifies every block and
//! every extent).

pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// `checksum` of the concatenation of `parts`, without making it.
pub fn checksum_parts(parts: &[&[u8]]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.digest()
}

/// Hash used for directory entry and xattr names. Part of the format: never change it.
pub fn name_hash(name: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name, 0x616e_7669_6c00_0001)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_parts_is_the_checksum_of_the_whole() {
        let bytes: Vec<u8> = (0..40_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for len in [0, 1, 48, 56, 64, 200, 240, 241, 1024, 4096, 16_384, 40_000] {
            let whole = &bytes[..len];
            for cut in [0, len / 3, len / 2, len] {
                let (a, b) = whole.split_at(cut);
                assert_eq!(
                    checksum_parts(&[a, &[], b]),
                    checksum(whole),
                    "len {len} cut {cut}"
                );
            }
        }
    }
}
