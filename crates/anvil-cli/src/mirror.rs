//! `anvil mirror-*`: a volume's history streamed to another volume (HAMMER's mirror-read,
//! mirror-write, mirror-copy and mirror-stream; the stream is the engine's
//! `format::stream`).
//!
//! A target is a mount point (the daemon runs the job and the stream goes through a FIFO),
//! an unmounted image or block device (opened here), or, for copy, stream and status,
//! `host:path` on another machine reached through `ssh` (or the `--via` command), where
//! `anvil` runs the same commands.

use crate::mount::{get_xattr, set_xattr, try_lock_exclusive, try_lock_shared};
use anvil::device::FileDevice;
use anvil::fs::MirrorReport;
use anvil::{Filesystem, MountOptions};
use anvil_fuse::mirror::status_json;
use anvil_fuse::{
    MIRROR_ATTACH_XATTR, MIRROR_PROMOTE_XATTR, MIRROR_READ_XATTR, MIRROR_WRITE_XATTR, MIRROR_XATTR,
};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a mirror command reads or writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Local(PathBuf),
    Remote { host: String, path: String },
}

impl Endpoint {
    /// `host:path` (no '/' before the colon, and not an existing local path) is remote; an
    /// `s3://` volume is reached from here.
    pub fn parse(text: &str) -> Endpoint {
        if text.starts_with(crate::store::SCHEME) {
            return Endpoint::Local(PathBuf::from(text));
        }
        match text.split_once(':') {
            Some((host, path))
                if !host.is_empty() && !host.contains('/') && !Path::new(text).exists() =>
            {
                Endpoint::Remote {
                    host: host.to_string(),
                    path: path.to_string(),
                }
            }
            _ => Endpoint::Local(PathBuf::from(text)),
        }
    }

    /// An `anvil` command run at this endpoint.
    fn command(&self, via: &str, args: &[&str]) -> Result<Command, String> {
        match self {
            Endpoint::Local(_) => {
                let exe = std::env::current_exe().map_err(|e| format!("anvil binary: {e}"))?;
                let mut command = Command::new(exe);
                command.args(args);
                Ok(command)
            }
            Endpoint::Remote { host, .. } => {
                let mut words = via.split_whitespace();
                let program = words.next().ok_or("--via names no command")?;
                let mut command = Command::new(program);
                command.args(words).arg(host);
                let remote: Vec<String> = std::iter::once("anvil".to_string())
                    .chain(args.iter().map(|a| shell_quote(a)))
                    .collect();
                command.arg(remote.join(" "));
                Ok(command)
            }
        }
    }

    fn path(&self) -> String {
        match self {
            Endpoint::Local(path) => path.display().to_string(),
            Endpoint::Remote { path, .. } => path.clone(),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Local(path) => write!(f, "{}", path.display()),
            Endpoint::Remote { host, path } => write!(f, "{host}:{path}"),
        }
    }
}

fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b))
    {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn open_image(image: &Path, writable: bool) -> Result<Filesystem, String> {
    let options = MountOptions {
        read_only: !writable,
        commit_interval_ms: 0,
        ..Default::default()
    };
    if crate::store::is_store(image) {
        // Claimed for writing (or read as last flushed); released when the volume closes.
        let device = crate::store::open(image, writable, false, 64 << 20, None)?;
        return Filesystem::open(device, options).map_err(|e| format!("{}: {e}", image.display()));
    }
    let device = FileDevice::open_direct(image, writable)
        .map_err(|e| format!("cannot open {}: {e}", image.display()))?;
    let locked = match writable {
        true => try_lock_exclusive(device.file()),
        false => try_lock_shared(device.file()),
    };
    if !locked {
        return Err(format!(
            "{} is mounted (busy): give the mount point instead",
            image.display()
        ));
    }
    Filesystem::open(Arc::new(device), options).map_err(|e| format!("{}: {e}", image.display()))
}

fn summary(what: &str, r: &MirrorReport) {
    if r.already_held {
        eprintln!(
            "{what}: the slave already holds TID {}; nothing to do",
            r.until
        );
        return;
    }
    eprintln!(
        "{what}: TIDs {}..{}: {} inserted, {} deleted, {} items, {} extent bytes, {} stream bytes",
        r.since, r.until, r.inserted, r.deleted, r.items, r.extent_bytes, r.stream_bytes
    );
    if r.pruned_through > 0 {
        eprintln!(
            "{what}: the master pruned history up to TID {} before this stream was read: \
             points between TID {} and it are incomplete",
            r.pruned_through, r.since
        );
    }
}

/// A FIFO in a fresh private directory, removed on drop.
struct Fifo {
    dir: PathBuf,
    path: PathBuf,
}

impl Fifo {
    fn new() -> Result<Fifo, String> {
        let base = std::env::temp_dir();
        for attempt in 0..100u32 {
            let dir = base.join(format!("anvil-mirror-{}-{attempt}", std::process::id()));
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let path = dir.join("stream");
            let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
            // SAFETY: a valid NUL-terminated path.
            if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
                let e = std::io::Error::last_os_error();
                let _ = std::fs::remove_dir(&dir);
                return Err(format!("cannot make a FIFO in {}: {e}", base.display()));
            }
            return Ok(Fifo { dir, path });
        }
        Err(format!("cannot make a directory in {}", base.display()))
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Runs a mirror job on the daemon of the mount at `dir`: starts it, moves the stream
/// through the FIFO on a thread (`pump`, given the FIFO's path), and waits for the job.
fn daemon_job(
    dir: &Path,
    control: &str,
    value: impl FnOnce(&Path) -> String,
    pump: impl FnOnce(PathBuf) -> std::io::Result<u64> + Send + 'static,
) -> Result<MirrorReport, String> {
    let fifo = Fifo::new()?;
    let path = fifo.path.clone();
    let (pumped, pump_done) = std::sync::mpsc::channel::<()>();
    let pumping = std::thread::spawn(move || {
        let moved = pump(path);
        let _ = pumped.send(());
        moved
    });
    let value = value(&fifo.path);
    // One job at a time per daemon: wait a while for one that is ending (the job of a copy
    // whose connection just broke).
    let mut tries = 0;
    while let Err(e) = set_xattr(dir, control, value.as_bytes()) {
        tries += 1;
        if tries > 100 || !e.contains("busy") {
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let job_path = fifo.path.display().to_string();
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&get_xattr(dir, MIRROR_XATTR)?).map_err(|e| e.to_string())?;
        let job = &status["job"];
        if job["path"].as_str() != Some(job_path.as_str()) {
            // The daemon registers a job before it answers, and keeps it until the next
            // one: a status without it comes from a daemon that replaced the one that ran
            // it (killed and remounted), and would never report on it.
            return Err(format!(
                "{}: the mount's daemon was replaced while the job ran; run it again",
                dir.display()
            ));
        }
        if job["running"] == false {
            if let Some(error) = job["error"].as_str() {
                // The pump may wait on a FIFO the daemon never opened: leave it.
                return Err(format!("{}: {error}", dir.display()));
            }
            let _ = pumping.join();
            return report_from_json(&job["report"]);
        }
        // While the stream flows, wake when it has passed (the job is then about to end:
        // look often) or now and then (for a job that failed before it opened the FIFO).
        match pumping.is_finished() {
            true => std::thread::sleep(Duration::from_millis(1)),
            false => {
                let _ = pump_done.recv_timeout(Duration::from_millis(50));
            }
        }
    }
}

fn report_from_json(j: &serde_json::Value) -> Result<MirrorReport, String> {
    let n = |k: &str| j[k].as_u64().unwrap_or(0);
    Ok(MirrorReport {
        since: n("since"),
        until: n("until"),
        items: n("items"),
        inserted: n("inserted"),
        deleted: n("deleted"),
        ended: n("ended"),
        extent_bytes: n("extent_bytes"),
        stream_bytes: n("stream_bytes"),
        pruned_through: n("pruned_through"),
        already_held: j["already_held"] == true,
    })
}

/// `anvil mirror-read TARGET --since S [--until U]`: the stream to stdout.
pub fn read(target: &Path, since: &str, until: Option<&str>) -> Result<u8, String> {
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return Err("refusing to write a binary stream to a terminal: redirect stdout".into());
    }
    let report = if target.is_dir() {
        let value = |fifo: &Path| format!("{since} {} {}", until.unwrap_or("-"), fifo.display());
        daemon_job(target, MIRROR_READ_XATTR, value, |fifo| {
            let mut input = std::fs::File::open(fifo)?;
            std::io::copy(&mut input, &mut std::io::stdout().lock())
        })?
    } else {
        let fs = open_image(target, false)?;
        let since = fs.tid_of(since).map_err(|e| e.to_string())?;
        let until = until
            .map(|u| fs.tid_of(u))
            .transpose()
            .map_err(|e| e.to_string())?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
        fs.mirror_read(since, until, &mut out)
            .map_err(|e| format!("{}: {e}", target.display()))?
    };
    summary("mirror-read", &report);
    Ok(0)
}

/// `anvil mirror-write TARGET`: applies the stream on stdin.
pub fn write(target: &Path) -> Result<u8, String> {
    let report = if target.is_dir() {
        let info: serde_json::Value = serde_json::from_str(&crate::mount::query_info(target)?)
            .map_err(|e| format!("bad info: {e}"))?;
        if info["writeback"] == true {
            return Err(format!(
                "{} is mounted with -o writeback: the kernel would keep its own sizes and times \
                 of the files a mirror stream changes; mount it without writeback to receive one",
                target.display()
            ));
        }
        daemon_job(
            target,
            MIRROR_WRITE_XATTR,
            |fifo| fifo.display().to_string(),
            |fifo| {
                let mut out = std::fs::File::options().write(true).open(fifo)?;
                std::io::copy(&mut std::io::stdin().lock(), &mut out)
            },
        )?
    } else {
        let fs = open_image(target, true)?;
        let mut input = std::io::BufReader::with_capacity(1 << 20, std::io::stdin().lock());
        let report = fs
            .mirror_write(&mut input)
            .map_err(|e| format!("{}: {e}", target.display()))?;
        fs.close().map_err(|e| e.to_string())?;
        report
    };
    summary("mirror-write", &report);
    Ok(0)
}

/// The status of a local target (mount point or image) as JSON.
fn local_status(target: &Path) -> Result<serde_json::Value, String> {
    if target.is_dir() {
        let mut json: serde_json::Value =
            serde_json::from_str(&get_xattr(target, MIRROR_XATTR)?).map_err(|e| e.to_string())?;
        if let Some(object) = json.as_object_mut() {
            object.remove("job");
        }
        Ok(json)
    } else {
        let fs = open_image(target, false)?;
        status_json(&fs).map_err(|e| format!("{}: {e}", target.display()))
    }
}

fn status_of(endpoint: &Endpoint, via: &str) -> Result<serde_json::Value, String> {
    match endpoint {
        Endpoint::Local(path) => local_status(path),
        Endpoint::Remote { .. } => {
            let output = endpoint
                .command(via, &["mirror-status", &endpoint.path(), "--json"])?
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("{endpoint}: {e}"))?;
            if !output.status.success() {
                return Err(format!("{endpoint}: mirror-status failed"));
            }
            serde_json::from_slice(&output.stdout).map_err(|e| format!("{endpoint}: {e}"))
        }
    }
}

