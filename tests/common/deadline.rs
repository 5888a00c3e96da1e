//! Running `meshsim` under a deadline, for the tests of inputs that must be refused
//! (`tests/bad_values.rs`, `tests/bad_values_traces.rs`): no input may make a command hang.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a command may run before the test calls it hung.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// How a command ended and what it printed.
pub struct Outcome {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `meshsim args` in `dir`; kills it and fails the test when it is still running after
/// [`DEADLINE`]. (The one place where these tests look at the wall clock: a hang has no other
/// symptom.)
pub fn meshsim(dir: &Path, args: &[&str]) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("meshsim {args:?} still runs after {DEADLINE:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Outcome {
        status: status.code().unwrap_or(-1),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Checks that the command exited with status 2 and that its stderr holds every one of
/// `expected`.
pub fn assert_refused(o: &Outcome, expected: &[&str]) {
    assert_eq!(o.status, 2, "exit status; stderr: {}", o.stderr);
    for e in expected {
        assert!(o.stderr.contains(e), "`{e}` not in: {}", o.stderr);
    }
}
