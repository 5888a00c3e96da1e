//! `meshsim` asks for transparent huge pages by starting itself again with glibc's tunable
//! (`meshsim::tuning`): the second start must get the same arguments and give the same exit
//! status, the user's own settings must win, and `MESHSIM_HUGE_PAGES=off` must turn it off.

use std::path::Path;
use std::process::{Command, Output};

fn meshsim(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshsim"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("GLIBC_TUNABLES")
        .env_remove(meshsim::tuning::HUGE_PAGES_VAR);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("meshsim runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether this machine is one where `meshsim` restarts: Linux with glibc, THP in `madvise`.
fn restarts_here() -> bool {
    cfg!(all(target_os = "linux", target_env = "gnu"))
        && std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|t| t.contains("[madvise]"))
}

#[test]
fn the_second_start_gets_the_arguments_and_says_whether_huge_pages_are_on() {
    let out = meshsim(&["-vv", "check", "scenarios/polaris_8gpu.toml"], &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    // The arguments went through: the scenario was read and checked.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("scenario polaris_8gpu"),
        "{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("huge pages: "))
        .unwrap_or_else(|| panic!("no huge-pages line in:\n{err}"));
    if restarts_here() {
        assert!(line.contains("on (glibc.malloc.hugetlb=1"), "{line}");
    }
}

#[test]
fn the_exit_status_and_odd_arguments_survive_the_second_start() {
    let missing = "/nonexistent/été dir/scénario.toml";
    let out = meshsim(&["check", missing], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("scénario.toml"), "{}", stderr(&out));
    assert!(!Path::new("/nonexistent").exists());
}

#[test]
fn the_users_settings_win() {
    let off = meshsim(
        &["-vv", "check", "scenarios/polaris_8gpu.toml"],
        &[(meshsim::tuning::HUGE_PAGES_VAR, "off")],
    );
    assert!(off.status.success());
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert!(
            stderr(&off).contains("huge pages: off (MESHSIM_HUGE_PAGES=off)"),
            "{}",
            stderr(&off)
        );
    }
    if restarts_here() {
        let theirs = meshsim(
            &["-vv", "check", "scenarios/polaris_8gpu.toml"],
            &[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")],
        );
        assert!(theirs.status.success());
        assert!(
            stderr(&theirs).contains("huge pages: off (GLIBC_TUNABLES sets glibc.malloc.hugetlb)"),
            "{}",
            stderr(&theirs)
        );
    }
}