/// `anvil mirror-status TARGET [--json]`.
pub fn status(target: &str, json: bool, via: &str) -> Result<u8, String> {
    let endpoint = Endpoint::parse(target);
    let status = status_of(&endpoint, via)?;
    if json {
        println!("{status}");
        return Ok(0);
    }
    println!(
        "volume       {}",
        status["volume_id"].as_str().unwrap_or("?")
    );
    println!(
        "newest TID   {} ({})",
        status["committed_tid"],
        crate::history::format_time(status["commit_time_ns"].as_u64().unwrap_or(0))
    );
    if status["slave"] == true {
        let last_commit = status["last_commit_ns"].as_u64().unwrap_or(0);
        let applied = status["applied_ns"].as_u64().unwrap_or(0);
        println!("role         slave (read-only but for mirror-write)");
        println!("master       {}", status["master"].as_str().unwrap_or("?"));
        println!(
            "holds up to  TID {} (committed on the master {})",
            status["last_tid"],
            crate::history::format_time(last_commit)
        );
        println!(
            "applied      {} ({:.1} s after the master's commit)",
            crate::history::format_time(applied),
            applied.saturating_sub(last_commit) as f64 / 1e9
        );
    } else {
        println!("role         master");
    }
    Ok(0)
}

/// `anvil mirror-promote TARGET`.
pub fn promote(target: &Path) -> Result<u8, String> {
    if target.is_dir() {
        set_xattr(target, MIRROR_PROMOTE_XATTR, b"1")?;
    } else {
        let fs = open_image(target, true)?;
        fs.mirror_promote()
            .map_err(|e| format!("{}: {e}", target.display()))?;
        fs.close().map_err(|e| e.to_string())?;
    }
    let status = local_status(target)?;
    println!(
        "{} is a master now; it continues after TID {}",
        target.display(),
        status["committed_tid"]
    );
    Ok(0)
}

