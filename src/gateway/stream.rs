//! RDMA transfers in chunks: a GET's bytes WRITTEN to the client as the
//! backend produces them, a PUT's bytes READ from the client and handed to
//! the backend as they arrive, through a few registered buffers of the
//! memory budget (`--rdma-chunk-bytes` each, at most `--rdma-chunks` per
//! transfer), never the whole object at once.
//!
//! Each transfer has one thread of the blocking pool that owns its
//! [`Session`](crate::server::Session) from the proof to the final message
//! ([`write_chunks`], [`read_chunks`]); the request's handler, on the async
//! side, feeds it (GET: the backend's bytes into free buffers) or drains it
//! (PUT: the chunks, as the body the backend stores). The two meet through
//! channels, and a buffer is reused only once the NIC is done with it: a
//! WRITE or READ has completed, or its flush has, else it is leaked.
//!
//! A PUT's last chunk is handed to the backend only after the final message
//! went out and the bytes' checksum matched the client's: a failure or a
//! mismatch ends the body with an error instead, so the backend never sees
//! a complete object and stores nothing.

use std::sync::mpsc as sync_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use s3s::checksum::ChecksumHasher;
use s3s::dto::Checksum;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::StdError;
use tokio::sync::mpsc;

use super::rdma::{Failure, Label, Pinned, Rdma, RegBuf, TakeError, MIN_CHUNKS};
use crate::core::token::Token;
use crate::server::TransferFailure;

/// What a GET's handler hands its writer.
pub enum Chunk {
    /// `len` bytes at the start of `buf`, for the client's range at
    /// `offset`.
    Data {
        /// The registered buffer.
        buf: RegBuf,
        /// Where they go in the client's range.
        offset: u64,
        /// How many.
        len: usize,
    },
    /// `len` bytes at `at` of memory registered where it is kept (a
    /// cached object's), for the client's range at `offset`: no copy.
    Pinned {
        /// The registered bytes.
        pinned: Arc<Pinned>,
        /// Where the chunk starts in them.
        at: usize,
        /// Where they go in the client's range.
        offset: u64,
        /// How many.
        len: usize,
    },
    /// The transfer's last `len` bytes at the start of `buf`, for the
    /// client's range at `offset`, their verdict given: WRITTEN with the
    /// final message right behind them, in one post and one wait
    /// ([`Session::write_and_finish`](crate::server::Session::write_and_finish)).
    /// Nothing comes after.
    Last {
        /// The registered buffer.
        buf: RegBuf,
        /// Where they go in the client's range.
        offset: u64,
        /// How many.
        len: usize,
    },
    /// Every byte was handed over: the final message may go.
    Done,
}

/// What holds a chunk's bytes while they are WRITTEN.
enum Holder {
    /// A buffer of the budget, handed back after.
    Buf(RegBuf),
    /// Kept bytes, registered where they lie.
    Pinned(Arc<Pinned>),
}

/// Where a GET's writer gets its chunks, and where the buffers it WROTE
/// go.
pub trait Supply {
    /// The next chunk, within `wait` (the backend's time). `Disconnected`:
    /// no more will come (the backend's bytes failed, or the request went
    /// away).
    fn next(&mut self, wait: Duration) -> Result<Chunk, sync_mpsc::RecvTimeoutError>;
    /// `buf`, WRITTEN: the NIC is done with it.
    fn written(&mut self, buf: RegBuf);
}

/// The handler's side of a GET in several chunks, on the async side: the
/// chunks come through `chunks` as the handler fills them, and each buffer
/// WRITTEN goes back through `free` to be filled again (to the pool once
/// the handler stopped taking them).
pub struct Handed<'a> {
    /// The chunks, filled.
    pub chunks: &'a sync_mpsc::Receiver<Chunk>,
    /// The buffers, WRITTEN.
    pub free: &'a mpsc::UnboundedSender<RegBuf>,
    /// The pool.
    pub rdma: &'a Rdma,
}

impl Supply for Handed<'_> {
    fn next(&mut self, wait: Duration) -> Result<Chunk, sync_mpsc::RecvTimeoutError> {
        self.chunks.recv_timeout(wait)
    }

    fn written(&mut self, buf: RegBuf) {
        if let Err(back) = self.free.send(buf) {
            self.rdma.give_back(back.0);
        }
    }
}

