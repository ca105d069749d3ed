//! `anvil bench`: the classic file-system comparisons — blogbench, a nightly
//! build, a web-proxy cache replay, an iozone-style sweep, backups with
//! snapshots and their mirroring to a second file system (send/receive), and
//! a metadata storm — run side by side on anvil and on peer
//! file systems built on identical loop devices, with tables, JSON and charts.
//!
//! Layers, bottom up:
//! * [`vfs`]: the operations workloads use, over a mounted directory or over
//!   an anvil volume opened in-process;
//! * [`target`] and [`cgroup`]: making, mounting and measuring targets, and
//!   the memory limit they run under;
//! * [`env`]: what a workload sees of its target and what it returns;
//! * [`workloads`]: the benchmarks themselves;
//! * [`results`], [`chart`], [`html`]: the JSON results, charts and report;
//! * [`runner`] and [`cli`]: running workloads over targets, and the command line.

pub mod cgroup;
pub mod chart;
pub mod cli;
pub mod env;
pub mod error;
pub mod html;
pub mod quick;
pub mod report;
pub mod results;
pub mod runner;
pub mod target;
#[cfg(test)]
pub mod testkit;
pub mod vfs;
pub mod workloads;
