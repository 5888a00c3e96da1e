use super::listing::{list_folder, replaceable_dir_listed};
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

/// A results folder swapped away and emptied by another run while it is being checked is
/// never mistaken for a user's folder (the listing would see its files and not the marker),
/// and a user's folder is still refused.
#[cfg(unix)]
#[test]
fn a_results_folder_swapped_away_and_emptied_while_listed_is_not_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let away = tmp.path().join("away");
    marked(&out, &[("report.md", "old")]);
    let mut calls = 0;
    let answer = replaceable_dir_listed(&out, |dir| {
        calls += 1;
        if calls == 1 {
            // Another run's swap between the identity and the listing, then its cleanup
            // removing the marker first; the listing sees what is left.
            fs::rename(dir, &away).unwrap();
            marked(dir, &[("report.md", "new")]);
            fs::remove_file(away.join(MARKER)).unwrap();
            return list_folder(&away);
        }
        list_folder(dir)
    });
    assert_eq!(answer, Ok(()));
    assert_eq!(calls, 2);
    // A folder that stays put is listed once and refused.
    let mut calls = 0;
    let answer = replaceable_dir_listed(&away, |dir| {
        calls += 1;
        list_folder(dir)
    });
    assert!(answer.unwrap_err().contains("no .meshsim-results marker"));
    assert_eq!(calls, 1);
}
