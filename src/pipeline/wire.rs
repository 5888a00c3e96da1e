//! The pipeline system's messages between processes ([`crate::live::cluster`]): a versioned,
//! documented binary encoding of [`Msg`].
//!
//! A message is encoded as the [postcard] serialization (postcard 1.x wire format: varint
//! integers, length-prefixed sequences, enums as a varint variant index) of the mirror types
//! below, whose bulk payloads are byte strings:
//!
//! * token ids: 4 bytes each, little-endian u32;
//! * an activation tensor: its dtype (0 = f32, the only one shipped today), its dimensions
//!   (`[1, positions, hidden]`) and `positions x hidden x 4` bytes of little-endian f32 in
//!   row-major order, copied out of the candle tensor and into a new one on the receiver's
//!   device;
//! * the tail's logits, when present: little-endian f32.
//!
//! The variant indices and field orders below are the format: a change to them is a new
//! [`crate::live::wire::VERSION`]. Decoding checks every length against the bytes present and
//! every shape against its payload, so a malformed message is an error naming what is wrong,
//! never a panic or an allocation larger than the frame.

use serde::{Deserialize, Serialize};

use super::Msg;
use super::shard::{CacheKey, Mode, SessionId, ShardReply, ShardRequest};
use crate::actor::ActorId;
use crate::backend::{ActInner, Activation};
use crate::live::wire::{WireError, WireMessage};
use crate::workload::ReqId;