/// The GET's writer, on a blocking thread: proves the token, WRITEs each
/// chunk as it comes from `supply` (handing its buffer back), and after
/// [`Chunk::Done`] with exactly `len` bytes written, sends the final
/// message. No more chunks before `Done` (the backend's bytes failed, or
/// the request went away) ends the transfer without the final message:
/// the client fails it.
pub fn write_chunks(
    rdma: &Rdma,
    token: &Token,
    len: u64,
    label: &Label<'_>,
    supply: &mut dyn Supply,
) -> Result<(), Failure> {
    let start = Instant::now();
    let outcome = (|| {
        let mut session = rdma.begin(token, label, start + rdma.timeout())?;
        let proven = session.proven();
        let mut written = 0u64;
        loop {
            // What to WRITE, and what holds its bytes meanwhile. The
            // backend's next chunk gets the backend's time: a store that
            // pauses is not a client that stopped.
            let (held, at, offset, n, last) = match supply.next(rdma.backend_timeout()) {
                Ok(Chunk::Data { buf, offset, len }) => (Holder::Buf(buf), 0, offset, len, false),
                Ok(Chunk::Pinned {
                    pinned,
                    at,
                    offset,
                    len,
                }) => (Holder::Pinned(pinned), at, offset, len, false),
                Ok(Chunk::Last {
                    buf,
                    offset,
                    len: n,
                }) if written + n as u64 == len => (Holder::Buf(buf), 0, offset, n, true),
                Ok(Chunk::Last { buf, len: n, .. }) => {
                    supply.written(buf);
                    return Err(TransferFailure::quiet(crate::core::Error::Internal(
                        format!("{} bytes handed over of {len}", written + n as u64),
                    )));
                }
                // Not behind the last chunk's WRITEs
                // (`Session::write_and_finish`): the verdict on the
                // object's checksum comes after its last chunk, and a
                // corrupt object must end without the final message.
                Ok(Chunk::Done) if written == len => {
                    session.set_deadline(Instant::now() + rdma.timeout());
                    return session.finish().map(|()| proven);
                }
                Ok(Chunk::Done) => {
                    return Err(TransferFailure::quiet(crate::core::Error::Internal(
                        format!("{written} bytes written of {len}"),
                    )))
                }
                Err(sync_mpsc::RecvTimeoutError::Timeout) => {
                    return Err(TransferFailure::quiet(crate::core::Error::Rdma(format!(
                        "the backend gave none of the object's next bytes within {} ms",
                        rdma.backend_timeout().as_millis()
                    ))))
                }
                Err(sync_mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(TransferFailure::quiet(crate::core::Error::Rdma(
                        "the object's bytes stopped coming from the backend".into(),
                    )))
                }
            };
            let local = match &held {
                Holder::Buf(buf) => buf.local(),
                Holder::Pinned(pinned) => pinned.local(),
            };
            // Each chunk has the whole RDMA timeout: a long object fails
            // only where it stops moving.
            session.set_deadline(Instant::now() + rdma.timeout());
            let first = written == 0;
            if last {
                let wrote = session.write_and_finish(&local, at as u64, offset, n as u64);
                return settle(rdma, supply, label, first, held, wrote).map(|()| proven);
            }
            let wrote = session.write(&local, at as u64, offset, n as u64);
            settle(rdma, supply, label, first, held, wrote)?;
            written += n as u64;
        }
    })();
    rdma.ended(token, label, len, start, outcome)
}

/// After a chunk's WRITE (`wrote`): on failure, what held its bytes let
/// go as far as the NIC allows; else the first byte's time (for the
/// `first` chunk) recorded, and a buffer of the budget handed back for the
/// next chunk.
fn settle(
    rdma: &Rdma,
    supply: &mut dyn Supply,
    label: &Label<'_>,
    first: bool,
    held: Holder,
    wrote: Result<(), TransferFailure>,
) -> Result<(), TransferFailure> {
    if let Err(failure) = wrote {
        match held {
            Holder::Buf(buf) => rdma.release(buf, failure.local_quiet),
            Holder::Pinned(pinned) if !failure.local_quiet => {
                // The NIC may still read them: never deregistered, never
                // freed.
                eprintln!(
                    "hipobj-s3-server: a cached object's {} registered bytes are leaked (the \
                     NIC may still use them)",
                    pinned.len()
                );
                std::mem::forget(pinned);
            }
            Holder::Pinned(_) => {}
        }
        return Err(failure);
    }
    if first {
        crate::gateway::metrics::rdma_first_byte(label.arrived.elapsed().as_secs_f64());
    }
    if let Holder::Buf(buf) = held {
        supply.written(buf);
    }
    Ok(())
}

