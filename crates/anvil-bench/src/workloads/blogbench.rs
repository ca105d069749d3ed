//! (being written)

use crate::error::{fail, Result};
use crate::workloads::{Overrides, Tier, Workload};

pub fn workload(_tier: Tier, _overrides: &Overrides) -> Result<Box<dyn Workload>> {
    fail("not written yet")
}

#[derive(Debug, clap::Args)]
pub struct BlogbenchArgs {
    #[arg(short = 'd', long)]
    pub directory: std::path::PathBuf,
}

pub fn standalone(_args: &BlogbenchArgs) -> Result<()> {
    fail("not written yet")
}

pub fn overhead_pair(_dir: &std::path::Path, _blogs: u32) -> Result<(f64, f64)> {
    fail("not written yet")
}