/// `anvil mirror-attach OLD NEW`: the old master `OLD` (local) becomes a slave of `NEW`,
/// the slave that was promoted in its place, from the TID NEW was promoted at; changes OLD
/// took after that TID are undone.
pub fn attach(old: &Path, new: &str, via: &str) -> Result<u8, String> {
    let new_endpoint = Endpoint::parse(new);
    let new_status = status_of(&new_endpoint, via)?;
    let old_status = local_status(old)?;
    let Some(from) = new_status["promoted_from"].as_str() else {
        return Err(format!("{new} was never promoted from a slave"));
    };
    if old_status["volume_id"].as_str() != Some(from) {
        return Err(format!(
            "{new} was promoted from a slave of volume {from}, and {} is volume {}",
            old.display(),
            old_status["volume_id"].as_str().unwrap_or("?")
        ));
    }
    let master = new_status["volume_id"].as_str().unwrap_or("");
    let at = new_status["promoted_at"].as_u64().unwrap_or(0);
    let at_ns = new_status["promoted_at_commit_ns"].as_u64().unwrap_or(0);
    let value = format!("{master} {at} {at_ns}");
    if old.is_dir() {
        set_xattr(old, MIRROR_ATTACH_XATTR, value.as_bytes())?;
    } else {
        let (id, at, at_ns) =
            anvil_fuse::mirror::parse_attach(&value).ok_or("a bad volume id from mirror-status")?;
        let fs = open_image(old, true)?;
        fs.mirror_attach(id, at, at_ns)
            .map_err(|e| format!("{}: {e}", old.display()))?;
        fs.close().map_err(|e| e.to_string())?;
    }
    println!(
        "{} is a slave of {new} from TID {at}; bring it up to date with `anvil mirror-copy {new} {}`",
        old.display(),
        old.display()
    );
    Ok(0)
}

/// What one copy moved.
pub struct Copied {
    pub since: u64,
    pub held: u64,
    pub wire_bytes: u64,
    pub seconds: f64,
}

