//! `anvil-bench`: file-system micro-benchmarks run through the normal
//! POSIX interface, so that anvil (over FUSE) and a native file system such
//! as ext4 can be measured with the same code.
//!
//! * `anvil-bench quick --dir PATH` measures small-file create, stat and
//!   cached re-read, 1 MiB sequential write and cold sequential read, and
//!   unlink, over several runs, and reports median, min and max.
//! * `anvil-bench compare BASE.json CAND.json` prints the candidate/baseline
//!   ratio of each metric of two `quick --json` reports.

use anvil_bench::{quick, report};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "anvil-bench",
    version,
    about = "File-system benchmarks for anvil"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Small-file and sequential-I/O benchmark on one directory.
    Quick(quick::QuickArgs),
    /// Compare two `quick --json` reports: candidate / baseline per metric.
    Compare {
        /// Report of the reference file system (e.g. ext4).
        baseline: PathBuf,
        /// Report of the file system under test (e.g. anvil).
        candidate: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Quick(args) => quick::run(&args),
        Command::Compare {
            baseline,
            candidate,
        } => report::compare(&baseline, &candidate),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("anvil-bench: error: {err}");
            ExitCode::FAILURE
        }
    }
}
