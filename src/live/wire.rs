//! The wire format of live runs across processes ([`super::cluster`]), version [`VERSION`].
//!
//! Processes talk through `ractor_cluster`: its node sessions authenticate peers with the
//! cookie and carry length-prefixed protobuf frames (their size bounded by each node's
//! inbound frame limit). Inside that transport, meshsim sends one kind of ractor message, a
//! [`Frame`]'s bytes, to one actor per process (the process's *agent*), and never anything
//! else. A frame is:
//!
//! ```text
//! offset  size  field
//! 0       4     magic "MSHW"
//! 4       2     version, little-endian u16 (this build speaks 2 only)
//! 6       8     sender: the incarnation of the sending process, little-endian u64
//! 14      ...   body: one `Frame` value in postcard 1.x encoding, nothing after it
//! ```
//!
//! The body's enum variants and field orders are those of [`Frame`] in this file: its
//! variant index is the first varint of the body. An actor message inside
//! [`Frame::Deliver`] is a byte string in its system's own encoding ([`WireMessage`]; the
//! pipeline's is `crate::pipeline::wire`), where activations and K/V are raw little-endian
//! bytes. A frame whose magic, version, sender or body is wrong is refused whole
//! ([`WireError`]); so is a frame larger than the run's limit, on both sides: the sender
//! refuses to encode it (naming the message), the receiver to decode it.

use serde::{Deserialize, Serialize};

use crate::actor::{ActorId, Message};
use crate::metrics::Report;

/// The magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"MSHW";
/// The version of the frame format and of every system's message encoding.
pub const VERSION: u16 = 6;
/// Bytes before the body.
pub const HEADER_BYTES: usize = 14;
/// Bytes of a frame besides an actor message it delivers: the header and [`Frame::Deliver`]'s
/// fields, generously.
pub const FRAME_OVERHEAD: u64 = 64;

/// What can be wrong with bytes on the wire, or with a message to put there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a meshsim frame (bad magic)")]
    Magic,
    #[error("frame version {0}; this meshsim speaks version {VERSION}")]
    Version(u16),
    #[error("a frame of {0} bytes, shorter than its header")]
    Short(usize),
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("{what}: {bytes} bytes, over the frame limit of {limit} bytes")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    #[error("cannot be sent: {0}")]
    Unsupported(String),
}

/// The messages of one system, as they cross processes.
pub trait WireMessage: Message + Sized {
    /// The system's name, checked when a run is set up.
    const SYSTEM: &'static str;
    /// Appends this message's encoding to `out`.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError>;
    /// Decodes one message that fills `bytes` exactly.
    fn decode(bytes: &[u8]) -> Result<Self, WireError>;
    /// The notice a host delivers to every actor when `actor` was lost with its process and
    /// has been placed again, if the system has one.
    fn lost(actor: ActorId) -> Option<Self>;
    /// The message in a few words, for errors (a frame over the limit names it).
    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

/// Serializes `v` with postcard onto the end of `out`.
pub fn postcard_into<T: Serialize>(v: &T, out: &mut Vec<u8>) -> Result<(), WireError> {
    let b = postcard::to_allocvec(v).map_err(|e| WireError::Unsupported(e.to_string()))?;
    out.extend_from_slice(&b);
    Ok(())
}

/// Deserializes one `T` that fills `bytes` exactly.
pub fn postcard_whole<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, WireError> {
    let (v, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} bytes after the message",
            rest.len()
        )));
    }
    Ok(v)
}

