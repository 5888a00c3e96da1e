//! The file-system steps of [`super`]: temporary names, atomic renames and exchanges, fsync,
//! stale temporaries, and the crash hooks of the tests.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// The parent folder (`.` for a bare name) and the file name of `path`.
pub(super) fn split(path: &Path) -> Result<(PathBuf, OsString), OutputError> {
    let name = path
        .file_name()
        .ok_or_else(|| refused(path, unnamed(path)))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_os_string()))
}

/// `.NAME.meshsim-KIND-PID-N`, unique within this process.
pub(super) fn temp_name(name: &OsStr, kind: &str) -> OsString {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut s = OsString::from(".");
    s.push(name);
    s.push(format!(".meshsim-{kind}-{}-{n}", std::process::id()));
    s
}

/// (`"tmp"` or `"old"`, PID) when `entry` is a temporary name of `name`.
pub(super) fn parse_temp_name(entry: &OsStr, name: &OsStr) -> Option<(&'static str, u32)> {
    let entry = entry.to_str()?;
    let name = name.to_str()?;
    let rest = entry
        .strip_prefix('.')?
        .strip_prefix(name)?
        .strip_prefix(".meshsim-")?;
    let (kind, rest) = if let Some(r) = rest.strip_prefix("tmp-") {
        ("tmp", r)
    } else {
        ("old", rest.strip_prefix("old-")?)
    };
    let (pid, n) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    Some((kind, pid.parse().ok()?))
}

/// Whether process `pid` may still be writing its temporary names.
pub(super) fn pid_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        if pid <= 0 {
            return true;
        }
        // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        true
    }
}

/// Puts the complete `tmp` at `target`, replacing what is there only if `replaceable` accepts
/// it (checked again on what was actually displaced), then removes the displaced old output.
/// With `sync_parent`, the rename is made durable (the parent folder is fsynced) before the
/// old output is removed; a caller that swaps several files syncs the parent once after them.
pub(super) fn swap_into_place(
    tmp: &Path,
    target: &Path,
    (parent, name): (&Path, &OsStr),
    kind: &str,
    replaceable: &dyn Fn(&Path) -> Result<(), String>,
    sync_parent: bool,
) -> Result<(), OutputError> {
    for _ in 0..MAX_SWAP_ATTEMPTS {
        match fs::symlink_metadata(target) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => match rename_noreplace(tmp, target) {
                Ok(()) => {
                    crash_point(&format!("{kind}-swapped"));
                    if sync_parent {
                        sync_dir(parent);
                    }
                    return Ok(());
                }
                // Another writer got there first: replace its output in the next round.
                Err(e) if target_taken(&e) => continue,
                Err(e) => return Err(io_err(target)(e)),
            },
            Err(e) => return Err(io_err(target)(e)),
            Ok(_) => {}
        }
        if let Err(reason) = replaceable(target) {
            // Another writer (on the two-rename path) may have moved it aside just now: look
            // again in the next round rather than refuse.
            if fs::symlink_metadata(target).is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
                continue;
            }
            return Err(refused(target, reason));
        }
        let old = match exchange(tmp, target) {
            Ok(true) => tmp.to_path_buf(),
            Ok(false) => {
                // Portable: move the old output aside, then the new one in.
                let old = parent.join(temp_name(name, "old"));
                match fs::rename(target, &old) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err(target)(e)),
                }
                if let Err(reason) = replaceable(&old) {
                    let _ = fs::rename(&old, target);
                    return Err(refused(target, reason));
                }
                crash_point(&format!("{kind}-old-moved"));
                if let Err(e) = rename_noreplace(tmp, target) {
                    // Another writer put its output in between: ours replaces it next round.
                    let _ = remove_any(&old);
                    if target_taken(&e) {
                        continue;
                    }
                    return Err(io_err(target)(e));
                }
                old
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(target)(e)),
        };
        if old == tmp
            && let Err(reason) = replaceable(tmp)
        {
            // What was swapped out changed after the check: swap it back, write nothing.
            let _ = exchange(tmp, target);
            return Err(refused(target, reason));
        }
        crash_point(&format!("{kind}-swapped"));
        if sync_parent {
            sync_dir(parent);
        }
        if let Err(e) = remove_old(&old) {
            // The new output is in place; the next write removes the leftover.
            tracing::warn!(path = %old.display(), error = %e, "cannot remove the old output");
        }
        return Ok(());
    }
    Err(refused(
        target,
        "other writers kept replacing it; try again",
    ))
}

/// Whether a rename failed because something now exists at the target.
pub(super) fn target_taken(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty
    )
}

/// Removes the displaced old output.
pub(super) fn remove_old(old: &Path) -> io::Result<()> {
    if crash_armed("dir-old-half-removed")
        && let Some(entry) = fs::read_dir(old)?.flatten().next()
    {
        remove_any(&entry.path())?;
        crash_now();
    }
    remove_any(old)
}

/// Removes a file, or a folder with everything in it (never following symbolic links).
pub(super) fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// Makes everything written into `dir` durable in one pass: each file's data is flushed
/// (`fdatasync`), then the folder's entries. (`syncfs` would be one call, but it waits for
/// every dirty page of the file system, other programs' included: on a busy disk that is
/// slower than flushing the folder's own files.)
pub(super) fn flush_folder(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            File::open(entry.path())?.sync_data()?;
        }
    }
    sync_dir(dir);
    Ok(())
}

/// fsyncs a folder so that renames in it are durable (best effort: not every system can).
pub(super) fn sync_dir(dir: &Path) {
    if let Ok(f) = File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Moves `from` to `to`, failing if `to` exists (an empty folder at `to` may be replaced
/// where the system has no no-replace rename).
pub(super) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    if renameat2(from, to, libc::RENAME_NOREPLACE)? {
        return Ok(());
    }
    if fs::symlink_metadata(from)?.is_file() {
        // A hard link fails if `to` exists; not every file system has them.
        match fs::hard_link(from, to) {
            Ok(()) => return fs::remove_file(from),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(e),
            Err(_) => {}
        }
    }
    fs::rename(from, to)
}

/// Swaps `a` and `b` atomically; `Ok(false)` where the system cannot.
pub(super) fn exchange(a: &Path, b: &Path) -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        renameat2(a, b, libc::RENAME_EXCHANGE)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (a, b);
        Ok(false)
    }
}

/// Linux `renameat2(from, to, flags)`; `Ok(false)` when the kernel or file system does not
/// support `flags` (or `MESHSIM_TEST_NO_EXCHANGE` is set).
#[cfg(target_os = "linux")]
pub(super) fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    if std::env::var_os("MESHSIM_TEST_NO_EXCHANGE").is_some() {
        return Ok(false);
    }
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call, which only reads
    // them; the syscall number and argument types are those of renameat2(2).
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Ok(false),
        _ => Err(e),
    }
}

/// Whether the test hook asks to stop at `stage`.
pub(super) fn crash_armed(stage: &str) -> bool {
    std::env::var_os("MESHSIM_TEST_CRASH_AT").is_some_and(|v| v == stage)
}

/// Test hook: kills the process at `stage` (see the module doc).
pub(super) fn crash_point(stage: &str) {
    if crash_armed(stage) {
        crash_now();
    }
}

/// Ends the process at once, as a `kill -9` would: no destructor or cleanup runs.
pub(super) fn crash_now() -> ! {
    #[cfg(unix)]
    // SAFETY: sends SIGKILL to this process; nothing is read or written.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}
