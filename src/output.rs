//! Writing outputs without losing anyone's files: the one place where meshsim replaces a
//! folder or a file.
//!
//! **Rule.** meshsim never deletes or overwrites a file it did not write itself, and at every
//! instant either the complete old output or the complete new output exists.
//!
//! **Results folders** (`meshsim run --out DIR`, `results/<name>/`, `results/<name>_live/`).
//! Every results folder meshsim writes holds a marker file, [`MARKER`] (`.meshsim-results`,
//! one line, [`MARKER_TEXT`]). [`check_out_dir`] accepts a folder that does not exist yet, an
//! empty folder, or a folder with the marker whose entries are all names meshsim writes
//! there (CSV files, `scenario.toml`, plots, `report.md`, `comparison.md`, their temporary
//! files). It refuses `.`, `..`, `/`, the home folder, the current folder and its ancestors,
//! a symbolic link, a file, a device, and any other folder.
//!
//! [`replace_dir_atomically`] then works like this, beside `DIR` in the same parent folder:
//!
//! 1. clean up after crashed runs ([`clean_stale`]): a `.DIR.meshsim-tmp-PID-N` whose process
//!    PID is gone is removed; a `.DIR.meshsim-old-PID-N` (only the portable path makes one)
//!    is renamed back to `DIR` when `DIR` is missing, removed otherwise;
//! 2. write everything into a new `.DIR.meshsim-tmp-PID-N` (the marker first), fsync it;
//! 3. swap it in: on Linux `renameat2(RENAME_EXCHANGE)` swaps the new folder and the old one
//!    in one step (`RENAME_NOREPLACE` when there is no old one), so the temporary name now
//!    holds the old results, checked again to be replaceable (if another process put a
//!    user's folder there meanwhile, the swap is undone and the write refused);
//! 4. remove the old results from the temporary name.
//!
//! Crash states: during 1-2 the old results are intact and a partial temporary folder is left;
//! after 3 the new results are complete in place and the old ones are left under the
//! temporary name. Either way at most one temporary folder is left, and the next write to the
//! same `DIR` removes it. Concurrent runs into one `DIR` each fill their own temporary folder,
//! and each swap exchanges whole folders, so the last one wins whole and files never mix.
//!
//! **Portable path** (other systems, or file systems without `renameat2` flags): 3 becomes
//! rename `DIR` to `.DIR.meshsim-old-PID-N`, rename the new folder to `DIR`. A crash between
//! the two renames leaves `DIR` missing, the old results complete under the `old` name (and
//! the new ones under the `tmp` name); the next write renames the old ones back before
//! anything else and removes the rest. Readers may see `DIR` missing for that instant.
//!
//! **Files** (`meshsim profile --out`, `compare --out`, `trace convert --out`, plots and
//! `report.md`). [`check_out_file`] refuses a target that exists and is not a regular file
//! (folder, symbolic link, device, FIFO, socket), and a regular file that meshsim did not
//! write: profiles, comparisons and canonical traces are recognised by the first line meshsim
//! writes ([`PROFILE_HEADER`], [`COMPARISON_HEADER`], [`TRACE_HEADER`]); plots and `report.md`
//! have meshsim's own names inside a results folder ([`Replaces::ResultsFile`]).
//! [`write_file_atomically`] writes `.NAME.meshsim-tmp-PID-N` in the same folder, fsyncs it
//! and swaps it in the same way as a folder, so a crash leaves the old file or the new one,
//! and at most one temporary file that the next write of that name removes.
//!
//! A temporary name belongs to a dead process when `kill(PID, 0)` finds no such process; a
//! PID reused by another process only delays the cleanup. Without `kill` (non-Unix) stale
//! temporary names are left alone.
//!
//! **Test hooks** (hidden): `MESHSIM_TEST_CRASH_AT=<stage>` kills the process (SIGKILL) at a
//! named stage: `dir-tmp-written`, `dir-swapped`, `dir-old-half-removed` (one old file removed),
//! `dir-old-moved` (portable path, between the two renames), and `file-tmp-written`,
//! `file-swapped`, `file-old-moved`. `MESHSIM_TEST_NO_EXCHANGE=1` forces the portable path.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The marker file in every results folder that meshsim writes.
pub const MARKER: &str = ".meshsim-results";
/// The marker's content. Only the marker's presence (as a regular file) counts.
pub const MARKER_TEXT: &str =
    "meshsim results folder: meshsim wrote it and may replace it whole (see src/output.rs)\n";
