//! (being written)

use crate::error::{fail, Result};
use crate::workloads::{Overrides, Tier, Workload};

pub fn workload(_tier: Tier, _overrides: &Overrides) -> Result<Box<dyn Workload>> {
    fail("not written yet")
}
