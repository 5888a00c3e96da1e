//! The serving system's messages between processes ([`crate::live::cluster`]): a versioned,
//! documented binary encoding of [`Msg`], and of the K/V a store moves.
//!
//! A message is the [postcard] serialization (postcard 1.x: varint integers, length-prefixed
//! sequences, enums as a varint variant index, structs as their fields in order) of the
//! mirror enum `WireMsg` below. Its small values are the serving system's own types
//! ([`Completion`], [`Output`], [`Lookup`], [`LoadPlan`] with its
//! [`crate::serving::store::directory::LoadGroup`]s, [`Applied`] with its
//! [`crate::serving::store::directory::Change`]s), whose field and variant orders in their
//! files are part of the format. K/V travels as [`WireKv`]:
//!
//! ```text
//! layers      start, end          (varints)
//! positions   start, end          (varints)
//! dims        5 varints: layers, 2 (K and V), kv_heads, positions, head_dim
//! data        byte string: the product of dims x 4 bytes of little-endian f32, row-major
//! ```
//!
//! A change to any of these orders is a new [`crate::live::wire::VERSION`]. Decoding checks
//! every length against the bytes present and every shape against its payload: a malformed
//! message is an error naming what is wrong, never a panic, and allocates no more than the
//! frame holds.

use std::sync::Arc;

use ndarray::Array5;
use serde::{Deserialize, Serialize};

use super::Msg;
use super::msg::{Applied, Completion, KvEvents, Lookup, Output};
use super::store::directory::{LoadPlan, TensorId};
use super::store::memory::KvData;
use crate::actor::ActorId;
use crate::exec::HostKv;
use crate::live::wire::{WireError, WireMessage};
use crate::workload::ReqId;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum WireMsg {
    Arrival(u32),
    Submit(u32),
    WorkDone,
    FirstToken(u32, u32),
    Finished(Completion),
    Rejected(u32, u32),
    Lookup(Lookup),
    LookupReply(u32, LoadPlan, u32),
    Loaded(u32),
    LoadFailed(u32),
    StoreWrite {
        chain: Vec<TensorId>,
        replica: bool,
        data: Option<Vec<(TensorId, WireKv)>>,
    },
    Apply(Applied),
    Insert {
        chain: Vec<TensorId>,
        node: u32,
        replica: bool,
    },
    Demote {
        bytes: u64,
    },
    Crash,
    NodeDown(u32),
    StoreLost(u32),
    Inject(u32),
    Output(Output),
    ActorLost(u32),
    KvEvents(KvEvents),
    PublishKv,
}

/// A store tensor's K/V on the wire (see the module doc).
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct WireKv {
    layers: (u64, u64),
    positions: (u64, u64),
    dims: [u64; 5],
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

fn bad(what: impl Into<String>) -> WireError {
    WireError::Malformed(what.into())
}

impl WireKv {
    pub fn from(kv: &HostKv) -> WireKv {
        let d = kv.data.dim();
        let mut data = Vec::with_capacity(kv.data.len() * 4);
        // `iter` walks the logical (row-major) order whatever the memory layout.
        for x in kv.data.iter() {
            data.extend_from_slice(&x.to_le_bytes());
        }
        WireKv {
            layers: (kv.layers.start as u64, kv.layers.end as u64),
            positions: (kv.positions.start as u64, kv.positions.end as u64),
            dims: [d.0, d.1, d.2, d.3, d.4].map(|x| x as u64),
            data,
        }
    }

    pub fn into_host(self) -> Result<HostKv, WireError> {
        let us = |x: u64, what: &str| {
            usize::try_from(x).map_err(|_| bad(format!("K/V {what} {x} does not fit")))
        };
        let [l, two, h, t, d] = self.dims;
        let elements = self
            .dims
            .iter()
            .try_fold(1u64, |a, &x| a.checked_mul(x))
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| bad(format!("K/V dims {:?} overflow", self.dims)))?;
        if elements != self.data.len() as u64 {
            return Err(bad(format!(
                "K/V of dims {:?} needs {elements} bytes, the message has {}",
                self.dims,
                self.data.len()
            )));
        }
        let (ls, le) = self.layers;
        let (ps, pe) = self.positions;
        if two != 2 || le < ls || le - ls != l || pe < ps || pe - ps != t {
            return Err(bad(format!(
                "K/V of dims {:?} for layers {ls}..{le} and positions {ps}..{pe}",
                self.dims
            )));
        }
        let values: Vec<f32> = self
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let shape = (
            us(l, "layers")?,
            2,
            us(h, "heads")?,
            us(t, "positions")?,
            us(d, "head dim")?,
        );
        let data = Array5::from_shape_vec(shape, values).map_err(|e| bad(format!("K/V: {e}")))?;
        Ok(HostKv {
            layers: us(ls, "layer")?..us(le, "layer")?,
            positions: us(ps, "position")?..us(pe, "position")?,
            data,
        })
    }
}