/// The first line of a profile (`Profile::to_toml`) begins with this.
pub const PROFILE_HEADER: &str = "# A meshsim profile";
/// The markdown of `meshsim compare` begins with this.
pub const COMPARISON_HEADER: &str = "# Simulation against live run";
/// A canonical trace (`meshsim trace convert`) begins with this.
pub const TRACE_HEADER: &str = "{\"format\": \"meshsim-trace\"";

/// Rounds of the swap when concurrent writers keep changing the target.
const MAX_SWAP_ATTEMPTS: usize = 16;

/// Which existing regular file a write may replace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replaces {
    /// A file that begins with this text, which meshsim writes at its top.
    Header(&'static str),
    /// Any regular file: a plot or `report.md`, with meshsim's own name in a results folder.
    ResultsFile,
}

/// Why an output was not written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The target must not be replaced (exit status 2 when found before any work).
    #[error("refusing to write {}: {reason}", path.display())]
    Refused { path: PathBuf, reason: String },
    /// The file system failed.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl From<OutputError> for io::Error {
    fn from(e: OutputError) -> io::Error {
        let kind = match &e {
            OutputError::Refused { .. } => io::ErrorKind::AlreadyExists,
            OutputError::Io { source, .. } => source.kind(),
        };
        io::Error::new(kind, e.to_string())
    }
}

