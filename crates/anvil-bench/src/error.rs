//! The error type of the benchmark suite: one line saying what failed.

use std::io;

/// Error with the operation and path that failed.
#[derive(Debug)]
pub struct BenchError(pub String);

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

pub type Result<T> = std::result::Result<T, BenchError>;

pub fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(BenchError(msg.into()))
}

/// Adds "what was being done" to an I/O error.
pub trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|err| BenchError(format!("{}: {err}", what())))
    }
}