/// Encodes the K/V of one tensor as a byte string (a store read's answer).
pub fn encode_kv(kv: &HostKv) -> Result<Vec<u8>, WireError> {
    postcard::to_allocvec(&WireKv::from(kv)).map_err(|e| WireError::Unsupported(e.to_string()))
}

/// Decodes [`encode_kv`]'s bytes.
pub fn decode_kv(bytes: &[u8]) -> Result<HostKv, WireError> {
    crate::live::wire::postcard_whole::<WireKv>(bytes)?.into_host()
}

fn to_wire(m: &Msg) -> WireMsg {
    match m {
        Msg::Arrival(r) => WireMsg::Arrival(r.0),
        Msg::Submit(r) => WireMsg::Submit(r.0),
        Msg::WorkDone => WireMsg::WorkDone,
        Msg::FirstToken(r, i) => WireMsg::FirstToken(r.0, *i),
        Msg::Finished(c) => WireMsg::Finished((**c).clone()),
        Msg::Rejected(r, i) => WireMsg::Rejected(r.0, *i),
        Msg::Lookup(l) => WireMsg::Lookup(Lookup {
            req: l.req,
            from: l.from,
            node: l.node,
            chain: l.chain.clone(),
            skip: l.skip,
        }),
        Msg::LookupReply(r, plan, losses) => WireMsg::LookupReply(r.0, (**plan).clone(), *losses),
        Msg::Loaded(r) => WireMsg::Loaded(r.0),
        Msg::LoadFailed(r) => WireMsg::LoadFailed(r.0),
        Msg::StoreWrite {
            chain,
            replica,
            data,
        } => WireMsg::StoreWrite {
            chain: (**chain).clone(),
            replica: *replica,
            data: data
                .as_ref()
                .map(|d| d.iter().map(|(id, kv)| (*id, WireKv::from(kv))).collect()),
        },
        Msg::Apply(a) => WireMsg::Apply(Applied {
            changes: a.changes.clone(),
            written: a.written.clone(),
        }),
        Msg::Insert {
            chain,
            node,
            replica,
        } => WireMsg::Insert {
            chain: (**chain).clone(),
            node: *node,
            replica: *replica,
        },
        Msg::Demote { bytes } => WireMsg::Demote { bytes: *bytes },
        Msg::Crash => WireMsg::Crash,
        Msg::NodeDown(n) => WireMsg::NodeDown(*n),
        Msg::StoreLost(n) => WireMsg::StoreLost(*n),
        Msg::Inject(i) => WireMsg::Inject(*i),
        Msg::Output(o) => WireMsg::Output((**o).clone()),
        Msg::ActorLost(a) => WireMsg::ActorLost(a.0),
        Msg::KvEvents(e) => WireMsg::KvEvents((**e).clone()),
        Msg::PublishKv => WireMsg::PublishKv,
    }
}

fn from_wire(w: WireMsg) -> Result<Msg, WireError> {
    Ok(match w {
        WireMsg::Arrival(r) => Msg::Arrival(ReqId(r)),
        WireMsg::Submit(r) => Msg::Submit(ReqId(r)),
        WireMsg::WorkDone => Msg::WorkDone,
        WireMsg::FirstToken(r, i) => Msg::FirstToken(ReqId(r), i),
        WireMsg::Finished(c) => Msg::Finished(Box::new(c)),
        WireMsg::Rejected(r, i) => Msg::Rejected(ReqId(r), i),
        WireMsg::Lookup(l) => Msg::Lookup(Box::new(l)),
        WireMsg::LookupReply(r, plan, losses) => Msg::LookupReply(ReqId(r), Box::new(plan), losses),
        WireMsg::Loaded(r) => Msg::Loaded(ReqId(r)),
        WireMsg::LoadFailed(r) => Msg::LoadFailed(ReqId(r)),
        WireMsg::StoreWrite {
            chain,
            replica,
            data,
        } => {
            let data = match data {
                None => None,
                Some(d) => {
                    let mut out: KvData = Vec::with_capacity(d.len());
                    for (id, kv) in d {
                        out.push((id, Arc::new(kv.into_host()?)));
                    }
                    Some(Box::new(out))
                }
            };
            Msg::StoreWrite {
                chain: Box::new(chain),
                replica,
                data,
            }
        }
        WireMsg::Apply(a) => Msg::Apply(Box::new(a)),
        WireMsg::Insert {
            chain,
            node,
            replica,
        } => Msg::Insert {
            chain: Box::new(chain),
            node,
            replica,
        },
        WireMsg::Demote { bytes } => Msg::Demote { bytes },
        WireMsg::Crash => Msg::Crash,
        WireMsg::NodeDown(n) => Msg::NodeDown(n),
        WireMsg::StoreLost(n) => Msg::StoreLost(n),
        WireMsg::Inject(i) => Msg::Inject(i),
        WireMsg::Output(o) => Msg::Output(Box::new(o)),
        WireMsg::ActorLost(a) => Msg::ActorLost(ActorId(a)),
        WireMsg::KvEvents(e) => Msg::KvEvents(Box::new(e)),
        WireMsg::PublishKv => Msg::PublishKv,
    })
}