fn wait(child: &mut Child, what: &str) -> Result<(), String> {
    let status = child.wait().map_err(|e| format!("{what}: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("{what} failed ({status})")),
    }
}

/// One incremental (or first, full) copy from `src` to `dst`.
pub fn copy_once(src: &Endpoint, dst: &Endpoint, via: &str) -> Result<Copied, String> {
    let start = Instant::now();
    let source = status_of(src, via)?;
    let target = status_of(dst, via)?;
    let since = match target["slave"] == true {
        true => {
            if target["master"] != source["volume_id"] {
                return Err(format!(
                    "{dst} mirrors volume {}, not {src} ({})",
                    target["master"].as_str().unwrap_or("?"),
                    source["volume_id"].as_str().unwrap_or("?")
                ));
            }
            target["last_tid"].as_u64().unwrap_or(0)
        }
        false => 0,
    };
    let since_text = since.to_string();
    let src_path = src.path();
    let dst_path = dst.path();
    let mut reader = src
        .command(via, &["mirror-read", &src_path, "--since", &since_text])?
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{src}: {e}"))?;
    let mut writer = dst
        .command(via, &["mirror-write", &dst_path])?
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{dst}: {e}"))?;
    let mut from = reader.stdout.take().ok_or("no pipe from mirror-read")?;
    let mut to = writer.stdin.take().ok_or("no pipe to mirror-write")?;
    let mut wire_bytes = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut broken = None;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                broken = Some(format!("reading from {src}: {e}"));
                break;
            }
        };
        if let Err(e) = to.write_all(&buf[..n]) {
            broken = Some(format!("writing to {dst}: {e}"));
            break;
        }
        wire_bytes += n as u64;
    }
    drop(to);
    // Unread output would keep the reader waiting for us.
    drop(from);
    if broken.is_some() {
        let _ = reader.kill();
    }
    // Both ends print one summary or error line at most: their pipes cannot fill up.
    let mut reader_err = String::new();
    if let Some(mut err) = reader.stderr.take() {
        let _ = err.read_to_string(&mut reader_err);
    }
    let read = wait(&mut reader, &format!("mirror-read on {src}")).map_err(|e| {
        match reader_err.lines().find_map(|l| l.strip_prefix("anvil: ")) {
            Some(reason) => format!("{e}: {reason}"),
            None => e,
        }
    });
    let mut writer_err = String::new();
    if let Some(mut err) = writer.stderr.take() {
        let _ = err.read_to_string(&mut writer_err);
    }
    let written = wait(&mut writer, &format!("mirror-write on {dst}"));
    if let Err(e) = written {
        let reason = writer_err
            .lines()
            .find_map(|l| l.strip_prefix("anvil: "))
            .unwrap_or("");
        return Err(format!("{e}: {reason}"));
    }
    if let Some(e) = broken {
        return Err(e);
    }
    read?;
    for line in writer_err.lines().filter(|l| l.contains("pruned")) {
        eprintln!("{line}");
    }
    // mirror-write names the TID the slave holds now; ask only if it did not.
    let held = match held_from_summary(&writer_err) {
        Some(tid) => tid,
        None => status_of(dst, via)?["last_tid"].as_u64().unwrap_or(0),
    };
    Ok(Copied {
        since,
        held,
        wire_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The TID a slave holds after `mirror-write`, from its summary line.
fn held_from_summary(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("mirror-write: "))?;
    if let Some(rest) = line.split("already holds TID ").nth(1) {
        return rest.split(';').next()?.trim().parse().ok();
    }
    let range = line.split("TIDs ").nth(1)?.split(':').next()?;
    range.split("..").nth(1)?.trim().parse().ok()
}

/// `anvil mirror-copy SRC DST`.
pub fn copy(src: &str, dst: &str, via: &str) -> Result<u8, String> {
    let (src, dst) = (Endpoint::parse(src), Endpoint::parse(dst));
    let copied = copy_once(&src, &dst, via)?;
    println!(
        "mirror-copy {src} -> {dst}: TIDs {}..{}, {} bytes on the wire, {:.2} s",
        copied.since, copied.held, copied.wire_bytes, copied.seconds
    );
    Ok(0)
}

/// `anvil mirror-stream SRC DST`: copies every `interval`, for ever (or `rounds` times),
/// resuming from what the slave holds after any failure.
pub fn stream(
    src: &str,
    dst: &str,
    via: &str,
    interval: Duration,
    rounds: Option<u64>,
) -> Result<u8, String> {
    let (src, dst) = (Endpoint::parse(src), Endpoint::parse(dst));
    let mut done = 0u64;
    let mut failures = 0u32;
    while rounds.is_none_or(|r| done < r) {
        let began = Instant::now();
        match copy_once(&src, &dst, via) {
            Ok(copied) => {
                failures = 0;
                if copied.held > copied.since {
                    let lag = status_of(&dst, via)
                        .ok()
                        .and_then(|s| {
                            Some(
                                s["applied_ns"].as_u64()? as f64
                                    - s["last_commit_ns"].as_u64()? as f64,
                            )
                        })
                        .unwrap_or(0.0);
                    println!(
                        "TID {}: {} bytes, {:.2} s, {:.2} s behind the master's commit",
                        copied.held,
                        copied.wire_bytes,
                        copied.seconds,
                        lag / 1e9
                    );
                }
            }
            Err(e) => {
                failures += 1;
                eprintln!("mirror-stream: {e}; retrying");
                if failures >= 3 {
                    std::thread::sleep(Duration::from_secs(2));
                }
            }
        }
        done += 1;
        if let Some(rest) = interval.checked_sub(began.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("backup.example:/mnt/slave"),
            Endpoint::Remote {
                host: "backup.example".into(),
                path: "/mnt/slave".into()
            }
        );
        assert_eq!(
            Endpoint::parse("/mnt/a:b"),
            Endpoint::Local(PathBuf::from("/mnt/a:b"))
        );
        assert_eq!(
            Endpoint::parse("image.img"),
            Endpoint::Local(PathBuf::from("image.img"))
        );
        assert_eq!(shell_quote("/mnt/x"), "/mnt/x");
        assert_eq!(
            held_from_summary("mirror-write: TIDs 4..9: 3 inserted, 0 deleted"),
            Some(9)
        );
        assert_eq!(
            held_from_summary("x\nmirror-write: the slave already holds TID 12; nothing to do"),
            Some(12)
        );
        assert_eq!(held_from_summary("error: no"), None);
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