fn refused(path: &Path, reason: impl Into<String>) -> OutputError {
    OutputError::Refused {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> OutputError + '_ {
    move |source| OutputError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that `dir` may receive a results folder: it does not exist (and its first existing
/// ancestor is a folder), or it is an empty folder, or a results folder meshsim wrote (see the
/// module doc). Never `.`, `..`, `/`, the home folder, the current folder or an ancestor of
/// it, a symbolic link, a file or a device.
pub fn check_out_dir(dir: &Path) -> Result<(), OutputError> {
    if dir.file_name().is_none() {
        return Err(refused(dir, unnamed(dir)));
    }
    match fs::symlink_metadata(dir) {
        Err(e) if missing(&e) => return check_parent(dir),
        Err(e) => return Err(refused(dir, format!("cannot inspect it: {e}"))),
        Ok(m) if !m.is_dir() => {
            return Err(refused(
                dir,
                format!(
                    "it is {}, not a folder; meshsim writes results only into a folder",
                    describe(&m)
                ),
            ));
        }
        Ok(_) => {}
    }
    let real =
        fs::canonicalize(dir).map_err(|e| refused(dir, format!("cannot resolve it: {e}")))?;
    if real.parent().is_none() {
        return Err(refused(dir, "it is the root folder"));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    if let Some(home) = home.and_then(|h| fs::canonicalize(h).ok())
        && home == real
    {
        return Err(refused(dir, "it is your home folder"));
    }
    if let Some(cwd) = std::env::current_dir()
        .ok()
        .and_then(|c| fs::canonicalize(c).ok())
        && cwd.starts_with(&real)
    {
        return Err(refused(
            dir,
            "it is the current folder or one of its ancestors",
        ));
    }
    replaceable_dir(dir).map_err(|reason| refused(dir, reason))
}

/// Checks that `path` may receive an output file: it does not exist (and its first existing
/// ancestor is a folder), or it is a regular file that `replaces` allows.
pub fn check_out_file(path: &Path, replaces: Replaces) -> Result<(), OutputError> {
    if path.file_name().is_none() {
        return Err(refused(path, unnamed(path)));
    }
    match fs::symlink_metadata(path) {
        Err(e) if missing(&e) => check_parent(path),
        Err(e) => Err(refused(path, format!("cannot inspect it: {e}"))),
        Ok(_) => replaceable_file(path, replaces).map_err(|reason| refused(path, reason)),
    }
}

/// Writes a results folder: `fill` writes the files into an empty temporary folder, which
/// then replaces `dir` atomically (see the module doc). Returns what `fill` returns.
pub fn replace_dir_atomically<T>(
    dir: &Path,
    fill: impl FnOnce(&Path) -> io::Result<T>,
) -> Result<T, OutputError> {
    check_out_dir(dir)?;
    let (parent, name) = split(dir)?;
    fs::create_dir_all(&parent).map_err(io_err(dir))?;
    clean_stale(&parent, &name);
    let tmp = parent.join(temp_name(&name, "tmp"));
    fs::create_dir(&tmp).map_err(io_err(&tmp))?;
    let filled = fs::write(tmp.join(MARKER), MARKER_TEXT)
        .and_then(|()| fill(&tmp))
        .and_then(|t| sync_tree(&tmp).map(|()| t));
    let t = match filled {
        Ok(t) => t,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(io_err(dir)(e));
        }
    };
    crash_point("dir-tmp-written");
    match swap_into_place(&tmp, dir, &parent, &name, "dir", &replaceable_dir) {
        Ok(()) => Ok(t),
        Err(e) => {
            let _ = remove_any(&tmp);
            Err(e)
        }
    }
}

/// Writes the file `path` atomically: `write` fills a temporary file in the same folder,
/// which is fsynced and then replaces `path` (see the module doc). An existing `path` must be
/// a regular file that `replaces` allows.
pub fn write_file_atomically(
    path: &Path,
    replaces: Replaces,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), OutputError> {
    check_out_file(path, replaces)?;
    let (parent, name) = split(path)?;
    fs::create_dir_all(&parent).map_err(io_err(path))?;
    clean_stale(&parent, &name);
    let tmp = parent.join(temp_name(&name, "tmp"));
    let written = (|| {
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let mut w = io::BufWriter::new(f);
        write(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(path)(e));
    }
    crash_point("file-tmp-written");
    let check = |p: &Path| replaceable_file(p, replaces);
    match swap_into_place(&tmp, path, &parent, &name, "file", &check) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = remove_any(&tmp);
            Err(e)
        }
    }
}

/// Removes what crashed writes of `name` in `parent` left behind (see the module doc).
/// Best effort: a failure is logged and leaves the leftover for a later run.
pub fn clean_stale(parent: &Path, name: &OsStr) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let mut olds = Vec::new();
    for entry in entries.flatten() {
        let Some((kind, pid)) = parse_temp_name(&entry.file_name(), name) else {
            continue;
        };
        if pid_alive(pid) {
            continue;
        }
        let path = entry.path();
        if kind == "old" {
            olds.push(path);
        } else if let Err(e) = remove_any(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a stale temporary");
        }
    }
    olds.sort();
    let target = parent.join(name);
    for old in olds {
        let r = if fs::symlink_metadata(&target).is_err() {
            tracing::warn!(path = %target.display(), "restoring results left by a crashed run");
            fs::rename(&old, &target)
        } else {
            remove_any(&old)
        };
        if let Err(e) = r {
            tracing::warn!(path = %old.display(), error = %e, "cannot clean up a stale temporary");
        }
    }
}

/// `Ok` when the folder `dir` may be replaced: empty, or marked and holding only names
/// meshsim writes in a results folder; else the reason.
fn replaceable_dir(dir: &Path) -> Result<(), String> {
    let m = fs::symlink_metadata(dir).map_err(|e| format!("cannot inspect it: {e}"))?;
    if !m.is_dir() {
        return Err(format!("it is {}, not a folder", describe(&m)));
    }
    let mut names: Vec<(OsString, fs::FileType)> = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))? {
        let entry = entry.map_err(|e| format!("cannot list it: {e}"))?;
        let ty = entry
            .file_type()
            .map_err(|e| format!("cannot list it: {e}"))?;
        names.push((entry.file_name(), ty));
    }
    if names.is_empty() {
        return Ok(());
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let marked = names
        .iter()
        .any(|(n, ty)| n.as_os_str() == MARKER && ty.is_file());
    if !marked {
        let shown: Vec<String> = names
            .iter()
            .take(3)
            .map(|(n, _)| n.to_string_lossy().into_owned())
            .collect();
        return Err(format!(
            "it is not empty ({}{}) and has no {MARKER} marker, so meshsim did not write it; \
             name a new or empty folder",
            shown.join(", "),
            if names.len() > 3 { ", ..." } else { "" }
        ));
    }
    let known = results_names();
    if let Some((n, _)) = names
        .iter()
        .find(|(n, ty)| ty.is_dir() || !is_results_name(n, &known))
    {
        return Err(format!(
            "it holds {}, which meshsim does not write; move it away first",
            n.to_string_lossy()
        ));
    }
    Ok(())
}

/// The names meshsim writes into a results folder.
fn results_names() -> Vec<String> {
    use crate::results::plot::Figure;
    let mut v: Vec<String> = [
        MARKER,
        "scenario.toml",
        "requests.csv",
        "summary.csv",
        "report.md",
        "comparison.md",
    ]
    .map(String::from)
    .to_vec();
    for f in Figure::ALL.iter().chain([&Figure::TpsOutput]) {
        v.push(format!("{}.png", f.stem()));
        v.push(format!("{}.svg", f.stem()));
    }
    v
}

