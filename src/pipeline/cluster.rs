//! Pipeline routes across processes ([`crate::live::cluster`]): the head runs in the
//! coordinator (`meshsim run --live` with `[live] nodes`), shard `i` on node `1 + i mod N`
//! of the `N` nodes named, and nodes beyond the shards' are spares that take a lost shard.
//!
//! A shard crosses to its node as a [`ShardSpec`] ([`super::build`]): the model's architecture, its layer
//! range, the session-cache limits, its neighbours and the seed of the weights. The node
//! builds it with [`ShardSpec::actor`] over a [`crate::backend::CandleBackend`] with weights seeded as in a
//! one-process run, so both run the same [`super::ShardNode`] code on the same numbers.

use super::Msg;
use super::build::ShardSpec;
use super::outcome::PipelineRun;
use super::scenario::{PipelineScenario, mode_name};
use super::shard::DecodeMode;
use crate::actor::Actor;
use crate::live::LiveError;
use crate::live::cluster::{Coordinator, Placement, System};
use crate::live::wire::FRAME_OVERHEAD;

/// The pipeline system on a node.
pub struct Pipeline;

impl System for Pipeline {
    type Msg = Msg;
    /// Shards share nothing inside a process.
    type Shared = ();

    fn shared(
        _setup: &crate::live::wire::Setup,
        _max_memory: u64,
        _reads: std::sync::Arc<crate::live::cluster::Reads>,
    ) -> Result<(), String> {
        Ok(())
    }

    fn build(spec: &[u8], max_memory: u64, _shared: &()) -> Result<Box<dyn Actor<Msg>>, String> {
        let spec: ShardSpec = crate::live::wire::postcard_whole(spec).map_err(|e| e.to_string())?;
        let m = &spec.model;
        if spec.layers.start >= spec.layers.end || spec.layers.end > m.layers {
            return Err(format!(
                "layers {:?} of a {}-layer model",
                spec.layers, m.layers
            ));
        }
        if m.hidden == 0 || m.heads == 0 || m.kv_heads == 0 || m.head_dim == 0 || m.vocab == 0 {
            return Err("a model with a zero dimension".into());
        }
        if spec.max_queue == 0 || spec.max_queue > 1 << 20 || spec.max_sessions > 1 << 20 {
            return Err(format!(
                "queue {} / sessions {}: out of range",
                spec.max_queue, spec.max_sessions
            ));
        }
        let bytes = spec.weight_bytes();
        if bytes > max_memory {
            return Err(format!(
                "shard {} needs {bytes} bytes of weights, over this node's limit of {max_memory} \
                 (--max-memory-gib)",
                spec.index
            ));
        }
        let backend = spec.backend()?;
        Ok(spec.actor(Box::new(backend)))
    }
}

/// The largest frame a run of `s` can send: a prefill's activation of its longest sequence,
/// or the tail's logits.
pub fn max_frame(s: &PipelineScenario) -> u64 {
    let longest = super::build::trace(s)
        .iter()
        .map(|r| r.prompt.len() as u64 + r.output_tokens as u64)
        .max()
        .unwrap_or(1);
    super::wire::largest_message(longest, s.model.hidden as u64, s.model.vocab as u64)
        + FRAME_OVERHEAD
}

/// Runs `s` in `mode` across the coordinator's nodes: the head here, shard `i` on node
/// `1 + i mod N`.
pub async fn live(
    s: &PipelineScenario,
    mode: DecodeMode,
    coordinator: &mut Coordinator,
) -> Result<PipelineRun, LiveError> {
    let nodes = coordinator.addresses().len();
    if nodes == 0 {
        return Err(LiveError::Config("no nodes to place the shards on".into()));
    }
    let specs = super::build::specs(s);
    let head = super::build::head(s, mode);
    let mut placement = Placement {
        local: Default::default(),
        remote: Default::default(),
        shared: Vec::new(),
    };
    placement.local.insert(0, head);
    for (i, spec) in specs.iter().enumerate() {
        let bytes = postcard::to_allocvec(spec).map_err(|e| LiveError::Config(e.to_string()))?;
        placement
            .remote
            .insert(i as u32 + 1, ((1 + i % nodes) as u16, bytes));
    }
    let out = coordinator
        .run::<Pipeline>(placement, s.seed, max_frame(s), s.max_wall)
        .await?;
    tracing::info!(
        mode = mode_name(mode),
        frames = out.wire_frames,
        frame_bytes = out.wire_bytes,
        payload_bytes = out.bytes,
        "actor messages across processes"
    );
    Ok(PipelineRun::live(mode, out, coordinator.timeline.clone()))
}
