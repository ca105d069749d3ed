//! (being written)

use crate::error::{fail, Result};
use crate::workloads::{Overrides, Tier, Workload};

pub fn workload(_tier: Tier, _overrides: &Overrides) -> Result<Box<dyn Workload>> {
    fail("not written yet")
}

pub fn overhead_pair(_dir: &std::path::Path, _files: u32) -> Result<Vec<(String, f64, f64)>> {
    fail("not written yet")
}
