//! One-sided reads of another process's memory ([`Frame::Read`]), as an RDMA read is: the
//! reader's thread asks the holder's process and waits for the bytes; the holder's loop
//! answers from its run's shared state ([`System::read`]) without its actors taking part.
//!
//! A reader runs inside an actor's handler (a store load inside a serving instance's
//! backend), which the live host runs in `block_in_place` on a multi-threaded runtime, so it
//! may block: the process's loop goes on on another worker and hands the answer over. A read
//! of a process that is gone, or that does not answer within [`READ_TIMEOUT`], reads nothing
//! (the load fails and its tokens are recomputed, as after a lost source in the
//! simulation). At most [`MAX_PENDING`] reads wait at once in one process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::net::{ClusterOut, send_frame};
use crate::live::wire::Frame;

/// How long a read waits for its answer.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Reads that may wait at once in one process.
pub const MAX_PENDING: usize = 1024;

type Waiter = std::sync::mpsc::SyncSender<Option<Vec<u8>>>;

/// The reads of one process in one run.
pub struct Reads {
    out: Arc<ClusterOut>,
    next: AtomicU64,
    /// Waiting reads: seq -> (process asked, where the answer goes).
    pending: Mutex<HashMap<u64, (u16, Waiter)>>,
    /// Bytes of answers received, reads answered with bytes, and the payload bytes the
    /// system counted in them ([`Reads::payload`]).
    bytes: AtomicU64,
    reads: AtomicU64,
    payload: AtomicU64,
}

impl Reads {
    pub(super) fn new(out: Arc<ClusterOut>) -> Arc<Reads> {
        Arc::new(Reads {
            out,
            next: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            bytes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            payload: AtomicU64::new(0),
        })
    }

    /// This process's index in the run.
    pub fn me(&self) -> u16 {
        self.out.me
    }

    /// Reads `key` from process `process`'s memory, blocking until the answer comes: the
    /// bytes, or `None` (nothing there, the process gone or silent, or an error, which is
    /// logged).
    pub fn read(&self, process: u16, key: Vec<u8>) -> Option<Vec<u8>> {
        let agent = self
            .out
            .agents
            .read()
            .ok()
            .and_then(|a| a.get(process as usize).cloned().flatten())?;
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() >= MAX_PENDING {
                tracing::warn!("{MAX_PENDING} reads already wait: a read is refused");
                return None;
            }
            p.insert(seq, (process, tx));
        }
        let f = Frame::Read {
            run: self.out.run,
            seq,
            key,
        };
        if let Err(e) = send_frame(&agent, self.out.incarnation, &f, self.out.max_frame) {
            tracing::warn!("a read of process {process}: {e}");
            self.forget(seq);
            return None;
        }
        let got = rx.recv_timeout(READ_TIMEOUT).ok().flatten();
        self.forget(seq);
        if let Some(b) = &got {
            self.bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    fn forget(&self, seq: u64) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seq);
    }

    /// An answer came (from the process loop).
    pub(super) fn answer(&self, seq: u64, data: Option<Vec<u8>>) {
        let w = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seq);
        match w {
            Some((_, tx)) => {
                let _ = tx.try_send(data);
            }
            None => tracing::debug!("an answer to read {seq}, which no longer waits"),
        }
    }

    /// Process `process` is gone: its reads read nothing.
    pub(super) fn lost(&self, process: u16) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|_, (k, tx)| {
            if *k == process {
                let _ = tx.try_send(None);
                false
            } else {
                true
            }
        });
    }

    /// Bytes of the answers received so far (the payload, as the system encodes it).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Reads answered with bytes so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The system found `bytes` of payload in an answer (K/V bytes of a store tensor,
    /// without its header): what the run reports as read from other processes.
    pub fn payload(&self, bytes: u64) {
        self.payload.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn payload_bytes(&self) -> u64 {
        self.payload.load(Ordering::Relaxed)
    }
}
