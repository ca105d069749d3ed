//! `mount.fuse.anvil`: the helper mount(8) runs for `mount -t fuse.anvil IMAGE DIR -o OPTS`
//! and for /etc/fstab lines of type `fuse.anvil`. `scripts/setup.sh` links it to the
//! installed `anvil` binary; the binary acts as the helper when called by that name.
//!
//! mount(8) calls `mount.fuse.anvil SPEC DIR [-sfnv] [-o OPTIONS]`. Options that belong to
//! mount(8) itself (`defaults`, `noauto`, `nofail`, `_netdev`, `x-*`, ...) are dropped
//! (`nosuid`, `nodev`, `noexec` and their opposites are kept: `anvil mount` sets them);
//! `as_of=SPEC` and `log=FILE` stand for `--as-of` and `--log`; the rest are `anvil mount`'s.
//! `-o remount,...` changes the flags of the live mount instead of starting a daemon.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The name mount(8) looks for (`/sbin/mount.fuse.anvil`).
pub const NAME: &str = "mount.fuse.anvil";

/// Options that mount(8) or the kernel's generic mount flags own, not anvil.
fn is_generic(option: &str) -> bool {
    const GENERIC: &[&str] = &[
        "defaults",
        "auto",
        "noauto",
        "user",
        "users",
        "nouser",
        "owner",
        "group",
        "nofail",
        "_netdev",
        "atime",
        "noatime",
        "relatime",
        "norelatime",
        "strictatime",
        "nodiratime",
        "diratime",
        "sync",
        "async",
        "loud",
        "silent",
        "lazytime",
        "nolazytime",
        "iversion",
        "noiversion",
    ];
    GENERIC.contains(&option)
        || option.starts_with("x-")
        || option.starts_with("comment=")
        || option.starts_with("helper=")
}

/// What the helper was asked to do.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub image: PathBuf,
    pub dir: PathBuf,
    pub options: Vec<String>,
    pub as_of: Option<String>,
    pub log: Option<PathBuf>,
    /// `-f`: do everything but the mount (mount(8)'s "fake").
    pub fake: bool,
}

/// Parses mount(8)'s helper arguments (without argv[0]).
pub fn parse(args: &[OsString]) -> Result<Request, String> {
    let mut positional = Vec::new();
    let mut raw_options = Vec::new();
    let mut fake = false;
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-o" => raw_options.push(it.next().ok_or("-o needs a value")?),
            "-f" => fake = true,
            "-s" | "-n" | "-v" => {}
            "-h" | "--help" => {
                return Err(format!("usage: {NAME} IMAGE DIR [-sfnv] [-o OPTIONS]"));
            }
            a if a.starts_with("-o") => raw_options.push(a[2..].to_string()),
            a if a.starts_with('-') => return Err(format!("unknown flag {a}")),
            _ => positional.push(arg),
        }
    }
    let [image, dir] = <[String; 2]>::try_from(positional)
        .map_err(|_| format!("usage: {NAME} IMAGE DIR [-sfnv] [-o OPTIONS]"))?;
    let mut request = Request {
        image: image.into(),
        dir: dir.into(),
        options: Vec::new(),
        as_of: None,
        log: None,
        fake,
    };
    for option in raw_options.iter().flat_map(|o| o.split(',')) {
        if option.is_empty() || is_generic(option) {
            continue;
        }
        if let Some(spec) = option.strip_prefix("as_of=") {
            request.as_of = Some(spec.to_string());
        } else if let Some(path) = option.strip_prefix("log=") {
            request.log = Some(path.into());
        } else {
            request.options.push(option.to_string());
        }
    }
    Ok(request)
}

/// Runs as mount(8)'s helper: mounts in the background and returns once the mount is ready.
pub fn run(args: &[OsString]) -> Result<u8, String> {
    let request = parse(args)?;
    if request.fake {
        return Ok(0);
    }
    if request.options.iter().any(|o| o == "remount") {
        return remount(&request.dir, &request.options);
    }
    crate::mount::set_quiet();
    crate::mount::run(
        &request.image,
        &request.dir,
        &request.options,
        crate::mount::Extras {
            log: request.log.as_deref(),
            as_of: request.as_of.as_deref(),
            ..Default::default()
        },
    )
}

/// `mount -o remount,...`: mount(8) runs the helper for a remount too. The kernel changes
/// the live mount's flags (`ro`/`rw`, `nosuid`, `nodev`, `noexec`); the daemon serves on,
/// and the options only a new daemon could take (`cache=`, ...) are left as they are.
fn remount(dir: &Path, options: &[String]) -> Result<u8, String> {
    let mut flags = libc::MS_REMOUNT;
    for option in options {
        match option.as_str() {
            "ro" => flags |= libc::MS_RDONLY,
            "rw" => flags &= !libc::MS_RDONLY,
            "nosuid" => flags |= libc::MS_NOSUID,
            "suid" => flags &= !libc::MS_NOSUID,
            "nodev" => flags |= libc::MS_NODEV,
            "dev" => flags &= !libc::MS_NODEV,
            "noexec" => flags |= libc::MS_NOEXEC,
            "exec" => flags &= !libc::MS_NOEXEC,
            _ => {}
        }
    }
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a valid NUL-terminated target; a remount takes no source, type or data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("cannot remount {}: {e}", dir.display()));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn drops_mount8_options_and_keeps_anvils() {
        let r = parse(&args(&[
            "/var/tmp/v.img",
            "/mnt/v",
            "-o",
            "rw,defaults,noauto,_netdev,x-systemd.automount,nohistory,cache=64M",
            "-n",
        ]))
        .unwrap();
        assert_eq!(r.image, PathBuf::from("/var/tmp/v.img"));
        assert_eq!(r.dir, PathBuf::from("/mnt/v"));
        assert_eq!(r.options, vec!["rw", "nohistory", "cache=64M"]);
        assert!(!r.fake);
    }

    #[test]
    fn as_of_log_and_fake() {
        let r = parse(&args(&["i", "d", "-oas_of=daily,log=/tmp/l,ro", "-f"])).unwrap();
        assert_eq!(r.as_of.as_deref(), Some("daily"));
        assert_eq!(r.log, Some(PathBuf::from("/tmp/l")));
        assert_eq!(r.options, vec!["ro"]);
        assert!(r.fake);
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(parse(&args(&["only-one"])).is_err());
        assert!(parse(&args(&["i", "d", "-o"])).is_err());
        assert!(parse(&args(&["i", "d", "-x"])).is_err());
    }
}