impl WireMessage for Msg {
    const SYSTEM: &'static str = "serving";

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        crate::live::wire::postcard_into(&to_wire(self), out)
    }

    fn decode(bytes: &[u8]) -> Result<Msg, WireError> {
        from_wire(crate::live::wire::postcard_whole(bytes)?)
    }

    /// Every actor hears of a lost one: the router runs the lost instance's requests again,
    /// the metadata service forgets the lost store's tensors (see [`super::cluster`]).
    fn lost(actor: ActorId) -> Option<Msg> {
        Some(Msg::ActorLost(actor))
    }

    fn describe(&self) -> String {
        match self {
            Msg::StoreWrite { chain, data, .. } => format!(
                "a store write of {} tensors ({} with K/V)",
                chain.len(),
                data.as_ref().map_or(0, |d| d.len())
            ),
            Msg::Apply(a) => format!("a store update of {} changes", a.changes.len()),
            Msg::Lookup(l) => format!(
                "a lookup of {} tensors for request {}",
                l.chain.len(),
                l.req.0
            ),
            Msg::LookupReply(r, p, _) => {
                format!(
                    "a load plan of {} groups for request {}",
                    p.groups.len(),
                    r.0
                )
            }
            other => {
                let s = format!("{other:?}");
                s.chars().take(80).collect()
            }
        }
    }
}

