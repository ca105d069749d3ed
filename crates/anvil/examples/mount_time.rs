//! Times opening a large volume: with the space map its last commit wrote, and with the free
//! map rebuilt by walking the tree (what every mount did before space maps), warm (image in
//! the host page cache) and cold (page cache dropped first; needs root).
//!
//! ```text
//! cargo run --release -p anvil --example mount_time -- IMAGE [--files N] [--rounds R] [--runs K]
//! ```
//!
//! Builds IMAGE first if it does not exist: N files (default 1,000,000) of 16 bytes in
//! directories of 1,000, then R rounds (default 5) that rewrite every file, one commit per
//! round, so each file leaves 2 history elements (its data and inode) per round.

use anvil::device::{Device, FileDevice};
use anvil::fs::Caller;
use anvil::{Filesystem, MountOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.replace('_', "").parse().expect("a number"))
        .unwrap_or(default)
}

fn build(image: &Path, files: u64, rounds: u64) -> anvil::Result<()> {
    let device = Arc::new(FileDevice::create(image)?);
    Filesystem::mkfs(device.clone(), 16 << 30, "mount-time")?;
    let options = MountOptions {
        cache_bytes: 2 << 30,
        commit_interval_ms: 60_000,
        ..Default::default()
    };
    let fs = Filesystem::open(device as Arc<dyn Device>, options)?;
    let started = Instant::now();
    let mut inos = Vec::with_capacity(files as usize);
    let mut dir = 0;
    for i in 0..files {
        if i % 1000 == 0 {
            let name = format!("d{:04}", i / 1000);
            dir = fs.mkdir(Caller::ROOT, 1, name.as_bytes(), 0o755)?.ino;
        }
        let attr = fs.mknod(
            Caller::ROOT,
            dir,
            format!("f{i:07}").as_bytes(),
            0o100644,
            0,
        )?;
        fs.write(attr.ino, 0, format!("{i:015}\n").as_bytes())?;
        inos.push(attr.ino);
    }
    fs.sync()?;
    eprintln!("created {files} files in {:.1?}", started.elapsed());
    for round in 0..rounds {
        let started = Instant::now();
        for (i, ino) in inos.iter().enumerate() {
            fs.write(*ino, 0, format!("{round:03}-{i:011}\n").as_bytes())?;
        }
        fs.sync()?;
        eprintln!(
            "round {round}: rewrote {files} files in {:.1?}",
            started.elapsed()
        );
    }
    let report = anvil::check::check(fs.volume())?;
    eprintln!(
        "{} elements ({} history), {} nodes, {} objects, clean: {}",
        report.elements,
        report.history_elements,
        report.nodes,
        report.objects,
        report.is_clean()
    );
    fs.close()
}

fn drop_page_cache() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn time_open(image: &Path, walk: bool, cold: bool) -> anvil::Result<f64> {
    if cold && !drop_page_cache() {
        return Err(anvil::Error::Invalid(
            "cold runs need root (/proc/sys/vm/drop_caches)".into(),
        ));
    }
    let options = MountOptions {
        read_only: true,
        rebuild_space_map: walk,
        ..Default::default()
    };
    let started = Instant::now();
    let fs = Filesystem::open_path(image, options)?;
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(fs.volume().space_map_was_read(), !walk);
    drop(fs);
    Ok(elapsed)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(image) = args.first().filter(|a| !a.starts_with("--")) else {
        eprintln!("usage: mount_time IMAGE [--files N] [--rounds R] [--runs K]");
        std::process::exit(2);
    };
    let image = Path::new(image);
    if !image.exists() {
        if let Err(e) = build(
            image,
            arg(&args, "--files", 1_000_000),
            arg(&args, "--rounds", 5),
        ) {
            eprintln!("mount_time: building {}: {e}", image.display());
            std::process::exit(1);
        }
    }
    let runs = arg(&args, "--runs", 5);
    println!("open of {} (median of {runs})", image.display());
    for (label, walk) in [("space map", false), ("tree walk", true)] {
        for cold in [false, true] {
            let times: Result<Vec<f64>, _> =
                (0..runs).map(|_| time_open(image, walk, cold)).collect();
            match times {
                Ok(times) => println!(
                    "  {label:<9} {:<4}: {:>8.3} s",
                    if cold { "cold" } else { "warm" },
                    median(times)
                ),
                Err(e) => {
                    eprintln!("mount_time: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
}