/// What one process tells another. See the module doc for the layout around it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Frame {
    /// Coordinator -> node: who are you? (`nonce` comes back in the answer).
    Hello { nonce: u64 },
    /// Node -> coordinator: this process's incarnation is the frame's sender; it listens at
    /// `listen`, accepts frames of at most `max_frame` bytes, and runs `busy_with`, if any.
    HelloAck {
        nonce: u64,
        listen: String,
        max_frame: u64,
        busy_with: Option<u64>,
    },
    /// Coordinator -> node: take part in run `run`.
    Setup(Setup),
    /// Node -> coordinator: the actors of `setup` are built (or why not).
    Ready {
        run: u64,
        node: u16,
        error: Option<String>,
    },
    /// Coordinator -> node: place (or place again) `actors` here: `(id, spec)`, a spec in
    /// the system's encoding (e.g. `crate::pipeline::build::ShardSpec`).
    Place { run: u64, actors: Vec<Placed> },
    /// Coordinator -> node: start the actors of the run (their `Actor::start`).
    Go { run: u64 },
    /// Any -> any: an actor message, from an actor on node `from_node`, to actor `to`.
    Deliver {
        run: u64,
        from_node: u16,
        to: u32,
        #[serde(with = "serde_bytes")]
        msg: Vec<u8>,
    },
    /// Coordinator -> node: actor `actor` now lives on node `node` (it was lost and placed
    /// again); node `dead` is gone.
    Relocate {
        run: u64,
        actor: u32,
        node: u16,
        dead: u16,
    },
    /// Coordinator -> node: report your message counts for termination wave `wave`.
    Poll { run: u64, wave: u64 },
    /// Node -> coordinator: the counts of `Poll`.
    Counts {
        run: u64,
        wave: u64,
        node: u16,
        counts: Counts,
    },
    /// Node -> coordinator: the run failed here (an actor panicked, broke an invariant, or
    /// a message could not be encoded).
    Failed { run: u64, node: u16, error: String },
    /// Coordinator -> node: send the report of your actors.
    ReportAsk { run: u64 },
    /// Node -> coordinator: the merged report of this node's actors, and its totals:
    /// messages, payload bytes, bytes fetched, bytes of frames sent, frames sent, bytes
    /// its actors read from other processes' memory ([`Frame::Read`]).
    ReportReply {
        run: u64,
        node: u16,
        report: Report,
        totals: [u64; 6],
        /// More parts of this report follow (a report is sent in parts that fit the frame
        /// limit; the totals come with the last).
        more: bool,
    },
    /// Any -> the process that holds the memory: a one-sided read (as an RDMA read: the
    /// holder's actors take no part), `key` in the system's encoding (a store tensor of the
    /// serving system). Answered with a [`Frame::ReadReply`] of the same `seq`.
    Read {
        run: u64,
        seq: u64,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// The answer to [`Frame::Read`]: the bytes read, or none if the memory holds no such
    /// thing.
    ReadReply {
        run: u64,
        seq: u64,
        #[serde(with = "serde_bytes")]
        data: Option<Vec<u8>>,
    },
    /// Coordinator -> node: the run is over; drop its actors.
    End { run: u64 },
}

/// One actor to place: its id and its spec in its system's encoding.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Placed {
    pub id: u32,
    #[serde(with = "serde_bytes")]
    pub spec: Vec<u8>,
}

/// A node's message counts, for the coordinator's termination detection (see
/// `super::cluster`): the four-counter method over waves.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages this node's actors sent (or set on a timer) to actors on this node, not yet
    /// handled.
    pub local_in_flight: u64,
    /// Messages handled here in all (any source): unchanged between two waves means idle.
    pub handled: u64,
    /// Per node: messages sent from here to an actor on that node.
    pub sent_to: Vec<u64>,
    /// Per node: messages from that node handled here.
    pub handled_from: Vec<u64>,
}

/// What a node needs to take part in a run.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Setup {
    pub run: u64,
    /// The system whose actors it hosts ([`WireMessage::SYSTEM`]).
    pub system: String,
    /// This node's index in `nodes`.
    pub node: u16,
    /// Every process of the run: index 0 is the coordinator; `(incarnation, address)`.
    pub nodes: Vec<(u64, String)>,
    /// The node of every actor, by actor id.
    pub home: Vec<u16>,
    /// Seed of the actors' random streams.
    pub seed: u64,
    /// Largest frame of the run, bytes.
    pub max_frame: u64,
    /// What every process of the run needs besides its actors' specs, in the system's
    /// encoding (the serving system's trace and model; empty for pipelines).
    #[serde(with = "serde_bytes")]
    pub shared: Vec<u8>,
}

/// Encodes `frame` from `sender`, refusing a frame over `limit` bytes.
pub fn encode_frame(sender: u64, frame: &Frame, limit: u64) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(HEADER_BYTES + 64);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&sender.to_le_bytes());
    postcard_into(frame, &mut out)?;
    if out.len() as u64 > limit {
        return Err(WireError::TooLarge {
            what: describe(frame),
            bytes: out.len() as u64,
            limit,
        });
    }
    Ok(out)
}

/// Decodes a frame: its sender's incarnation and its body. Frames over `limit` bytes are
/// refused before anything is decoded.
pub fn decode_frame(bytes: &[u8], limit: u64) -> Result<(u64, Frame), WireError> {
    if bytes.len() as u64 > limit {
        return Err(WireError::TooLarge {
            what: "a frame".into(),
            bytes: bytes.len() as u64,
            limit,
        });
    }
    if bytes.len() < HEADER_BYTES {
        return Err(WireError::Short(bytes.len()));
    }
    if bytes[..4] != MAGIC {
        return Err(WireError::Magic);
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&bytes[6..14]);
    let frame = postcard_whole(&bytes[HEADER_BYTES..])?;
    Ok((u64::from_le_bytes(s), frame))
}