/// A name in `known`, or the temporary name of one.
fn is_results_name(name: &OsStr, known: &[String]) -> bool {
    known
        .iter()
        .any(|k| name == k.as_str() || parse_temp_name(name, OsStr::new(k)).is_some())
}

/// `Ok` when the existing `path` is a regular file that `replaces` allows; else the reason.
fn replaceable_file(path: &Path, replaces: Replaces) -> Result<(), String> {
    let m = fs::symlink_metadata(path).map_err(|e| format!("cannot inspect it: {e}"))?;
    if !m.is_file() {
        return Err(format!(
            "it is {}, not a regular file; meshsim replaces only files it wrote",
            describe(&m)
        ));
    }
    let Replaces::Header(header) = replaces else {
        return Ok(());
    };
    let mut first = Vec::with_capacity(header.len());
    File::open(path)
        .and_then(|f| f.take(header.len() as u64).read_to_end(&mut first))
        .map_err(|e| format!("cannot read it: {e}"))?;
    if first != header.as_bytes() {
        return Err(format!(
            "it exists and meshsim did not write it (it does not begin with `{header}`); \
             meshsim replaces only files it wrote: move it away or name another file"
        ));
    }
    Ok(())
}

/// Whether `e` says that a path does not exist (or that a parent of it is not a folder).
fn missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// For a target that does not exist: its first existing ancestor must be a folder.
fn check_parent(path: &Path) -> Result<(), OutputError> {
    for a in path.ancestors().skip(1) {
        let a = if a.as_os_str().is_empty() {
            Path::new(".")
        } else {
            a
        };
        match fs::metadata(a) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(m) => {
                return Err(refused(
                    path,
                    format!("{} is {}, not a folder", a.display(), describe(&m)),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(refused(
                    path,
                    format!("cannot inspect {}: {e}", a.display()),
                ));
            }
        }
    }
    Ok(())
}

/// Why a path without a last name (`.`, `..`, `/`) cannot be an output.
fn unnamed(path: &Path) -> &'static str {
    match path.components().next_back() {
        Some(Component::CurDir) => "it is the current folder",
        Some(Component::ParentDir) => "it is a parent of the current folder",
        _ => "it is the root folder",
    }
}

