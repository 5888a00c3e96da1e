//! Running a pipeline scenario on the live host ([`crate::live::host`]): [`CandleBackend`]
//! shards (f32, weights seeded from the scenario's seed, on the default device), the wall
//! clock, one run after another; in this process, or across the `meshsim node`s of
//! `[live] nodes` ([`super::cluster`]).

use candle_core::DType;

use super::build::actors;
use super::outcome::PipelineRun;
use super::scenario::PipelineScenario;
use super::shard::DecodeMode;
use crate::backend::{CandleBackend, ModelBackend};
use crate::exec::{WeightSource, default_device};
use crate::live::LiveError;

/// Runs `s` in `mode` on the live host with candle shards.
pub async fn live(s: &PipelineScenario, mode: DecodeMode) -> Result<PipelineRun, LiveError> {
    let device = default_device();
    let weights = WeightSource::Seeded(s.seed);
    let mut backends: Vec<Box<dyn ModelBackend>> = Vec::with_capacity(s.layers.len());
    for l in &s.layers {
        let b = CandleBackend::load(&s.model, l.clone(), &weights, DType::F32, &device)
            .map_err(|e| LiveError::Config(e.to_string()))?;
        backends.push(Box::new(b));
    }
    let out = crate::live::host::run(actors(s, mode, backends), s.seed, s.max_wall).await?;
    Ok(PipelineRun::live(mode, out, Vec::new()))
}

/// Runs every mode at every point of `s` on the live host, one after another: in this
/// process, or across the `meshsim node`s of `[live] nodes` (with the cluster's cookie).
pub async fn live_all(s: &PipelineScenario) -> Result<Vec<PipelineRun>, LiveError> {
    let mut coordinator = if s.nodes.is_empty() {
        None
    } else {
        let Some(path) = &s.cookie_file else {
            return Err(LiveError::Config(
                "[live] nodes needs the cluster's cookie: [live] cookie_file or --cookie-file"
                    .into(),
            ));
        };
        let cookie = crate::live::cluster::read_cookie(path).map_err(LiveError::Config)?;
        let max_frame = s
            .runs()
            .iter()
            .map(|(_, p)| super::cluster::max_frame(p))
            .max()
            .unwrap_or(0);
        Some(crate::live::cluster::Coordinator::connect(&s.nodes, cookie, max_frame).await?)
    };
    let mut runs = Vec::new();
    let mut result = Ok(());
    'points: for (label, p) in s.runs() {
        for &m in &p.modes {
            let r = match coordinator.as_mut() {
                Some(c) => {
                    let r = super::cluster::live(p, m, c).await;
                    for (t, what) in &c.timeline {
                        tracing::info!("{:>9.3} s  {what}", t.as_secs_f64());
                    }
                    r
                }
                None => live(p, m).await,
            };
            match r {
                Ok(mut r) => {
                    r.summary.point = label.map(str::to_string);
                    runs.push(r);
                }
                Err(e) => {
                    result = Err(e);
                    break 'points;
                }
            }
        }
    }
    if let Some(c) = &coordinator {
        c.shutdown().await;
    }
    result.map(|()| runs)
}
