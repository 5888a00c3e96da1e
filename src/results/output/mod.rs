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
//! 2. write everything into a new `.DIR.meshsim-tmp-PID-N` (the marker first) with plain
//!    writes, then flush it in one pass ([`swap::flush_folder`]: each file once, the folder);
//! 3. swap it in: on Linux `renameat2(RENAME_EXCHANGE)` swaps the new folder and the old one
//!    in one step (`RENAME_NOREPLACE` when there is no old one), so the temporary name now
//!    holds the old results, checked again to be replaceable (if another process put a
//!    user's folder there meanwhile, the swap is undone and the write refused);
//! 4. remove the old results from the temporary name.
//!
//! Crash states: during 1-2 the old results are intact and a partial temporary folder is left;
//! after 3 the new results are complete in place and the old ones are left under the
//! temporary name. Either way at most one temporary folder is left (two for `meshsim run`,
//! whose [`Scratch`] folder of request rows also has a temporary name of `DIR`), and the next
//! write to the same `DIR` removes it. Concurrent runs into one `DIR` each fill their own temporary folder,
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
//! writes ([`PROFILE_HEADER`], [`COMPARISON_HEADER`], [`COMPARISON_JSON_HEADER`],
//! [`TRACE_HEADER`]); plots, `report.md` and `summary.json`
//! have meshsim's own names inside a results folder ([`Replaces::ResultsFile`]).
//! [`write_file_atomically`] writes `.NAME.meshsim-tmp-PID-N` in the same folder, fsyncs it
//! and swaps it in the same way as a folder, so a crash leaves the old file or the new one,
//! and at most one temporary file that the next write of that name removes.
//!
//! **Before any work.** A command checks its target ([`check_out_dir`], [`check_out_file`])
//! and then makes a scratch folder beside it ([`Scratch::make_now`], or [`probe_beside`],
//! which removes it again), so that a place where nothing can be made (a pseudo or read-only
//! file system) is refused before the work, not after it.
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

use listing::replaceable_dir;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

pub use super::files::MARKER;
/// The marker's content. Only the marker's presence (as a regular file) counts.
pub const MARKER_TEXT: &str = "meshsim results folder: meshsim wrote it and may replace it whole (see src/results/output/mod.rs)\n";
/// The first line of a profile (`Profile::to_toml`) begins with this.
pub const PROFILE_HEADER: &str = "# A meshsim profile";
/// The markdown of `meshsim compare` begins with this.
pub const COMPARISON_HEADER: &str = "# Simulation against live run";
/// A results folder's `summary.json` begins with this: a file of that name that does not is
/// someone else's, and is not replaced.
pub const SUMMARY_JSON_HEADER: &str = "{\n  \"schema\": \"meshsim-summary/";
/// `meshsim compare --json` begins with this.
pub const COMPARISON_JSON_HEADER: &str = "{\n  \"schema\": \"meshsim-comparison/";
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
        .and_then(|t| flush_folder(&tmp).map(|()| t));
    let t = match filled {
        Ok(t) => t,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(io_err(dir)(e));
        }
    };
    crash_point("dir-tmp-written");
    match swap_into_place(&tmp, dir, (&parent, &name), "dir", &replaceable_dir, true) {
        Ok(()) => Ok(t),
        Err(e) => {
            let _ = remove_any(&tmp);
            Err(e)
        }
    }
}

/// Proves, before any work, that an output (a results folder or a file) can be made at
/// `path`, which passed [`check_out_dir`] or [`check_out_file`]: makes a scratch folder
/// beside it, with its missing parents, and removes them again. A place where nothing can be
/// made (a parent meshsim may not write in, a read-only or pseudo file system) is refused
/// here, not when the work is done.
pub fn probe_beside(path: &Path) -> Result<(), OutputError> {
    Scratch::beside(path)?.make_now(path)
}

/// A scratch folder beside a results folder, for what a run writes before its results (the
/// request rows of finished simulations): a temporary name of that folder, so that a crash
/// leaves it to the cleanup of the next write there ([`clean_stale`]). It is made at the
/// first [`Scratch::ensure`] ([`Scratch::make_now`] before a run starts, which proves the
/// results can be written there) and removed when dropped, with the parent folders it had
/// to make if they are still empty, so bad input found later leaves nothing behind either.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    parent: PathBuf,
    name: OsString,
    /// The outermost parent folder it made, once made.
    made: std::sync::Mutex<Option<Option<PathBuf>>>,
}

impl Scratch {
    /// The scratch folder beside `dir` (not made yet); `dir` should have passed
    /// [`check_out_dir`].
    pub fn beside(dir: &Path) -> Result<Scratch, OutputError> {
        let (parent, name) = split(dir)?;
        Ok(Scratch {
            path: parent.join(temp_name(&name, "tmp")),
            parent,
            name,
            made: std::sync::Mutex::new(None),
        })
    }

