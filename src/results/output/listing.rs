//! Whether a folder may be replaced, from a listing of it (see the module doc of [`super`]).

use super::*;

/// How many times [`replaceable_dir`] lists a folder that another run swapped away while it
/// was being listed, before it gives the last answer.
const MOVED_WHILE_LISTED_TRIES: usize = 16;

/// `Ok` when the folder `dir` may be replaced: empty, or marked and holding only names
/// meshsim writes in a results folder; else the reason.
///
/// A concurrent run into the same folder may swap the folder away while it is being listed
/// and then empty it under its temporary name, so that the listing sees some of its files
/// and not the marker. The folder's identity (device and inode) is read before and after
/// the listing; when it changed, the listing described a folder no longer at `dir`, and it
/// is taken again.
pub(super) fn replaceable_dir(dir: &Path) -> Result<(), String> {
    replaceable_dir_listed(dir, list_folder)
}

/// [`replaceable_dir`] with the listing `list` (a seam for the test of the race above).
pub(super) fn replaceable_dir_listed(
    dir: &Path,
    mut list: impl FnMut(&Path) -> Result<Vec<(OsString, fs::FileType)>, String>,
) -> Result<(), String> {
    let mut before = fs::symlink_metadata(dir).map_err(|e| format!("cannot inspect it: {e}"))?;
    let mut tries = 1;
    loop {
        let answer = if before.is_dir() {
            list(dir).and_then(replaceable_listing)
        } else {
            Err(format!("it is {}, not a folder", describe(&before)))
        };
        if answer.is_ok() || tries == MOVED_WHILE_LISTED_TRIES {
            return answer;
        }
        match fs::symlink_metadata(dir) {
            Ok(after) if same_file(&before, &after) => return answer,
            Ok(after) => before = after,
            // Gone for the instant of another run's portable swap: nothing there to keep.
            Err(e) if missing(&e) => return Ok(()),
            Err(_) => return answer,
        }
        tries += 1;
    }
}

/// The names in the folder `dir`, with their types.
pub(super) fn list_folder(dir: &Path) -> Result<Vec<(OsString, fs::FileType)>, String> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))? {
        let entry = entry.map_err(|e| format!("cannot list it: {e}"))?;
        let ty = entry
            .file_type()
            .map_err(|e| format!("cannot list it: {e}"))?;
        names.push((entry.file_name(), ty));
    }
    Ok(names)
}

/// Whether two metadata describe the same file (always true where identity is unknown).
fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        true
    }
}

/// [`replaceable_dir`]'s answer from one listing of a folder.
fn replaceable_listing(mut names: Vec<(OsString, fs::FileType)>) -> Result<(), String> {
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
    let known = crate::results::files::names();
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

/// A name in `known`, or the temporary name of one.
fn is_results_name(name: &OsStr, known: &[String]) -> bool {
    known
        .iter()
        .any(|k| name == k.as_str() || parse_temp_name(name, OsStr::new(k)).is_some())
}