/// Bytes of the largest message a serving run can send whose prompts are at most
/// `max_prompt` tokens: a store write of the K/V of every tensor of one prompt (f32), with
/// its chain, or a lookup or plan of that chain; generously.
pub fn largest_message(max_prompt: u64, tensor_tokens: u64, kv_bytes_per_token_f32: u64) -> u64 {
    let tensors = max_prompt.div_ceil(tensor_tokens.max(1));
    // Per tensor: its id twice (chain and data), its K/V header, varints.
    tensors * (tensor_tokens * kv_bytes_per_token_f32 + 128) + 1024
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Tier;
    use crate::serving::msg::KvEvent;
    use crate::serving::store::directory::{Change, LoadGroup, Location};
    use proptest::prelude::*;

    fn kv(seed: f32) -> HostKv {
        let data = Array5::from_shape_fn((2, 2, 1, 3, 4), |(a, b, c, d, e)| {
            seed + (a * 1000 + b * 100 + c * 10 + d) as f32 + e as f32 * 0.25
        });
        HostKv {
            layers: 0..2,
            positions: 64..67,
            data,
        }
    }

    fn roundtrip(m: &Msg) -> Msg {
        let mut b = Vec::new();
        m.encode(&mut b).unwrap();
        Msg::decode(&b).unwrap()
    }

    fn all() -> Vec<Msg> {
        let plan = LoadPlan {
            stored_chunks: 3,
            groups: vec![LoadGroup {
                node: 1,
                location: Location::Ssd,
                tier: Tier::RemoteSsd,
                tensors: 2,
                bytes: 2 << 20,
                segments: 2,
                indices: vec![1, 2],
                epoch: 4,
            }],
            replicate: vec![7, 8],
        };
        vec![
            Msg::Arrival(ReqId(3)),
            Msg::Submit(ReqId(4)),
            Msg::WorkDone,
            Msg::FirstToken(ReqId(5), 1),
            Msg::Finished(Box::new(Completion {
                req: ReqId(6),
                instance: 2,
                admitted_at: crate::units::Nanos(99),
                reused: [1, 2, 3, 4, 5],
                loaded_bytes: [6, 7, 8, 9, 10],
                preemptions: 1,
            })),
            Msg::Rejected(ReqId(7), 0),
            Msg::Lookup(Box::new(Lookup {
                req: ReqId(8),
                from: ActorId(2),
                node: 1,
                chain: vec![u64::MAX, 0, 5],
                skip: 1,
            })),
            Msg::LookupReply(ReqId(9), Box::new(plan), 2),
            Msg::Loaded(ReqId(10)),
            Msg::LoadFailed(ReqId(11)),
            Msg::StoreWrite {
                chain: Box::new(vec![1, 2]),
                replica: true,
                data: Some(Box::new(vec![
                    (1, Arc::new(kv(0.5))),
                    (2, Arc::new(kv(-3.0))),
                ])),
            },
            Msg::StoreWrite {
                chain: Box::new(vec![3]),
                replica: false,
                data: None,
            },
            Msg::Apply(Box::new(Applied {
                changes: vec![
                    Change::Stored { node: 0, id: 1 },
                    Change::Demoted { node: 0, id: 2 },
                    Change::Dropped { node: 1, id: 3 },
                    Change::Replicated { node: 1, id: 4 },
                    Change::ReplicaGone { node: 0, id: 5 },
                ],
                written: vec![1, 9],
            })),
            Msg::Insert {
                chain: Box::new(vec![4, 5]),
                node: 1,
                replica: false,
            },
            Msg::Demote { bytes: 1 << 40 },
            Msg::Crash,
            Msg::NodeDown(1),
            Msg::StoreLost(0),
            Msg::Inject(2),
            Msg::Output(Box::new(Output {
                req: ReqId(12),
                instance: 3,
                tokens: vec![7, 0, u32::MAX],
                first_logits: vec![0.25, -1.5, f32::MAX],
            })),
            Msg::ActorLost(ActorId(9)),
            Msg::KvEvents(Box::new(KvEvents {
                instance: Some(2),
                events: vec![
                    KvEvent::Stored(u64::MAX),
                    KvEvent::Removed(7),
                    KvEvent::Cleared,
                    KvEvent::Store(Change::Demoted { node: 1, id: 8 }),
                    KvEvent::StoreCleared(3),
                ],
            })),
            Msg::PublishKv,
        ]
    }

    #[test]
    fn every_message_survives_the_wire_with_its_values() {
        for m in all() {
            let back = roundtrip(&m);
            assert_eq!(format!("{back:?}"), format!("{m:?}"));
        }
    }

    #[test]
    fn kv_travels_as_raw_little_endian_f32_in_logical_order() {
        let k = kv(1.0);
        let b = encode_kv(&k).unwrap();
        let n = k.data.len() * 4;
        // The payload is the last n bytes: the values in row-major order.
        let raw = &b[b.len() - n..];
        let first = f32::from_le_bytes(raw[..4].try_into().unwrap());
        let second = f32::from_le_bytes(raw[4..8].try_into().unwrap());
        assert_eq!((first, second), (1.0, 1.25));
        assert_eq!(decode_kv(&b).unwrap(), k);
        // A transposed (non-standard layout) array still travels in logical order.
        let mut t = k.clone();
        t.data = k.data.clone().reversed_axes().reversed_axes();
        assert_eq!(decode_kv(&encode_kv(&t).unwrap()).unwrap(), k);
    }

    #[test]
    fn kv_whose_payload_or_ranges_do_not_match_its_dims_is_refused() {
        let mut w = WireKv::from(&kv(0.0));
        w.data.pop();
        assert!(w.into_host().unwrap_err().to_string().contains("needs"));
        let mut w = WireKv::from(&kv(0.0));
        w.positions = (64, 70);
        assert!(w.into_host().is_err());
        let mut w = WireKv::from(&kv(0.0));
        w.dims = [u64::MAX, 2, 1, 3, 4];
        assert!(w.into_host().unwrap_err().to_string().contains("overflow"));
    }

    #[test]
    fn the_largest_message_bound_holds_for_a_whole_prompts_write() {
        // 3 tensors of 3 positions of the test K/V (96 bytes per position in f32).
        let per_token = 2 * 2 * 4 * 4;
        let m = Msg::StoreWrite {
            chain: Box::new(vec![u64::MAX; 3]),
            replica: false,
            data: Some(Box::new(
                (0..3).map(|i| (u64::MAX - i, Arc::new(kv(0.0)))).collect(),
            )),
        };
        let mut b = Vec::new();
        m.encode(&mut b).unwrap();
        assert!(
            (b.len() as u64) <= largest_message(9, 3, per_token),
            "{}",
            b.len()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Msg::decode(&b);
            let _ = decode_kv(&b);
        }

        #[test]
        fn damaged_messages_never_panic_the_decoder(
            which in 0usize..19, at in any::<prop::sample::Index>(), byte in any::<u8>(),
            cut in any::<prop::sample::Index>()
        ) {
            let m = &all()[which];
            let mut b = Vec::new();
            m.encode(&mut b).unwrap();
            let mut d = b.clone();
            let i = at.index(d.len());
            d[i] ^= byte;
            let _ = Msg::decode(&d);
            let _ = Msg::decode(&b[..cut.index(b.len())]);
        }
    }
}
