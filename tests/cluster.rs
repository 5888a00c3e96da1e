//! Live pipeline runs across processes (`meshsim node`, `meshsim::live::cluster`), on
//! 127.0.0.1 only: every test starts its own node processes on free ports and kills them at
//! its end, and every run is bounded in wall-clock time.
//!
//! One test function runs the cases one after another, so that the nodes (and candle) never
//! compete with each other for the host's cores, and so that one process runs one
//! `ractor_cluster` node server at a time.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::node::{Node, cookie, kill_when_started};

use meshsim::pipeline::live::live_all;
use meshsim::pipeline::outcome::PipelineRun;
use meshsim::pipeline::scenario::PipelineScenario;

/// The `small` model (8 layers, hidden 512) in 2 shards; 4 requests of 48 prompt tokens and
/// `output` tokens, two sessions at a time.
fn scenario(nodes: &[&Node], cookie: Option<&Path>, output: u32) -> PipelineScenario {
    let text = scenario_text(nodes, cookie, output);
    PipelineScenario::parse("cluster.toml", "cluster", Path::new("."), &text)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn scenario_text(nodes: &[&Node], cookie: Option<&Path>, output: u32) -> String {
    let mut text = format!(
        "name = \"cluster\"\nseed = 5\npolicies = [\"cached\"]\nmode = \"live\"\n\n\
         [pipeline]\nmodel = \"small\"\nshards = 2\nmax_active_sessions = 2\n\
         cost = \"analytic\"\n\
         [pipeline.gpu]\nname = \"cpu\"\nmemory_gib = 8.0\nmemory_bandwidth_gb_per_s = 10.0\n\
         peak_tflops = 0.2\ncompute_efficiency = 0.5\nmemory_efficiency = 0.5\n\
         [pipeline.link]\nbandwidth_gb_per_s = 1.0\nlatency_us = 50.0\n\n\
         [workload]\nrequests = 4\nprompt_tokens = 48\noutput_tokens = {output}\n\
         closed_loop = true\n\n[limits]\nmax_wall_s = 120.0\n"
    );
    if !nodes.is_empty() {
        let list: Vec<String> = nodes.iter().map(|n| format!("\"{}\"", n.addr)).collect();
        text += &format!("\n[live]\nnodes = [{}]\n", list.join(", "));
        if let Some(c) = cookie {
            text += &format!("cookie_file = \"{}\"\n", c.display());
        }
    }
    text
}

fn one(runs: Vec<PipelineRun>) -> PipelineRun {
    assert_eq!(runs.len(), 1);
    runs.into_iter().next().unwrap()
}

/// Per request: its id, output tokens and network bytes between the actors.
type Rows = Vec<(u32, u32, u64)>;
/// Per request: the tokens it generated.
type Outputs = Vec<(u32, Vec<u32>)>;

/// What must not change across processes: the rows and the tokens.
fn fingerprint(r: &PipelineRun) -> (Rows, Outputs) {
    let rows = r
        .report
        .records
        .iter()
        .map(|x| (x.id, x.output_tokens, x.network_bytes))
        .collect();
    (rows, r.report.outputs.clone())
}

#[test]
fn pipeline_routes_across_meshsim_node_processes() {
    let dir = tempfile::tempdir().unwrap();
    let good = cookie(dir.path(), "cookie", "the-cluster-cookie-0123456789");
    let rt = common::runtime();

    // The reference: every actor in this process.
    let alone = one(rt.block_on(live_all(&scenario(&[], None, 24))).unwrap());
    let (rows, outputs) = fingerprint(&alone);
    assert_eq!(outputs.len(), 4);
    assert!(outputs.iter().all(|(_, t)| t.len() == 24));

    let mut n1 = Node::start(&good);
    let mut n2 = Node::start(&good);
    let mut n3 = Node::start(&good);

    // 1. Across processes, undisturbed: the head here, shard 0 on n1, shard 1 on n2 (n3 is
    //    a spare): the same tokens and the same bytes between the actors as in one process,
    //    and frames really crossed the sockets.
    let s = scenario(&[&n1, &n2, &n3], Some(&good), 24);
    let across = one(rt.block_on(live_all(&s)).unwrap());
    assert_eq!(fingerprint(&across), (rows.clone(), outputs.clone()));
    assert_eq!(across.report.failovers, 0);
    // Every message's payload, shard to shard included, as the actors count it.
    assert_eq!(across.payload_bytes, alone.payload_bytes);
    assert!(alone.payload_bytes > 0);
    let payload: u64 = across.report.records.iter().map(|r| r.network_bytes).sum();
    assert!(
        across.wire_bytes > payload,
        "frames {} B, payload between head and shards {} B",
        across.wire_bytes,
        payload
    );

    // 2. A wrong cookie is refused, and the node keeps serving.
    let bad = cookie(dir.path(), "bad", "not-the-cookie");
    let s_bad = scenario(&[&n1], Some(&bad), 4);
    let started = Instant::now();
    let e = rt.block_on(live_all(&s_bad)).unwrap_err().to_string();
    assert!(e.contains("cookie"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(n1.alive());

    // 2a. A peer that is not a meshsim node (here an HTTP server that answers anything with
    //     a 400 and closes) is named as possibly that, not only as a cookie mismatch.
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http_addr = http.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut c in http.incoming().flatten() {
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let text = scenario_text(&[&n1], Some(&good), 4).replace(&n1.addr, &http_addr);
    let s_http = PipelineScenario::parse("http.toml", "http", Path::new("."), &text).unwrap();
    let e = rt.block_on(live_all(&s_http)).unwrap_err().to_string();
    assert!(e.contains("not a `meshsim node`"), "{e}");

    // 2c. A coordinator killed (SIGKILL) in the middle of its run: the node drops that run
    //     when it sees the connection close, and the next coordinator's run goes ahead at
    //     once (a node still busy a moment after the kill is asked again, not refused).
    let file = dir.path().join("killed.toml");
    std::fs::write(&file, scenario_text(&[&n1], Some(&good), 400)).unwrap();
    let before = n1.log().matches("actors started").count();
    let mut coordinator = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["run", "--live", "-q", "--out"])
        .arg(dir.path().join("killed"))
        .arg(&file)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while n1.log().matches("actors started").count() == before {
        assert!(
            Instant::now() < deadline,
            "the run never started: {}",
            n1.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    coordinator.kill().unwrap();
    coordinator.wait().unwrap();
    let next = one(rt
        .block_on(live_all(&scenario(&[&n1], Some(&good), 4)))
        .unwrap());
    assert_eq!(next.report.records.len(), 4);
    assert!(n1.log().contains("the coordinator is gone"), "{}", n1.log());

    // 2b. A node whose frame limit is below the scenario's largest message (a 600-token
    //     prefill's activation, 1.2 MB) is refused before the run, naming the flag to give.
    let mut small = Node::start_with(&good, &["--max-frame-mib", "1"]);
    let text = scenario_text(&[&small], Some(&good), 4)
        .replace("prompt_tokens = 48", "prompt_tokens = 600");
    let s_big = PipelineScenario::parse("big.toml", "big", Path::new("."), &text).unwrap();
    let e = rt.block_on(live_all(&s_big)).unwrap_err().to_string();
    assert!(e.contains("--max-frame-mib 2"), "{e}");
    assert!(small.alive());
    small.kill();

    // 3. Malformed frames from an authenticated peer, and garbage on the raw socket: logged,
    //    dropped, the connection closed; the node lives and serves the next run.
    let cookie_text = std::fs::read_to_string(&good).unwrap().trim().to_string();
    let mut valid_header = b"MSHW".to_vec();
    valid_header.extend_from_slice(&1u16.to_le_bytes());
    valid_header.extend_from_slice(&42u64.to_le_bytes());
    let mut huge_len = valid_header.clone();
    huge_len.extend_from_slice(&[4, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    let frames = vec![vec![], b"hello".to_vec(), valid_header.clone(), huge_len, {
        let mut v = valid_header.clone();
        v.extend(std::iter::repeat_n(0xa5u8, 300));
        v
    }];
    rt.block_on(meshsim::live::cluster::send_raw_frames(
        &n1.addr,
        cookie_text,
        frames,
    ))
    .unwrap();
    {
        let mut tcp = std::net::TcpStream::connect(&n1.addr).unwrap();
        let _ = tcp.write_all(&[0xffu8; 64]);
        let _ = tcp.write_all(&u64::MAX.to_be_bytes());
        let _ = tcp.write_all(b"garbage after a huge length");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(n1.alive(), "{}", n1.log());
    assert!(n1.log().contains("malformed frame"), "{}", n1.log());
    assert!(n1.log().contains("closing the connection"), "{}", n1.log());
    let again = one(rt.block_on(live_all(&s)).unwrap());
    assert_eq!(fingerprint(&again).1, outputs);

    // 4. SIGKILL the process of shard 1 in the middle of the generation: the coordinator
    //    sees its connection close, places the shard on the spare n3, the head re-prefills
    //    its running sessions under the same session ids, and the tokens are those of an
    //    undisturbed run.
    let s_long = scenario(&[&n1, &n2, &n3], Some(&good), 40);
    let alone_long = one(rt.block_on(live_all(&scenario(&[], None, 40))).unwrap());
    let killer = kill_when_started(&n2, Duration::from_millis(400));
    let faulted = one(rt.block_on(live_all(&s_long)).unwrap());
    killer.join().unwrap();
    n2.kill();
    assert!(
        faulted.report.failovers > 0,
        "the kill landed outside the generation: no session was started over"
    );
    assert_eq!(faulted.report.outputs, alone_long.report.outputs);
    for r in &faulted.report.records {
        assert_eq!(r.output_tokens, 40, "request {}", r.id);
    }
    let timeline: Vec<String> = faulted
        .timeline
        .iter()
        .map(|(t, what)| format!("{:>8.3} s  {what}", t.as_secs_f64()))
        .collect();
    println!("the fault run's timeline:\n{}", timeline.join("\n"));
    let text = timeline.join("\n");
    assert!(text.contains("node 2") && text.contains("lost"), "{text}");
    assert!(text.contains("actor 2 placed again on node 3"), "{text}");
    assert!(n1.alive() && n3.alive());

    // 4b. Three shards, the middle one killed: the tail, on a live node, goes on answering
    //     the head while the lost shard is placed again on a spare.
    let n4 = Node::start(&good);
    let n5 = Node::start(&good);
    let three = |nodes: &[&Node]| {
        let text = scenario_text(nodes, Some(&good), 40).replace("shards = 2", "shards = 3");
        PipelineScenario::parse("three.toml", "three", Path::new("."), &text).unwrap()
    };
    let alone3 = one(rt.block_on(live_all(&three(&[]))).unwrap());
    let killer = kill_when_started(&n3, Duration::from_millis(400));
    let faulted3 = one(rt
        .block_on(live_all(&three(&[&n1, &n3, &n4, &n5])))
        .unwrap());
    killer.join().unwrap();
    n3.kill();
    assert!(faulted3.report.failovers > 0);
    assert_eq!(faulted3.report.outputs, alone3.report.outputs);
    let text3: Vec<String> = faulted3.timeline.iter().map(|(_, w)| w.clone()).collect();
    assert!(
        text3
            .iter()
            .any(|w| w.contains("actor 2 placed again on node 4")),
        "{text3:?}"
    );
    drop((n1, n3, n4, n5));

    // 5. scripts/live_cluster.sh, as a user runs it, with both hosts on 127.0.0.1: it
    //    starts two nodes, runs the scenario across them and stops them.
    let file = dir.path().join("cluster.toml");
    std::fs::write(&file, scenario_text(&[], None, 4)).unwrap();
    let out = dir.path().join("out");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/live_cluster.sh");
    // The script takes fixed ports (PORT and PORT + 1), as a user gives them. Between our
    // probe and the nodes' bind another process may take one, so a run that lost that race
    // (and only that) is tried again on other ports.
    let run = |port: u16| {
        Command::new("bash")
            .arg(&script)
            .arg(&file)
            .args(["--quiet", "--out"])
            .arg(&out)
            .env("MESHSIM", env!("CARGO_BIN_EXE_meshsim"))
            .env("COOKIE", &good)
            .env("PORT", port.to_string())
            .env("HOSTS", "127.0.0.1 127.0.0.1")
            .output()
            .unwrap()
    };
    let lost_race = |o: &std::process::Output| {
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Address already in use")
    };
    let mut o = run(two_free_ports(0));
    for attempt in 1..5 {
        if !lost_race(&o) {
            break;
        }
        o = run(two_free_ports(attempt));
    }
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
}

/// A port P such that P and P + 1 are both free on 127.0.0.1 now, below the kernel's
/// ephemeral range (32768 and up on Linux), where outgoing connections of the test's other
/// cases (and of the rest of the machine) take their local ports.
fn two_free_ports(attempt: u32) -> u16 {
    let offset = ((std::process::id() + 997 * attempt) % 12_000) as u16;
    (0..2_000u16)
        .map(|i| 20_000 + (offset + 2 * i) % 12_000)
        .find(|&p| {
            let a = std::net::TcpListener::bind(("127.0.0.1", p));
            let b = std::net::TcpListener::bind(("127.0.0.1", p + 1));
            a.is_ok() && b.is_ok()
        })
        .expect("no two free ports between 20000 and 32000 on 127.0.0.1")
}

#[test]
fn a_failed_run_across_processes_says_how_to_repeat_it_with_its_nodes_and_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let good = cookie(dir.path(), "cookie", "the-repeat-cookie-5");
    let file = dir.path().join("c.toml");
    std::fs::write(&file, scenario_text(&[], None, 4)).unwrap();
    // Nothing listens on the discard port: the run fails (status 1) before it starts.
    let o = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args([
            "run",
            "--live",
            "-q",
            "--out",
            "out",
            "--nodes",
            "127.0.0.1:9",
        ])
        .arg("--cookie-file")
        .arg(&good)
        .arg(&file)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("reproduce with: "))
        .unwrap_or_else(|| panic!("no reproducing command: {err}"));
    let expected = format!(
        "reproduce with: meshsim run {} --live --nodes 127.0.0.1:9 --cookie-file {} --seed 5",
        file.display(),
        good.display()
    );
    assert_eq!(line, expected);
    assert!(!dir.path().join("out").exists());
}