/// Largest rank of a tensor on the wire.
const MAX_RANK: usize = 4;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum WireMsg {
    Arrival(u32),
    WorkDone,
    Step(WireRequest),
    Reply { attempt: u32, reply: WireReply },
    Restart,
    Lost(u32),
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct WireRequest {
    session: u64,
    /// 0 prefill, 1 decode, 2 stateless.
    mode: u8,
    seq_len: u64,
    attempt: u32,
    input: WireActivation,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum WireActivation {
    /// Little-endian u32 token ids.
    Tokens(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A simulated activation (shape only; never crosses processes in practice).
    Shape {
        positions: u64,
        hidden: u64,
        bytes_per_element: u8,
    },
    Tensor {
        dtype: u8,
        dims: Vec<u32>,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum WireReply {
    Forward(WireRequest),
    Token {
        session: u64,
        token: u32,
        #[serde(with = "serde_bytes")]
        logits: Option<Vec<u8>>,
    },
    CacheMiss {
        session: u64,
        start: u64,
        end: u64,
    },
    Failed {
        session: u64,
        error: String,
    },
}

fn mode_code(m: Mode) -> u8 {
    match m {
        Mode::Prefill => 0,
        Mode::Decode => 1,
        Mode::Stateless => 2,
    }
}

fn bad(what: impl Into<String>) -> WireError {
    WireError::Malformed(what.into())
}

fn le_f32(xs: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(xs.len() * 4);
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn f32_le(bytes: &[u8], what: &str) -> Result<Vec<f32>, WireError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(bad(format!(
            "{what}: {} bytes, not whole f32s",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn to_usize(x: u64, what: &str) -> Result<usize, WireError> {
    usize::try_from(x).map_err(|_| bad(format!("{what} {x} does not fit this machine")))
}

impl WireActivation {
    fn from(a: &Activation) -> Result<WireActivation, WireError> {
        Ok(match &a.0 {
            ActInner::Tokens(ids) => {
                let mut b = Vec::with_capacity(ids.len() * 4);
                for id in ids {
                    b.extend_from_slice(&id.to_le_bytes());
                }
                WireActivation::Tokens(b)
            }
            ActInner::Shape {
                positions,
                hidden,
                bytes_per_element,
            } => WireActivation::Shape {
                positions: *positions as u64,
                hidden: *hidden as u64,
                bytes_per_element: u8::try_from(*bytes_per_element)
                    .map_err(|_| bad("an element wider than 255 bytes"))?,
            },
            ActInner::Tensor(t) => {
                if t.dtype() != candle_core::DType::F32 {
                    return Err(WireError::Unsupported(format!(
                        "an activation of dtype {:?} (only f32 crosses processes)",
                        t.dtype()
                    )));
                }
                let dims = t
                    .dims()
                    .iter()
                    .map(|&d| u32::try_from(d).map_err(|_| bad("a dimension over 2^32")))
                    .collect::<Result<Vec<u32>, _>>()?;
                let values = t
                    .flatten_all()
                    .and_then(|f| f.to_vec1::<f32>())
                    .map_err(|e| WireError::Unsupported(format!("reading an activation: {e}")))?;
                WireActivation::Tensor {
                    dtype: 0,
                    dims,
                    data: le_f32(&values),
                }
            }
        })
    }

    fn into_activation(self) -> Result<Activation, WireError> {
        Ok(match self {
            WireActivation::Tokens(b) => {
                if !b.len().is_multiple_of(4) {
                    return Err(bad(format!("token ids: {} bytes, not whole u32s", b.len())));
                }
                Activation::tokens(
                    b.chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
            }
            WireActivation::Shape {
                positions,
                hidden,
                bytes_per_element,
            } => Activation(ActInner::Shape {
                positions: to_usize(positions, "positions")?,
                hidden: to_usize(hidden, "hidden size")?,
                bytes_per_element: bytes_per_element as usize,
            }),
            WireActivation::Tensor { dtype, dims, data } => {
                if dtype != 0 {
                    return Err(bad(format!("activation dtype code {dtype} (0 = f32 only)")));
                }
                if dims.is_empty() || dims.len() > MAX_RANK {
                    return Err(bad(format!(
                        "an activation of rank {} (1 to {MAX_RANK})",
                        dims.len()
                    )));
                }
                let elems = dims
                    .iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
                    .ok_or_else(|| bad("activation dimensions overflow"))?;
                if elems.checked_mul(4) != Some(data.len() as u64) {
                    return Err(bad(format!(
                        "an activation of shape {dims:?} carries {} bytes, not {} x 4",
                        data.len(),
                        elems
                    )));
                }
                let values = f32_le(&data, "activation")?;
                let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
                let t =
                    candle_core::Tensor::from_vec(values, shape, &crate::exec::default_device())
                        .map_err(|e| bad(format!("activation: {e}")))?;
                Activation(ActInner::Tensor(t))
            }
        })
    }
}

impl WireRequest {
    fn from(r: &ShardRequest) -> Result<WireRequest, WireError> {
        Ok(WireRequest {
            session: r.session.0,
            mode: mode_code(r.mode),
            seq_len: r.seq_len as u64,
            attempt: r.attempt,
            input: WireActivation::from(&r.input)?,
        })
    }

    fn into_request(self) -> Result<ShardRequest, WireError> {
        let mode = match self.mode {
            0 => Mode::Prefill,
            1 => Mode::Decode,
            2 => Mode::Stateless,
            m => return Err(bad(format!("step mode code {m} (0 to 2)"))),
        };
        Ok(ShardRequest {
            session: SessionId(self.session),
            mode,
            seq_len: to_usize(self.seq_len, "sequence length")?,
            attempt: self.attempt,
            input: self.input.into_activation()?,
        })
    }
}

impl WireReply {
    fn from(r: &ShardReply) -> Result<WireReply, WireError> {
        Ok(match r {
            ShardReply::Forward(req) => WireReply::Forward(WireRequest::from(req)?),
            ShardReply::Token {
                session,
                token,
                logits,
            } => WireReply::Token {
                session: session.0,
                token: *token,
                logits: logits.as_deref().map(le_f32),
            },
            ShardReply::CacheMiss { session, key } => WireReply::CacheMiss {
                session: session.0,
                start: key.start as u64,
                end: key.end as u64,
            },
            ShardReply::Failed { session, error } => WireReply::Failed {
                session: session.0,
                error: error.clone(),
            },
        })
    }

    fn into_reply(self) -> Result<ShardReply, WireError> {
        Ok(match self {
            WireReply::Forward(r) => ShardReply::Forward(r.into_request()?),
            WireReply::Token {
                session,
                token,
                logits,
            } => ShardReply::Token {
                session: SessionId(session),
                token,
                logits: logits.map(|b| f32_le(&b, "logits")).transpose()?,
            },
            WireReply::CacheMiss {
                session,
                start,
                end,
            } => ShardReply::CacheMiss {
                session: SessionId(session),
                key: CacheKey {
                    session: SessionId(session),
                    start: to_usize(start, "layer")?,
                    end: to_usize(end, "layer")?,
                },
            },
            WireReply::Failed { session, error } => ShardReply::Failed {
                session: SessionId(session),
                error,
            },
        })
    }
}

impl WireMessage for Msg {
    const SYSTEM: &'static str = "pipeline";

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let w = match self {
            Msg::Arrival(ReqId(r)) => WireMsg::Arrival(*r),
            Msg::WorkDone => WireMsg::WorkDone,
            Msg::Step(req) => WireMsg::Step(WireRequest::from(req)?),
            Msg::Reply { reply, attempt } => WireMsg::Reply {
                attempt: *attempt,
                reply: WireReply::from(reply)?,
            },
            Msg::Restart => WireMsg::Restart,
            Msg::Lost(a) => WireMsg::Lost(a.0),
        };
        crate::live::wire::postcard_into(&w, out)
    }

    fn decode(bytes: &[u8]) -> Result<Msg, WireError> {
        let w: WireMsg = crate::live::wire::postcard_whole(bytes)?;
        Ok(match w {
            WireMsg::Arrival(r) => Msg::Arrival(ReqId(r)),
            WireMsg::WorkDone => Msg::WorkDone,
            WireMsg::Step(r) => Msg::Step(Box::new(r.into_request()?)),
            WireMsg::Reply { attempt, reply } => Msg::Reply {
                reply: Box::new(reply.into_reply()?),
                attempt,
            },
            WireMsg::Restart => Msg::Restart,
            WireMsg::Lost(a) => Msg::Lost(ActorId(a)),
        })
    }

    fn lost(actor: ActorId) -> Option<Msg> {
        Some(Msg::Lost(actor))
    }

    fn describe(&self) -> String {
        match self {
            Msg::Step(r) => format!(
                "a {:?} step of session {} ({} positions, {} B)",
                r.mode,
                r.session.0,
                r.input.positions(),
                r.input.bytes()
            ),
            Msg::Reply { reply, .. } => format!("a reply {reply:?}"),
            other => format!("{other:?}"),
        }
    }
}

/// Bytes of the largest encoded [`Msg`] a route of a model with `hidden` units and
/// `vocab` logits produces for sequences of at most `max_tokens` tokens: a step carrying
/// the activation of every position (a prefill), or the tail's logits, plus `slack` for the
/// fields around them. The frame limit of a run is set from it.
pub fn largest_message(max_tokens: u64, hidden: u64, vocab: u64) -> u64 {
    /// Varints, tags and dims around a payload: generously above what postcard writes.
    const SLACK: u64 = 256;
    let activation = max_tokens * hidden * 4;
    let tokens = max_tokens * 4;
    let logits = vocab * 4;
    activation.max(tokens).max(logits) + SLACK
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::wire::WireMessage;
    use proptest::prelude::*;

    fn tensor(positions: usize, hidden: usize, seed: f32) -> Activation {
        let v: Vec<f32> = (0..positions * hidden)
            .map(|i| seed + i as f32 * 0.25)
            .collect();
        let t = candle_core::Tensor::from_vec(v, (1, positions, hidden), &candle_core::Device::Cpu)
            .unwrap();
        Activation(ActInner::Tensor(t))
    }

    fn roundtrip(m: &Msg) -> Msg {
        let mut b = Vec::new();
        m.encode(&mut b).unwrap();
        Msg::decode(&b).unwrap()
    }

    #[test]
    fn every_message_survives_the_wire_with_its_values() {
        let req = ShardRequest {
            session: SessionId(7),
            mode: Mode::Decode,
            input: tensor(1, 8, 1.5),
            seq_len: 33,
            attempt: 2,
        };
        let m = roundtrip(&Msg::Step(Box::new(req)));
        let Msg::Step(r) = m else { panic!("{m:?}") };
        assert_eq!(
            (r.session, r.mode, r.seq_len, r.attempt),
            (SessionId(7), Mode::Decode, 33, 2)
        );
        let ActInner::Tensor(t) = &r.input.0 else {
            panic!()
        };
        assert_eq!(t.dims(), &[1, 1, 8]);
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(v, (0..8).map(|i| 1.5 + i as f32 * 0.25).collect::<Vec<_>>());

        let tokens = Msg::Step(Box::new(ShardRequest {
            session: SessionId(1),
            mode: Mode::Prefill,
            input: Activation::tokens(vec![1, 2, 31_999]),
            seq_len: 3,
            attempt: 0,
        }));
        let Msg::Step(r) = roundtrip(&tokens) else {
            panic!()
        };
        assert_eq!(r.input.token_ids(), Some(&[1, 2, 31_999][..]));

        let reply = Msg::Reply {
            reply: Box::new(ShardReply::Token {
                session: SessionId(3),
                token: 9,
                logits: Some(vec![0.5, -1.0, f32::MIN_POSITIVE]),
            }),
            attempt: 1,
        };
        let Msg::Reply { reply, attempt } = roundtrip(&reply) else {
            panic!()
        };
        assert_eq!(attempt, 1);
        let ShardReply::Token {
            session,
            token,
            logits,
        } = *reply
        else {
            panic!()
        };
        assert_eq!((session, token), (SessionId(3), 9));
        assert_eq!(logits, Some(vec![0.5, -1.0, f32::MIN_POSITIVE]));

        for m in [
            Msg::Restart,
            Msg::WorkDone,
            Msg::Lost(ActorId(4)),
            Msg::Arrival(ReqId(5)),
        ] {
            assert_eq!(format!("{:?}", roundtrip(&m)), format!("{m:?}"));
        }
    }

    #[test]
    fn a_tensor_travels_as_its_raw_little_endian_bytes() {
        let m = Msg::Step(Box::new(ShardRequest {
            session: SessionId(1),
            mode: Mode::Prefill,
            input: tensor(3, 4, -2.0),
            seq_len: 3,
            attempt: 0,
        }));
        let mut b = Vec::new();
        m.encode(&mut b).unwrap();
        let raw = le_f32(&(0..12).map(|i| -2.0 + i as f32 * 0.25).collect::<Vec<_>>());
        assert!(b.windows(raw.len()).any(|w| w == raw.as_slice()));
        // The payload and a few bytes of fields around it.
        assert!(b.len() < raw.len() + 32, "{} bytes", b.len());
        assert!(largest_message(3, 4, 10) >= b.len() as u64);
    }

    #[test]
    fn a_tensor_whose_payload_does_not_match_its_shape_is_refused() {
        let w = WireMsg::Step(WireRequest {
            session: 1,
            mode: 0,
            seq_len: 2,
            attempt: 0,
            input: WireActivation::Tensor {
                dtype: 0,
                dims: vec![1, 2, 1 << 30],
                data: vec![0; 16],
            },
        });
        let b = postcard::to_allocvec(&w).unwrap();
        let e = Msg::decode(&b).unwrap_err();
        assert!(e.to_string().contains("shape"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The decoder never panics and never allocates beyond its input on any bytes.
        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Msg::decode(&b);
        }

        /// Flipping, cutting or extending a valid message gives a message or an error, never a
        /// panic.
        #[test]
        fn damaged_messages_never_panic_the_decoder(
            positions in 1usize..6, hidden in 1usize..6, at in any::<prop::sample::Index>(),
            byte in any::<u8>(), cut in any::<prop::sample::Index>(), extra in 0usize..4,
        ) {
            let m = Msg::Step(Box::new(ShardRequest {
                session: SessionId(9),
                mode: Mode::Prefill,
                input: tensor(positions, hidden, 0.0),
                seq_len: positions,
                attempt: 0,
            }));
            let mut b = Vec::new();
            m.encode(&mut b).unwrap();
            let mut flipped = b.clone();
            let i = at.index(flipped.len());
            flipped[i] ^= byte;
            let _ = Msg::decode(&flipped);
            let _ = Msg::decode(&b[..cut.index(b.len())]);
            let mut longer = b.clone();
            longer.extend(std::iter::repeat_n(byte, extra));
            let r = Msg::decode(&longer);
            prop_assert!(extra > 0 || r.is_ok());
            if extra > 0 {
                // Trailing bytes are an error: a frame is one message.
                prop_assert!(r.is_err());
            }
        }
    }
}