/// A PUT's body: the chunks [`read_chunks`] READ, as they come. Its length
/// is known from the start (the token's), as backends that stream it on
/// want.
pub struct ChunkStream {
    rx: mpsc::Receiver<Result<Bytes, StdError>>,
    remaining: usize,
}

impl ChunkStream {
    /// A body of `len` bytes fed through a channel of `depth` chunks;
    /// [`read_chunks`] gets the sender.
    pub fn new(len: usize, depth: usize) -> (mpsc::Sender<Result<Bytes, StdError>>, ChunkStream) {
        let (tx, rx) = mpsc::channel(depth.max(1));
        (tx, ChunkStream { rx, remaining: len })
    }
}

impl futures::Stream for ChunkStream {
    type Item = Result<Bytes, StdError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let next = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(Ok(bytes))) = &next {
            self.remaining = self.remaining.saturating_sub(bytes.len());
        }
        next
    }
}

impl ByteStream for ChunkStream {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(self.remaining)
    }
}

/// Why a PUT's READs ended without a complete body.
pub enum ReadFailure {
    /// The transfer failed (or was refused).
    Transfer(Failure),
    /// The bytes' checksum is not the one the client declared (400
    /// BadDigest).
    Digest(String),
    /// No buffer for a chunk: declined (501), no room (503) or failed.
    NoBuffer(TakeError),
    /// The backend stopped taking the body (it answered already: its
    /// answer is the request's), with the transfer's log line if its bytes
    /// had all been read.
    BackendGone(String),
}

/// How a PUT's READs stopped early.
enum Stop {
    Failed(TransferFailure),
    NoBuffer(TakeError),
}

impl From<TransferFailure> for Stop {
    fn from(failure: TransferFailure) -> Stop {
        Stop::Failed(failure)
    }
}

/// The checksums a client declared for a PUT's bytes, and the hasher that
/// checks them.
pub struct Declared {
    /// What the client sent (`x-amz-checksum-*`).
    pub expected: Checksum,
}

impl Declared {
    /// A hasher for every algorithm the client declared, and CRC64/NVME
    /// always (the object's checksum the backend is given).
    fn hasher(&self) -> ChecksumHasher {
        let e = &self.expected;
        ChecksumHasher {
            crc32: e.checksum_crc32.as_ref().map(|_| Default::default()),
            crc32c: e.checksum_crc32c.as_ref().map(|_| Default::default()),
            sha1: e.checksum_sha1.as_ref().map(|_| Default::default()),
            sha256: e.checksum_sha256.as_ref().map(|_| Default::default()),
            crc64nvme: Some(Default::default()),
        }
    }

    /// The first declared checksum that `got` contradicts, as a message.
    pub fn mismatch(&self, got: &Checksum) -> Option<String> {
        let e = &self.expected;
        let pairs = [
            ("CRC64NVME", &e.checksum_crc64nvme, &got.checksum_crc64nvme),
            ("CRC32C", &e.checksum_crc32c, &got.checksum_crc32c),
            ("CRC32", &e.checksum_crc32, &got.checksum_crc32),
            ("SHA1", &e.checksum_sha1, &got.checksum_sha1),
            ("SHA256", &e.checksum_sha256, &got.checksum_sha256),
        ];
        pairs
            .into_iter()
            .find_map(|(name, want, got)| match (want, got) {
                (Some(want), Some(got)) if want != got => Some(format!(
                    "the {name} of the bytes read by RDMA is {got}, the request's \
                 x-amz-checksum-{} says {want}",
                    name.to_ascii_lowercase()
                )),
                _ => None,
            })
    }
}