fn describe(f: &Frame) -> String {
    match f {
        Frame::Deliver { to, msg, .. } => {
            format!("a message of {} bytes to actor {to}", msg.len())
        }
        Frame::ReportReply { node, .. } => format!("the report of node {node}"),
        Frame::Setup(s) => format!(
            "the setup of run {:016x} ({} bytes of run data)",
            s.run,
            s.shared.len()
        ),
        Frame::ReadReply { seq, data, .. } => format!(
            "the answer to read {seq} ({} bytes)",
            data.as_ref().map_or(0, |d| d.len())
        ),
        other => {
            let s = format!("{other:?}");
            s.chars().take(80).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn deliver() -> Frame {
        Frame::Deliver {
            run: 3,
            from_node: 1,
            to: 2,
            msg: vec![1, 2, 3, 250],
        }
    }

    #[test]
    fn frames_round_trip_and_carry_their_sender() {
        let frames = vec![
            Frame::Hello { nonce: 9 },
            Frame::HelloAck {
                nonce: 9,
                listen: "127.0.0.1:7001".into(),
                max_frame: 1 << 20,
                busy_with: None,
            },
            deliver(),
            Frame::Counts {
                run: 1,
                wave: 2,
                node: 1,
                counts: Counts {
                    local_in_flight: 0,
                    handled: 5,
                    sent_to: vec![1, 0, 2],
                    handled_from: vec![3, 0, 0],
                },
            },
            Frame::ReportReply {
                run: 1,
                node: 2,
                report: Report {
                    violations: vec!["x".into()],
                    failovers: 2,
                    ..Report::default()
                },
                totals: [1, 2, 3, 4, 5, 6],
                more: false,
            },
        ];
        for f in frames {
            let b = encode_frame(0xfeed, &f, 1 << 20).unwrap();
            assert_eq!(&b[..4], b"MSHW");
            let (sender, back) = decode_frame(&b, 1 << 20).unwrap();
            assert_eq!(sender, 0xfeed);
            assert_eq!(back, f);
        }
    }

    #[test]
    fn frames_over_the_limit_are_refused_on_both_sides_naming_them() {
        let f = Frame::Deliver {
            run: 1,
            from_node: 0,
            to: 7,
            msg: vec![0; 1000],
        };
        let e = encode_frame(1, &f, 500).unwrap_err();
        assert!(
            e.to_string().contains("actor 7") && e.to_string().contains("over the frame limit"),
            "{e}"
        );
        let b = encode_frame(1, &f, 2000).unwrap();
        assert!(matches!(
            decode_frame(&b, 500),
            Err(WireError::TooLarge { .. })
        ));
    }

    #[test]
    fn another_version_or_magic_is_refused() {
        let mut b = encode_frame(1, &deliver(), 1 << 20).unwrap();
        b[4] = 9;
        assert_eq!(decode_frame(&b, 1 << 20), Err(WireError::Version(9)));
        b[0] = b'X';
        assert_eq!(decode_frame(&b, 1 << 20), Err(WireError::Magic));
        assert_eq!(decode_frame(&b[..5], 1 << 20), Err(WireError::Short(5)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn arbitrary_bytes_never_panic_the_frame_decoder(
            body in proptest::collection::vec(any::<u8>(), 0..256), valid_header in any::<bool>()
        ) {
            let mut b = Vec::new();
            if valid_header {
                b.extend_from_slice(&MAGIC);
                b.extend_from_slice(&VERSION.to_le_bytes());
                b.extend_from_slice(&7u64.to_le_bytes());
            }
            b.extend_from_slice(&body);
            let _ = decode_frame(&b, 1 << 16);
        }

        #[test]
        fn damaged_frames_never_panic_the_frame_decoder(
            at in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()
        ) {
            let b = encode_frame(5, &Frame::Counts {
                run: 1, wave: 1, node: 0,
                counts: Counts { local_in_flight: 1, handled: 2, sent_to: vec![1, 2], handled_from: vec![3] },
            }, 1 << 16).unwrap();
            let mut d = b.clone();
            let i = at.index(d.len());
            d[i] ^= byte;
            let _ = decode_frame(&d, 1 << 16);
            let _ = decode_frame(&b[..cut.index(b.len())], 1 << 16);
        }
    }
}
