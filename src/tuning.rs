//! How the process asks its allocator for memory: glibc's heap parameters, and transparent
//! huge pages. Only speed changes; results never depend on where memory is.
//!
//! **Why.** A simulation of a large cluster touches its actors' state at random: at 2,240
//! GPUs every event lands on an instance whose memory is cold, and a run's working set
//! (hundreds of MiB) is far beyond what the processor's TLBs map with 4 KiB pages, so a cold
//! line costs a page walk on top of the miss. With 2 MiB pages the TLBs map a hundred times
//! more. On the development machine (2 cores, Linux 6.18, glibc 2.36, THP in `madvise` mode)
//! huge pages made `sim_scale` at 2,240 GPUs 10-16 % faster for every policy (paired runs)
//! and `polaris_full` 8 % faster in wall time (26.3 -> 24.1 s), with the same peak memory and
//! byte-identical results.
//!
//! **Where they do not pay.** On a virtual machine whose host backs the guest's memory only
//! when it is touched, a fresh huge page is faulted in by the host as well as zeroed by the
//! guest: on the development machine touching 1 GiB took 2.6-4.6 s in huge pages the first
//! time against 0.4 s in small pages, and a run touches most of its memory once (the trace,
//! the actors). There, at some hours, `polaris_full` gained nothing (ptstore alone, on / off
//! alternating: 21.8 / 19.1 s against 18.7 / 19.0 s of simulation), while a bench's later
//! rounds, which reuse their memory, still gained 12-17 %. `MESHSIM_HUGE_PAGES=off` turns
//! them off (see `docs/performance.md`, thirty-second session).
//!
//! **How.** Most Linux systems ship THP in `madvise` mode: a program gets huge pages only for
//! memory it marks. glibc marks its heaps itself when the tunable `glibc.malloc.hugetlb=1` is
//! set (glibc 2.35 and later; older ones ignore it), but tunables are read once, when the
//! program starts. So [`tune_allocator`], first thing in `main`, starts the program again
//! (`exec` of `/proc/self/exe`, same arguments, same process id) with the tunable added to
//! `GLIBC_TUNABLES` and a marker (`MESHSIM_HUGE_PAGES=restarted`) so that the second start
//! goes on.
//! It does not when THP is off or already `always`, when the user set `glibc.malloc.hugetlb`
//! themselves, on other systems, or when `MESHSIM_HUGE_PAGES=off` (or `0`) asks it not to;
//! if the `exec` fails the program goes on with small pages. Child processes inherit both
//! variables, and so the tunable, without starting twice.
//!
//! **Heap parameters.** By default glibc gives the top of its heap back to the system once
//! 128 KiB of it are free, so at 2,240 GPUs the heap shrank and grew every few requests and
//! the kernel zeroed the same pages again (5 % of a run in the profile); and blocks of 128 KiB
//! and more came from `mmap`, fresh pages each time. [`tune_allocator`] keeps freed memory in
//! the heap for reuse instead (up to 1 GiB of it) and serves blocks below 32 MiB from it.

/// The environment variable that turns huge pages off (`off`, `0`, `no`, `false`) and marks
/// the second start (`restarted`).
pub const HUGE_PAGES_VAR: &str = "MESHSIM_HUGE_PAGES";

/// The glibc tunable that makes malloc mark its heaps for transparent huge pages.
const TUNABLE: &str = "glibc.malloc.hugetlb";

/// Whether the process's heap uses transparent huge pages, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// glibc marks its heaps (the tunable is set: by this module's restart or by the user).
    Marked,
    /// The kernel gives huge pages to all memory (THP `always`).
    Always,
    /// Small pages, for the reason given.
    Off(&'static str),
}

impl std::fmt::Display for HugePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HugePages::Marked => write!(f, "on (glibc.malloc.hugetlb=1, THP madvise)"),
            HugePages::Always => write!(f, "on (THP always)"),
            HugePages::Off(why) => write!(f, "off ({why})"),
        }
    }
}

/// What to do, from what the process can see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Keep(HugePages),
    Restart,
}

