//! `meshsim node` child processes for the tests of runs across processes, on 127.0.0.1.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `meshsim node` child process and what it printed.
pub struct Node {
    pub child: Child,
    pub addr: String,
    pub log: Arc<Mutex<String>>,
}

impl Node {
    pub fn start(cookie: &Path) -> Node {
        Node::start_with(cookie, &[])
    }

    pub fn start_with(cookie: &Path, extra: &[&str]) -> Node {
        let mut child = Command::new(env!("CARGO_BIN_EXE_meshsim"))
            .args(["node", "--listen", "127.0.0.1:0", "--cookie-file"])
            .arg(cookie)
            .arg("-v")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start meshsim node");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        // Drain the node's stderr for as long as it lives (a full pipe would block it).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("meshsim node listening at ") {
                    let _ = tx.send(a.trim().to_string());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the node prints its address");
        Node { child, addr, log }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn kill(&mut self) {
        // SIGKILL on Unix.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn cookie(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    writeln!(f, "{text}").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    p
}

/// A thread that kills `node` (SIGKILL) `after` it next starts a run's actors (a
/// few tokens into the generation, for a few hundred milliseconds).
pub fn kill_when_started(node: &Node, after: Duration) -> std::thread::JoinHandle<()> {
    let log = Arc::clone(&node.log);
    let before = node.log().matches("actors started").count();
    let pid = node.child.id();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while log.lock().unwrap().matches("actors started").count() == before {
            assert!(
                Instant::now() < deadline,
                "the run never started on the node"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(after);
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    })
}