/// The PUT's reader, on a blocking thread: proves the token, READs the
/// token's range in chunks of at most `chunk` bytes into buffers of the
/// budget (at most `depth` of them held at once, by the body and the
/// backend), hands each to `body` as it completes but the last, sends the
/// final message, checks the bytes against `declared`, and only then hands
/// the last chunk over. Returns the checksums of the bytes read, and the
/// transfer's log line for the caller to finish with the backend's
/// answer (a failure is logged here).
pub fn read_chunks(
    rdma: &Arc<Rdma>,
    token: &Token,
    label: &Label<'_>,
    chunk: usize,
    depth: usize,
    declared: &Declared,
    body: &mpsc::Sender<Result<Bytes, StdError>>,
) -> Result<(Checksum, String), ReadFailure> {
    let len = token.length;
    let start = Instant::now();
    let (back_tx, back_rx) = sync_mpsc::channel::<RegBuf>();
    let mut hasher = declared.hasher();
    let mut last: Option<Bytes> = None;
    let mut gone = false;
    let outcome = (|| {
        // The transfer's whole share of the budget, before anything else
        // (the proof holds a connection): never part of it while waiting
        // for more.
        let chunks = usize::try_from(len.div_ceil(chunk as u64)).unwrap_or(usize::MAX);
        let size = chunk.min(usize::try_from(len).unwrap_or(chunk));
        let mut window = rdma
            .reserve(size, chunks.min(depth), chunks.min(MIN_CHUNKS))
            .map_err(Stop::NoBuffer)?;
        let mut session = rdma
            .begin(token, label, start + rdma.timeout())
            .map_err(Stop::from)?;
        let proven = session.proven();
        let mut offset = 0u64;
        while offset < len {
            let n = usize::try_from((len - offset).min(chunk as u64)).unwrap_or(chunk);
            // A buffer: one the backend let go of, a new one of the window
            // while it has room, else wait for one to come back.
            let buf = match back_rx.try_recv() {
                Ok(buf) => buf,
                Err(_) if window.left() > 0 => rdma.take(&mut window).map_err(Stop::NoBuffer)?,
                // The backend holds them all: it gets the backend's time
                // to take one (a store that pauses is not a client that
                // stopped).
                Err(_) => back_rx.recv_timeout(rdma.backend_timeout()).map_err(|_| {
                    TransferFailure::quiet(crate::core::Error::Rdma(format!(
                        "the backend took none of the bytes held for it within {} ms",
                        rdma.backend_timeout().as_millis()
                    )))
                })?,
            };
            // Each chunk has the whole RDMA timeout: a long object fails
            // only where it stops moving.
            session.set_deadline(Instant::now() + rdma.timeout());
            if let Err(failure) = session.read(&buf.local(), 0, offset, n as u64) {
                rdma.release(buf, failure.local_quiet);
                return Err(failure.into());
            }
            hasher.update(&buf.bytes()[..n]);
            let bytes = Bytes::from_owner(Lent {
                buf: Some(buf),
                home: back_tx.clone(),
                rdma: Arc::clone(rdma),
                len: n,
            });
            offset += n as u64;
            if let Some(previous) = last.replace(bytes) {
                if body.blocking_send(Ok(previous)).is_err() {
                    gone = true;
                    return Err(TransferFailure::quiet(crate::core::Error::Rdma(
                        "the backend stopped taking the bytes".into(),
                    ))
                    .into());
                }
            }
        }
        session.finish().map(|()| proven).map_err(Stop::from)
    })();
    // Buffers the backend lets go of from now on go back to the pool
    // directly.
    while let Ok(buf) = back_rx.try_recv() {
        rdma.give_back(buf);
    }
    drop(back_rx);
    let outcome = match outcome {
        Ok(proven) => Ok(proven),
        Err(Stop::Failed(failure)) => Err(failure),
        Err(Stop::NoBuffer(e)) => {
            let _ = body.blocking_send(Err(e.to_string().into()));
            return Err(ReadFailure::NoBuffer(e));
        }
    };
    let line = match rdma.moved(token, label, len, start, outcome) {
        Ok(line) => line,
        Err(failure) => {
            let why = failure.to_string();
            let _ = body.blocking_send(Err(why.into()));
            return Err(if gone {
                ReadFailure::BackendGone(String::new())
            } else {
                ReadFailure::Transfer(failure)
            });
        }
    };
    let got = hasher.finalize();
    if let Some(why) = declared.mismatch(&got) {
        eprintln!("hipobj-s3-server: {line}, but {why}: nothing stored");
        let _ = body.blocking_send(Err(why.clone().into()));
        return Err(ReadFailure::Digest(why));
    }
    if let Some(last) = last {
        if body.blocking_send(Ok(last)).is_err() {
            return Err(ReadFailure::BackendGone(line));
        }
    }
    Ok((got, line))
}

/// A chunk of a PUT's bytes in its registered buffer, lent to the backend;
/// the buffer goes back to its transfer's reader (or, once that is done,
/// is freed with its share of the budget) when the backend lets go of it.
struct Lent {
    buf: Option<RegBuf>,
    home: sync_mpsc::Sender<RegBuf>,
    rdma: Arc<Rdma>,
    len: usize,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf
            .as_ref()
            .map_or(&[], |buf| &buf.bytes()[..self.len])
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // To the reader for the next chunk, or, once it is done, to the
            // pool (and its charge to the budget).
            if let Err(back) = self.home.send(buf) {
                self.rdma.give_back(back.0);
            }
        }
    }
}
