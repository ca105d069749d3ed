//! Writes the seed corpora: `cargo run --manifest-path fuzz/Cargo.toml --bin seed_corpus`
//! fills `fuzz/corpus/<target>/` (or the directory given as the first argument).

use std::path::PathBuf;

fn main() {
    let root = std::env::args().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus"),
        PathBuf::from,
    );
    let mut written = 0;
    for (target, name, bytes) in anvil_fuzz::seed_corpus() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("create corpus directory");
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
        written += 1;
    }
    println!("wrote {written} seeds under {}", root.display());
}