/// Decides from the kernel's THP mode (the contents of
/// `/sys/kernel/mm/transparent_hugepage/enabled`, if readable), `GLIBC_TUNABLES` and
/// [`HUGE_PAGES_VAR`].
fn decide(thp: Option<&str>, tunables: Option<&str>, ours: Option<&str>) -> Decision {
    let ours = ours.map(|v| v.trim().to_ascii_lowercase());
    if matches!(ours.as_deref(), Some("off" | "0" | "no" | "false")) {
        return Decision::Keep(HugePages::Off("MESHSIM_HUGE_PAGES=off"));
    }
    // The user's own setting of the tunable wins; the last one counts, as glibc reads them.
    let set = tunables.and_then(|t| {
        t.rsplit(':')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| k.trim() == TUNABLE)
            .map(|(_, v)| v.trim())
    });
    let mode = match thp {
        Some(t) if t.contains("[always]") => return Decision::Keep(HugePages::Always),
        Some(t) if t.contains("[madvise]") => "madvise",
        Some(_) => return Decision::Keep(HugePages::Off("transparent huge pages are off")),
        None => return Decision::Keep(HugePages::Off("no transparent huge pages")),
    };
    debug_assert_eq!(mode, "madvise");
    match set {
        Some("1") => Decision::Keep(HugePages::Marked),
        Some(_) => Decision::Keep(HugePages::Off("GLIBC_TUNABLES sets glibc.malloc.hugetlb")),
        // The restart already happened and the tunable did not survive it: never loop.
        None if ours.as_deref() == Some("restarted") => {
            Decision::Keep(HugePages::Off("the restart lost GLIBC_TUNABLES"))
        }
        None => Decision::Restart,
    }
}

/// `GLIBC_TUNABLES` with the huge-page tunable added.
fn with_tunable(tunables: Option<&str>) -> String {
    match tunables {
        Some(t) if !t.is_empty() => format!("{t}:{TUNABLE}=1"),
        _ => format!("{TUNABLE}=1"),
    }
}

/// Tunes glibc's allocator for a simulation (see the module doc); may start the program
/// again, so call it first thing in `main`, before any thread starts. Returns what it found.
pub fn tune_allocator() -> HugePages {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok();
        let tunables = std::env::var("GLIBC_TUNABLES").ok();
        let ours = std::env::var(HUGE_PAGES_VAR).ok();
        let state = match decide(thp.as_deref(), tunables.as_deref(), ours.as_deref()) {
            Decision::Keep(state) => state,
            Decision::Restart => {
                use std::os::unix::process::CommandExt;
                let mut args = std::env::args_os();
                let mut cmd = std::process::Command::new("/proc/self/exe");
                if let Some(arg0) = args.next() {
                    cmd.arg0(arg0);
                }
                // Returns only if the exec failed: go on with small pages.
                let _ = cmd
                    .args(args)
                    .env("GLIBC_TUNABLES", with_tunable(tunables.as_deref()))
                    .env(HUGE_PAGES_VAR, "restarted")
                    .exec();
                HugePages::Off("the restart failed")
            }
        };
        // SAFETY: `mallopt` only sets allocator parameters; called before any thread starts.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_TOP_PAD, 16 << 20);
        }
        state
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        HugePages::Off("not Linux with glibc")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MADVISE: &str = "always [madvise] never\n";

    #[test]
    fn restarts_only_where_the_tunable_would_be_news() {
        use Decision::*;
        use HugePages::*;
        assert_eq!(decide(Some(MADVISE), None, None), Restart);
        assert_eq!(
            decide(Some(MADVISE), Some("glibc.malloc.arena_max=2"), None),
            Restart
        );
        assert_eq!(
            decide(Some(MADVISE), None, Some("restarted")),
            Keep(Off("the restart lost GLIBC_TUNABLES"))
        );
        assert_eq!(
            decide(
                Some(MADVISE),
                Some("glibc.malloc.hugetlb=1"),
                Some("restarted")
            ),
            Keep(Marked)
        );
        assert_eq!(decide(Some(MADVISE), None, Some("on")), Restart);
        assert_eq!(
            decide(Some(MADVISE), Some("glibc.malloc.hugetlb=1"), None),
            Keep(Marked)
        );
        // The last setting counts, as glibc reads them.
        assert_eq!(
            decide(
                Some(MADVISE),
                Some("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0"),
                None
            ),
            Keep(Off("GLIBC_TUNABLES sets glibc.malloc.hugetlb"))
        );
        assert_eq!(
            decide(Some(MADVISE), Some("glibc.malloc.hugetlb=2"), None),
            Keep(Off("GLIBC_TUNABLES sets glibc.malloc.hugetlb"))
        );
        for off in ["off", "0", "OFF", " no ", "false"] {
            assert_eq!(
                decide(Some(MADVISE), None, Some(off)),
                Keep(Off("MESHSIM_HUGE_PAGES=off"))
            );
        }
        assert_eq!(
            decide(Some("[always] madvise never"), None, None),
            Keep(Always)
        );
        assert_eq!(
            decide(Some("always madvise [never]"), None, None),
            Keep(Off("transparent huge pages are off"))
        );
        assert_eq!(
            decide(None, None, None),
            Keep(Off("no transparent huge pages"))
        );
    }

    #[test]
    fn the_tunable_is_added_to_the_users_own() {
        assert_eq!(with_tunable(None), "glibc.malloc.hugetlb=1");
        assert_eq!(with_tunable(Some("")), "glibc.malloc.hugetlb=1");
        assert_eq!(
            with_tunable(Some("glibc.malloc.arena_max=2")),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
        );
    }
}
