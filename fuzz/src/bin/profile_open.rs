//! Times the phases of `open_image` (or, with the argument `fast`, `open_image_fast`) on
//! its seed corpus, without instrumentation: where a run's time goes.
//! `cargo run --release --manifest-path fuzz/Cargo.toml --bin profile_open -- fast`
use anvil::device::Device;
use anvil::format::record::ROOT_OBJ;
use anvil::{Filesystem, MountOptions};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let fast = std::env::args().nth(1).as_deref() == Some("fast");
    let target = if fast {
        "open_image_fast"
    } else {
        "open_image"
    };
    let t = Instant::now();
    if fast {
        anvil_fuzz::small_seed_image();
    } else {
        anvil_fuzz::seed_image();
    }
    println!("{target} seed image: {:?}", t.elapsed());
    let seeds: Vec<_> = anvil_fuzz::seed_corpus()
        .into_iter()
        .filter(|s| s.0 == target)
        .collect();
    let n: usize = std::env::var("N").map_or(20, |n| n.parse().unwrap());
    let mut phases = [0f64; 8];
    for _ in 0..n {
        for (_, _, data) in &seeds {
            let t0 = Instant::now();
            let (device, flags): (Arc<dyn Device>, u8) = if fast {
                let (device, flags) = anvil_fuzz::patched_small_image(data);
                (Arc::new(device), flags)
            } else {
                let (device, flags) = anvil_fuzz::patched_image(data);
                (Arc::new(device), flags)
            };
            let t1 = Instant::now();
            let opts = MountOptions {
                commit_interval_ms: 0,
                read_only: flags & 1 == 0,
                cache_bytes: 16 << 20,
                ..Default::default()
            };
            let Ok(fs) = Filesystem::open(device, opts) else {
                continue;
            };
            let t2 = Instant::now();
            let _ = anvil::check::check(fs.volume());
            let t3 = Instant::now();
            let mut dirs = vec![ROOT_OBJ];
            let mut inos = vec![];
            while let Some(d) = dirs.pop() {
                if let Ok(b) = fs.readdir(d, 0, 1000) {
                    for e in b {
                        if e.name == b"." || e.name == b".." {
                            continue;
                        }
                        if e.kind == anvil::FileKind::Dir {
                            dirs.push(e.ino);
                        }
                        inos.push(e.ino);
                        let _ = fs.read(e.ino, 0, 256 << 10);
                    }
                }
            }
            let t4 = Instant::now();
            for ino in inos.iter().take(16) {
                let _ = fs.history(*ino);
            }
            let t5 = Instant::now();
            if let Ok(commits) = fs.commits() {
                for (tid, _) in commits.first().into_iter().chain(commits.last()) {
                    if let Ok(view) = fs.at(*tid) {
                        let _ = view.readdir(ROOT_OBJ, 0, 64);
                    }
                }
            }
            let t6 = Instant::now();
            let _ = fs.close();
            let t7 = Instant::now();
            drop(fs);
            let t8 = Instant::now();
            let ts = [t0, t1, t2, t3, t4, t5, t6, t7, t8];
            for i in 0..8 {
                phases[i] += (ts[i + 1] - ts[i]).as_secs_f64();
            }
        }
    }
    let runs = (n * seeds.len()) as f64;
    for (name, p) in [
        "patch",
        "open",
        "check",
        "walk+read",
        "history",
        "asof",
        "close",
        "drop",
    ]
    .iter()
    .zip(phases)
    {
        println!("{name:10} {:8.1} us", p / runs * 1e6);
    }
    let t = Instant::now();
    for _ in 0..n {
        for (_, _, data) in &seeds {
            if fast {
                anvil_fuzz::open_image_fast(data);
            } else {
                anvil_fuzz::open_image(data);
            }
        }
    }
    println!(
        "{target}: {:.1} us/exec",
        t.elapsed().as_secs_f64() / runs * 1e6
    );
}
