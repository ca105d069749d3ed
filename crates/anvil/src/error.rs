//! Errors of the engine. Each variant says what happened and maps to one errno at the FUSE
//! edge (`Error::errno`) and to one line at the command line (`Display`).

use std::fmt;
use std::io;

/// Everything the engine can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The device failed an I/O request.
    Io(io::Error),
    /// A structure on the device failed validation: checksum, magic, bounds or an invariant.
    Corrupt { what: String, location: String },
    /// The image does not hold an anvil volume at all.
    NotAnvil(String),
    /// The image was written by a newer format version than this build understands.
    Version { found: u16, supported: u16 },
    /// The volume or view is read-only by request (as-of view, `ro` mount).
    ReadOnly,
    /// The volume stopped taking changes after a failure (a commit that could not be written,
    /// metadata damage found while mounted); the reason is the first failure's message.
    /// What was durable before it stays readable.
    Stopped(String),
    /// The volume has no room left for the request.
    NoSpace,
    /// A POSIX-level failure with its errno (ENOENT, EEXIST, ENOTEMPTY, ...).
    Posix(i32),
    /// The caller asked for something that cannot be done as stated.
    Invalid(String),
    /// A mirror stream was refused (damaged, truncated, foreign, or not the one this
    /// slave needs next); nothing of it was applied.
    Stream(String),
    /// The volume is a mirror slave: only `mirror-write` changes it until it is promoted.
    Slave,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn corrupt(what: impl Into<String>, location: impl Into<String>) -> Error {
        Error::Corrupt {
            what: what.into(),
            location: location.into(),
        }
    }

    /// The errno this error becomes at the FUSE edge.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } => libc::EIO,
            Error::NotAnvil(_) | Error::Version { .. } => libc::EINVAL,
            Error::ReadOnly | Error::Stopped(_) => libc::EROFS,
            Error::NoSpace => libc::ENOSPC,
            Error::Posix(errno) => *errno,
            Error::Invalid(_) | Error::Stream(_) => libc::EINVAL,
            Error::Slave => libc::EROFS,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Corrupt { what, location } => {
                write!(
                    f,
                    "corruption detected: {what} at {location}; run `anvil check`"
                )
            }
            Error::NotAnvil(why) => write!(f, "not an anvil volume: {why}"),
            Error::Version { found, supported } => write!(
                f,
                "volume format version {found} is newer than this anvil supports ({supported}); \
                 upgrade anvil"
            ),
            Error::ReadOnly => write!(f, "read-only volume or view"),
            Error::Stopped(why) => write!(
                f,
                "the volume stopped taking changes after an earlier failure ({why}); \
                 unmount it and run `anvil check`"
            ),
            Error::NoSpace => write!(f, "no space left on the volume; delete files or prune"),
            Error::Posix(errno) => write!(f, "{}", io::Error::from_raw_os_error(*errno)),
            Error::Invalid(why) => write!(f, "invalid request: {why}"),
            Error::Stream(why) => write!(f, "mirror stream refused: {why}"),
            Error::Slave => write!(
                f,
                "read-only: this volume is a mirror slave (only mirror-write changes it; \
                 `anvil mirror-promote` makes it a master)"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

/// Shorthand for POSIX failures inside the filesystem layer.
pub(crate) fn posix<T>(errno: i32) -> Result<T> {
    Err(Error::Posix(errno))
}
