//! A full volume tells the user what to run: `anvil info` names prune when
//! free space is down to the reserve and history holds the deleted data.

use std::process::Command;

use anvil::{Filesystem, MountOptions};

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

#[test]
fn info_on_a_full_volume_says_to_prune() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("full.img");
    let img_s = img.to_str().unwrap();
    let out = Command::new(ANVIL)
        .args(["mkfs", img_s, "--size", "64M"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let info = || {
        let out = Command::new(ANVIL).args(["info", img_s]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(!info().contains("volume full"), "{}", info());

    let fs = Filesystem::open_path(&img, MountOptions::default()).unwrap();
    // Incompressible data (anvil compresses), from xorshift64.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut chunk = vec![0u8; 1 << 20];
    let mut n = 0;
    let full = loop {
        for b in chunk.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes());
        }
        match fs.write_file(&format!("/f{n}"), &chunk) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100, "64 MiB volume never filled");
    };
    assert_eq!(full.errno(), libc::ENOSPC, "{full}");
    fs.sync().unwrap();
    // Deleting frees nothing while history keeps the versions.
    for i in 0..n {
        fs.remove_path(&format!("/f{i}")).unwrap();
    }
    fs.close().unwrap();
    drop(fs);

    let text = info();
    assert!(text.contains("volume full"), "{text}");
    assert!(text.contains("anvil prune"), "{text}");
}
