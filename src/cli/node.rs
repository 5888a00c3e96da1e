//! `meshsim node`: a long-running process that joins a cluster and hosts the actors a live
//! run places on it (see `meshsim::live::cluster`).

use std::path::Path;
use std::process::ExitCode;

use super::{EXIT_FAILED, bad};
use meshsim::live::cluster::{self, Net, NodeLimits, NodeRunFn};
use meshsim::live::wire::Setup;
use meshsim::pipeline::cluster::Pipeline;
use meshsim::serving::cluster::Serving;

/// The systems a node can host, by their wire name.
fn system(name: &str) -> Option<NodeRunFn> {
    fn pipeline<'a>(
        net: &'a mut Net,
        coordinator: u64,
        setup: Setup,
        limits: NodeLimits,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + 'a>> {
        Box::pin(cluster::node_run::<Pipeline>(
            net,
            coordinator,
            setup,
            limits,
        ))
    }
    fn serving<'a>(
        net: &'a mut Net,
        coordinator: u64,
        setup: Setup,
        limits: NodeLimits,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + 'a>> {
        Box::pin(cluster::node_run::<Serving>(
            net,
            coordinator,
            setup,
            limits,
        ))
    }
    match name {
        "pipeline" => Some(pipeline),
        "serving" => Some(serving),
        _ => None,
    }
}

/// Largest `--max-frame-mib` (4 GiB): a peer's frame is buffered whole as it arrives, so the
/// limit is memory that the node may have to hold for one message.
const MAX_FRAME_MIB: u64 = 4096;
/// Largest `--max-memory-gib` (1 PiB): beyond it the limit in bytes nears `u64`'s end and
/// guards nothing.
const MAX_MEMORY_GIB: u64 = 1 << 20;

pub(crate) fn node(
    listen: &str,
    cookie_file: &Path,
    max_frame_mib: u64,
    max_memory_gib: u64,
) -> ExitCode {
    let addr = match cluster::parse_listen(listen) {
        Ok(a) => a,
        Err(e) => return bad(e),
    };
    if !(1..=MAX_FRAME_MIB).contains(&max_frame_mib) {
        return bad(format!(
            "--max-frame-mib {max_frame_mib}: 1 to {MAX_FRAME_MIB}"
        ));
    }
    if !(1..=MAX_MEMORY_GIB).contains(&max_memory_gib) {
        return bad(format!(
            "--max-memory-gib {max_memory_gib}: 1 to {MAX_MEMORY_GIB}"
        ));
    }
    let cookie = match cluster::read_cookie(cookie_file) {
        Ok(c) => c,
        Err(e) => return bad(e),
    };
    if !addr.ip().is_loopback() {
        tracing::warn!(
            "listening at {addr}, reachable from the network: the cookie is the only guard, and \
             frames are not encrypted"
        );
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start tokio: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let limits = NodeLimits {
        max_memory: max_memory_gib << 30,
    };
    match rt.block_on(cluster::serve(
        addr,
        cookie,
        max_frame_mib << 20,
        limits,
        system,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(super::EXIT_BAD_INPUT)
        }
    }
}