/// "a regular file", "a character device", ... for messages.
fn describe(m: &fs::Metadata) -> &'static str {
    let ty = m.file_type();
    if ty.is_symlink() {
        return "a symbolic link";
    }
    if ty.is_dir() {
        return "a folder";
    }
    if ty.is_file() {
        return "a file";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ty.is_char_device() {
            return "a character device";
        }
        if ty.is_block_device() {
            return "a block device";
        }
        if ty.is_fifo() {
            return "a FIFO";
        }
        if ty.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

/// The parent folder (`.` for a bare name) and the file name of `path`.
fn split(path: &Path) -> Result<(PathBuf, OsString), OutputError> {
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
fn temp_name(name: &OsStr, kind: &str) -> OsString {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut s = OsString::from(".");
    s.push(name);
    s.push(format!(".meshsim-{kind}-{}-{n}", std::process::id()));
    s
}

/// (`"tmp"` or `"old"`, PID) when `entry` is a temporary name of `name`.
fn parse_temp_name(entry: &OsStr, name: &OsStr) -> Option<(&'static str, u32)> {
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
fn pid_alive(pid: u32) -> bool {
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
fn swap_into_place(
    tmp: &Path,
    target: &Path,
    parent: &Path,
    name: &OsStr,
    kind: &str,
    replaceable: &dyn Fn(&Path) -> Result<(), String>,
) -> Result<(), OutputError> {
    for _ in 0..MAX_SWAP_ATTEMPTS {
        match fs::symlink_metadata(target) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => match rename_noreplace(tmp, target) {
                Ok(()) => {
                    crash_point(&format!("{kind}-swapped"));
                    sync_dir(parent);
                    return Ok(());
                }
                // Another writer got there first: replace its output in the next round.
                Err(e) if target_taken(&e) => continue,
                Err(e) => return Err(io_err(target)(e)),
            },
            Err(e) => return Err(io_err(target)(e)),
            Ok(_) => {}
        }
        replaceable(target).map_err(|reason| refused(target, reason))?;
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
        sync_dir(parent);
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
fn target_taken(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty
    )
}

/// Removes the displaced old output.
fn remove_old(old: &Path) -> io::Result<()> {
    if crash_armed("dir-old-half-removed")
        && let Some(entry) = fs::read_dir(old)?.flatten().next()
    {
        remove_any(&entry.path())?;
        crash_now();
    }
    remove_any(old)
}

/// Removes a file, or a folder with everything in it (never following symbolic links).
fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// fsyncs every file in `dir`, then `dir` itself.
fn sync_tree(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            File::open(entry.path())?.sync_all()?;
        }
    }
    sync_dir(dir);
    Ok(())
}

/// fsyncs a folder so that renames in it are durable (best effort: not every system can).
fn sync_dir(dir: &Path) {
    if let Ok(f) = File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Moves `from` to `to`, failing if `to` exists (an empty folder at `to` may be replaced
/// where the system has no no-replace rename).
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
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
fn exchange(a: &Path, b: &Path) -> io::Result<bool> {
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
fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<bool> {
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
fn crash_armed(stage: &str) -> bool {
    std::env::var_os("MESHSIM_TEST_CRASH_AT").is_some_and(|v| v == stage)
}

/// Test hook: kills the process at `stage` (see the module doc).
fn crash_point(stage: &str) {
    if crash_armed(stage) {
        crash_now();
    }
}

/// Ends the process at once, as a `kill -9` would: no destructor or cleanup runs.
fn crash_now() -> ! {
    #[cfg(unix)]
    // SAFETY: sends SIGKILL to this process; nothing is read or written.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(dir: &Path, files: &[(&str, &str)]) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(MARKER), MARKER_TEXT).unwrap();
        for (n, t) in files {
            fs::write(dir.join(n), t).unwrap();
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn temp_names_parse_back_and_other_names_do_not() {
        let t = temp_name(OsStr::new("out"), "tmp");
        assert_eq!(
            parse_temp_name(&t, OsStr::new("out")),
            Some(("tmp", std::process::id()))
        );
        assert_eq!(parse_temp_name(&t, OsStr::new("ou")), None);
        let n = OsStr::new("out");
        assert_eq!(
            parse_temp_name(OsStr::new(".out.meshsim-old-12-3"), n),
            Some(("old", 12))
        );
        for bad in [
            ".out.meshsim-tmp-12",
            ".out.meshsim-tmp-x-1",
            ".out.x.meshsim-tmp-1-2",
            "out.meshsim-tmp-1-2",
            ".out.meshsim-new-1-2",
        ] {
            assert_eq!(parse_temp_name(OsStr::new(bad), n), None, "{bad}");
        }
    }

    #[test]
    fn a_folder_with_a_users_file_is_refused_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("thesis.tex"), "mine").unwrap();
        let e = replace_dir_atomically(&dir, |_| Ok(())).unwrap_err();
        assert!(matches!(e, OutputError::Refused { .. }), "{e}");
        assert!(e.to_string().contains("thesis.tex"), "{e}");
        assert_eq!(names(&dir), ["thesis.tex"]);
        assert_eq!(names(tmp.path()), ["out"]);
    }

    #[test]
    fn a_marked_folder_holding_a_foreign_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        marked(&dir, &[("summary.csv", "a"), ("notes.txt", "mine")]);
        let e = check_out_dir(&dir).unwrap_err();
        assert!(e.to_string().contains("notes.txt"), "{e}");
    }

    #[test]
    fn a_marked_folder_is_replaced_whole_and_gets_the_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        marked(&dir, &[("summary.csv", "old"), ("report.md", "old")]);
        replace_dir_atomically(&dir, |d| fs::write(d.join("summary.csv"), "new")).unwrap();
        assert_eq!(names(&dir), [MARKER, "summary.csv"]);
        assert_eq!(fs::read_to_string(dir.join("summary.csv")).unwrap(), "new");
        assert_eq!(names(tmp.path()), ["out"]);
    }

    #[test]
    fn an_empty_folder_is_filled_and_a_missing_parent_is_made() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = tmp.path().join("empty");
        fs::create_dir(&empty).unwrap();
        replace_dir_atomically(&empty, |d| fs::write(d.join("summary.csv"), "x")).unwrap();
        assert_eq!(names(&empty), [MARKER, "summary.csv"]);
        let deep = tmp.path().join("a/b/out");
        replace_dir_atomically(&deep, |_| Ok(())).unwrap();
        assert_eq!(names(&deep), [MARKER]);
    }

    #[test]
    fn a_failed_fill_leaves_the_old_results_and_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        marked(&dir, &[("summary.csv", "old")]);
        let e = replace_dir_atomically(&dir, |_| -> io::Result<()> {
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(matches!(e, OutputError::Io { .. }), "{e}");
        assert_eq!(fs::read_to_string(dir.join("summary.csv")).unwrap(), "old");
        assert_eq!(names(tmp.path()), ["out"]);
    }

    #[test]
    fn files_refuse_folders_links_and_foreign_files_but_replace_their_own() {
        let tmp = tempfile::tempdir().unwrap();
        let own = tmp.path().join("p.toml");
        let write = |t: &'static str| move |w: &mut dyn Write| w.write_all(t.as_bytes());
        let h = Replaces::Header(PROFILE_HEADER);
        write_file_atomically(&own, h, write("# A meshsim profile 1\n")).unwrap();
        write_file_atomically(&own, h, write("# A meshsim profile 2\n")).unwrap();
        assert_eq!(fs::read_to_string(&own).unwrap(), "# A meshsim profile 2\n");
        let foreign = tmp.path().join("f.toml");
        fs::write(&foreign, "mine").unwrap();
        let e = write_file_atomically(&foreign, h, write("# A meshsim profile\n")).unwrap_err();
        assert!(e.to_string().contains("did not write it"), "{e}");
        assert_eq!(fs::read_to_string(&foreign).unwrap(), "mine");
        let e = write_file_atomically(tmp.path(), h, write("x")).unwrap_err();
        assert!(matches!(e, OutputError::Refused { .. }), "{e}");
        #[cfg(unix)]
        {
            let link = tmp.path().join("link.toml");
            std::os::unix::fs::symlink(&own, &link).unwrap();
            let e = write_file_atomically(&link, h, write("# A meshsim profile 3\n")).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
            assert!(
                fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
            let e = check_out_file(Path::new("/dev/null"), Replaces::ResultsFile).unwrap_err();
            assert!(e.to_string().contains("character device"), "{e}");
        }
        let mut left = names(tmp.path());
        left.retain(|n| n.contains("meshsim-"));
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_file_under_a_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        fs::write(&f, "x").unwrap();
        let e = check_out_file(&f.join("out.toml"), Replaces::ResultsFile).unwrap_err();
        assert!(e.to_string().contains("not a folder"), "{e}");
        let e = check_out_dir(&f.join("out")).unwrap_err();
        assert!(e.to_string().contains("not a folder"), "{e}");
    }

    #[test]
    fn stale_temporaries_of_dead_processes_are_removed_and_old_results_restored() {
        let tmp = tempfile::tempdir().unwrap();
        // PIDs beyond pid_max (2^22 on Linux) belong to no process.
        let dead = 4_999_999u32;
        let partial = tmp.path().join(format!(".out.meshsim-tmp-{dead}-0"));
        marked(&partial, &[("summary.csv", "partial")]);
        let old = tmp.path().join(format!(".out.meshsim-old-{dead}-1"));
        marked(&old, &[("summary.csv", "old")]);
        let live = tmp
            .path()
            .join(format!(".out.meshsim-tmp-{}-9", std::process::id()));
        fs::create_dir(&live).unwrap();
        let other = tmp.path().join(format!(".other.meshsim-tmp-{dead}-0"));
        fs::create_dir(&other).unwrap();
        clean_stale(tmp.path(), OsStr::new("out"));
        let out = tmp.path().join("out");
        assert_eq!(fs::read_to_string(out.join("summary.csv")).unwrap(), "old");
        assert!(!partial.exists() && !old.exists());
        assert!(
            live.exists() && other.exists(),
            "only this name, only dead writers"
        );
        // With the results in place, a stale `old` folder is removed, not restored.
        marked(&old, &[("summary.csv", "older")]);
        clean_stale(tmp.path(), OsStr::new("out"));
        assert!(!old.exists());
        assert_eq!(fs::read_to_string(out.join("summary.csv")).unwrap(), "old");
    }

    #[test]
    fn the_current_folder_and_its_ancestors_are_refused() {
        let cwd = std::env::current_dir().unwrap();
        for p in [cwd.clone(), cwd.parent().unwrap().to_path_buf()] {
            let e = check_out_dir(&p).unwrap_err();
            assert!(e.to_string().contains("current folder"), "{e}");
        }
        for p in [".", "..", "/"] {
            assert!(check_out_dir(Path::new(p)).is_err(), "{p}");
        }
    }

    #[test]
    fn errors_convert_to_io_errors_with_the_message() {
        let e: io::Error = refused(Path::new("x"), "why").into();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(e.to_string(), "refusing to write x: why");
    }
}