    /// Where the folder is (or will be).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the folder now, before any work, so that a results folder that cannot be
    /// written beside (a parent meshsim may not write in, a read-only or pseudo file system)
    /// is refused at the start instead of after a run of hours. `dir` is the results folder,
    /// for the message. Dropping the scratch removes what this made.
    pub fn make_now(&self, dir: &Path) -> Result<(), OutputError> {
        self.ensure().map(|_| ()).map_err(|e| {
            refused(
                dir,
                format!(
                    "cannot make a folder beside it ({}): {e}",
                    self.path.display()
                ),
            )
        })
    }

    /// Makes the folder (and its missing parents) if not made yet; returns its path.
    pub fn ensure(&self) -> io::Result<&Path> {
        let mut made = self.made.lock().expect("no panics while holding the lock");
        if made.is_none() {
            let mut outermost = None;
            let mut p = self.parent.as_path();
            while !p.as_os_str().is_empty() && fs::symlink_metadata(p).is_err() {
                outermost = Some(p.to_path_buf());
                p = p.parent().unwrap_or(Path::new(""));
            }
            fs::create_dir_all(&self.parent)?;
            clean_stale(&self.parent, &self.name);
            fs::create_dir(&self.path)?;
            *made = Some(outermost);
        }
        Ok(&self.path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let made = self.made.lock().map(|m| m.clone()).unwrap_or(None);
        let Some(outermost) = made else {
            return;
        };
        let _ = fs::remove_dir_all(&self.path);
        // The parents it made, innermost first, while they are empty (`remove_dir` refuses a
        // folder that is not).
        if let Some(top) = outermost {
            let mut p = self.parent.clone();
            while p.starts_with(&top) && fs::remove_dir(&p).is_ok() {
                if !p.pop() {
                    break;
                }
            }
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
    match swap_into_place(&tmp, path, (&parent, &name), "file", &check, true) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = remove_any(&tmp);
            Err(e)
        }
    }
}

/// Writes results files (plots, `report.md`, `summary.json`: names meshsim gives them) into
/// the existing folder `dir`, each atomically as [`write_file_atomically`] does, in one pass:
/// every temporary file is written, then each is flushed (`fdatasync`), then each is swapped
/// into place and the folder is synced once. A crash leaves each file old or new, whole.
pub fn write_files_atomically(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), OutputError> {
    let mut temps: Vec<(PathBuf, PathBuf, OsString)> = Vec::with_capacity(files.len());
    let mut written: Vec<File> = Vec::with_capacity(files.len());
    let result = (|| {
        for (name, bytes) in files {
            let path = dir.join(name);
            check_out_file(&path, results_file_rule(name))?;
            let (parent, name) = split(&path)?;
            clean_stale(&parent, &name);
            let tmp = parent.join(temp_name(&name, "tmp"));
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(io_err(&path))?;
            temps.push((tmp, path.clone(), name));
            f.write_all(bytes).map_err(io_err(&path))?;
            written.push(f);
        }
        for (f, (_, path, _)) in written.iter().zip(&temps) {
            f.sync_data().map_err(io_err(path))?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        for (tmp, _, _) in &temps {
            let _ = fs::remove_file(tmp);
        }
        return Err(e);
    }
    crash_point("file-tmp-written");
    for (i, (tmp, path, name)) in temps.iter().enumerate() {
        let rule = results_file_rule(&name.to_string_lossy());
        let check = |p: &Path| replaceable_file(p, rule);
        if let Err(e) = swap_into_place(tmp, path, (dir, name), "file", &check, false) {
            for (tmp, _, _) in &temps[i..] {
                let _ = remove_any(tmp);
            }
            return Err(e);
        }
    }
    sync_dir(dir);
    Ok(())
}

/// Test hook for code that fills a folder before it is swapped in: with
/// `MESHSIM_TEST_CRASH_AT=file-tmp-written`, the process is killed here (see the module doc).
pub fn crash_after_file_written() {
    crash_point("file-tmp-written");
}

/// Checks, before any work, that the results files `names` may be written into the folder
/// `dir` ([`write_files_atomically`]'s rule for each).
pub fn check_results_files(dir: &Path, names: &[String]) -> Result<(), OutputError> {
    for name in names {
        check_out_file(&dir.join(name), results_file_rule(name))?;
    }
    Ok(())
}

/// Which existing file a results file named `name` may replace: `summary.json` only one that
/// meshsim wrote (recognised by its first line), the plots and `report.md` any regular file.
fn results_file_rule(name: &str) -> Replaces {
    if name == "summary.json" {
        Replaces::Header(SUMMARY_JSON_HEADER)
    } else {
        Replaces::ResultsFile
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

mod listing;
mod swap;
#[cfg(test)]
mod tests;

use swap::*;
