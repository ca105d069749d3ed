//! The workloads of `anvil bench`. Each is a [`Workload`] built from its
//! parameters, which start from the chosen [`Tier`]'s defaults and can be
//! overridden one by one (`--set key=value`); the parameters are recorded in
//! the results exactly as run.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::env::{RunEnv, RunOutput};
use crate::error::{fail, BenchError, Result};

pub mod backup;
pub mod blogbench;
pub mod iozone;
pub mod metadata;
pub mod mirror;
pub mod nightly;
pub mod proxy;

/// Size of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Seconds; for tests of the suite itself. Numbers mean nothing.
    Tiny,
    /// Under about 2 minutes per workload and target.
    Quick,
    /// About 5-15 minutes per workload and target.
    Standard,
    /// The sizes of the original papers; hours.
    Full,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Tiny => "tiny",
            Tier::Quick => "quick",
            Tier::Standard => "standard",
            Tier::Full => "full",
        }
    }
}

/// One benchmark, ready to run with fixed parameters.
pub trait Workload: Send + Sync {
    /// e.g. "blogbench".
    fn name(&self) -> &'static str;
    /// The parameters, as recorded in the results.
    fn params(&self) -> serde_json::Value;
    /// Whether the workload can run through [`crate::vfs::AnvilVfs`]
    /// (`--fs anvil-lib`), i.e. it uses only `env.vfs` and never `env.dir`.
    fn lib_capable(&self) -> bool {
        false
    }
    /// Smallest file system (bytes) the workload needs with these parameters,
    /// if it knows; the harness refuses smaller targets up front.
    fn min_fs_bytes(&self) -> Option<u64> {
        None
    }
    /// The cache (`-o cache=`) for anvil's FUSE daemon under a memory limit of `mem_limit`
    /// bytes, where the workload knows better than the bench's default for that limit
    /// (`default`, a quarter of it): one that keeps much of the limit for itself.
    /// `--anvil-cache` overrides it.
    fn anvil_daemon_cache(&self, _mem_limit: u64, _default: u64) -> Option<u64> {
        None
    }
    /// One run in an empty directory on a freshly made file system.
    fn run(&self, env: &RunEnv) -> Result<RunOutput>;
}

/// Workload names, in the order `all` runs them.
pub const NAMES: &[&str] = &[
    "metadata",
    "blogbench",
    "iozone",
    "proxy-cache",
    "nightly-build",
    "backup",
    "mirror",
];

/// `key=value` overrides of workload parameters.
pub type Overrides = [(String, String)];

/// Builds a workload by name.
pub fn by_name(name: &str, tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    match name {
        "metadata" => metadata::workload(tier, overrides),
        "blogbench" => blogbench::workload(tier, overrides),
        "iozone" => iozone::workload(tier, overrides),
        "proxy-cache" => proxy::workload(tier, overrides),
        "nightly-build" => nightly::workload(tier, overrides),
        "backup" => backup::workload(tier, overrides),
        "mirror" => mirror::workload(tier, overrides),
        _ => fail(format!(
            "unknown workload '{name}' (known: {})",
            NAMES.join(", ")
        )),
    }
}

/// Applies `key=value` overrides to a parameter struct. A value is read as
/// JSON when it parses (numbers, true/false, lists) and as a string otherwise;
/// unknown keys are an error that lists the known ones.
pub fn apply_overrides<P: Serialize + DeserializeOwned>(
    params: P,
    overrides: &Overrides,
) -> Result<P> {
    let mut value = serde_json::to_value(&params).map_err(|e| BenchError(e.to_string()))?;
    let Some(map) = value.as_object_mut() else {
        return fail("workload parameters are not a JSON object");
    };
    for (key, raw) in overrides {
        let key = key.replace('-', "_");
        if !map.contains_key(&key) {
            let known: Vec<&str> = map.keys().map(String::as_str).collect();
            return fail(format!(
                "unknown parameter '{key}' (known: {})",
                known.join(", ")
            ));
        }
        let v =
            serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.clone()));
        map.insert(key, v);
    }
    serde_json::from_value(value).map_err(|e| BenchError(format!("bad parameter value: {e}")))
}

/// Parses `key=value`.
pub fn parse_override(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected key=value, got '{s}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct P {
        files: u64,
        content: String,
        threads: Vec<u32>,
    }

    #[test]
    fn overrides_parse_json_or_string_and_reject_unknown_keys() {
        let p = P {
            files: 1,
            content: "zero".into(),
            threads: vec![1],
        };
        let ov = vec![
            ("files".to_string(), "7".to_string()),
            ("content".to_string(), "random".to_string()),
            ("threads".to_string(), "[1,2]".to_string()),
        ];
        let p = apply_overrides(p, &ov).unwrap();
        assert_eq!(p.files, 7);
        assert_eq!(p.content, "random");
        assert_eq!(p.threads, vec![1, 2]);
        let bad = vec![("nope".to_string(), "1".to_string())];
        let err = apply_overrides(p, &bad).unwrap_err().to_string();
        assert!(
            err.contains("unknown parameter 'nope'") && err.contains("files"),
            "{err}"
        );
    }
}
