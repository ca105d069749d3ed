//! (being written)

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::results::BenchResults;

/// Renders every chart of `results` into `out_dir` as SVG and PNG; returns the files written.
pub fn render_all(_results: &BenchResults, _out_dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(Vec::new())
}

/// Terminal table of medians and ratios.
pub fn summary_table_text(_results: &BenchResults) -> String {
    String::new()
}

/// Terminal table of device I/O per target.
pub fn io_table_text(_results: &BenchResults) -> String {
    String::new()
}
