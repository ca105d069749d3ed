//! `anvil-bench`: the benchmark suite as its own program; `anvil bench` is
//! the same command inside the `anvil` binary.

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "anvil-bench", version)]
struct Cli {
    #[command(flatten)]
    bench: anvil_bench::cli::BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match anvil_bench::cli::run(cli.bench) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("anvil-bench: error: {err}");
            ExitCode::FAILURE
        }
    }
}
