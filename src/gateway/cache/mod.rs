//! The gateway's read-through cache (`--cache-bytes`, in front of an
//! `--upstream` store): whole objects kept in memory, so that N readers of
//! one object cost the store one read, and a hot object is served at the
//! gateway's own speed.
//!
//! - **What is kept**: whole objects of at most `--cache-max-object-bytes`,
//!   each one contiguous buffer, with what a GET's answer says of it (its
//!   ETag, length, content headers, metadata) and the CRC64/NVME of its
//!   bytes, computed as they came in.
//! - **Eviction** is quick_cache's S3-FIFO: an object enters a small
//!   probation queue and reaches the main one only when read again while
//!   there, so one large sequential read (a scan, an epoch over a dataset
//!   larger than the cache) churns probation and leaves a hot model in
//!   place. The weights are the objects' bytes; the capacity
//!   `--cache-bytes`, in one shard (a shard's capacity bounds its largest
//!   entry).
//! - **A miss** starts one fill: one whole-object GET to the store, in a
//!   task of its own, whose bytes are kept as they come. Every GET of the
//!   object while it runs (a range too) joins it and is served from those
//!   bytes as they arrive: coalesced, the store sees one GET. An object
//!   larger than the cache takes, or than the room fills in progress leave
//!   (half the capacity), is not kept: its readers each go to the store.
//! - **Validation** (`--cache-validate`): `always` asks the store for the
//!   object's ETag (HeadObject) before each hit is served, so that a hit
//!   is never older than the store's object, at one small request a hit;
//!   `ttl=N` trusts an entry for N seconds after it was filled or last
//!   validated, serving HEADs from it too, so that a hit costs the store
//!   nothing and survives a store that is down, at the price of serving
//!   for up to N seconds an object that changed behind the gateway (not a
//!   change through it: below). An ETag that differs, or an object gone,
//!   drops the entry.
//! - **Invalidation**: a PutObject, CompleteMultipartUpload, CopyObject (its
//!   destination), DeleteObject or DeleteObjects through the gateway drops
//!   the key's entry before the request goes to the store and again once
//!   it answered, and bumps the key's generation both times: a fill that
//!   began before the second bump keeps its bytes from the cache (its
//!   readers still get them: they asked before the write was done).
//! - **Checksums**: a fill asks the store for its stored checksum; where it
//!   has a whole-object CRC64/NVME, the bytes must match it or the fill
//!   fails (its readers get an error, nothing is kept). Hits carry the
//!   CRC64/NVME of the kept bytes when asked (`x-amz-checksum-mode`).
//!
//! The states of an entry and of a fill, and their transitions, are drawn
//! in `docs/architecture.md`, "The gateway's cache".

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, StdError};
use tokio::sync::watch;

use super::backend::{delegate_s3, sibling, Backend};
use super::checksum::Stored;
use super::metrics;
use super::rdma::{Held, Pinned, Room};
use super::stream::ChunkStream;

mod disk;
use disk::Disk;
pub use disk::DiskSettings;

/// How many generation counters keys are spread over: two keys sharing
/// one only cost a fill its place in the cache now and then.
const GENERATIONS: u64 = 4096;
/// How many pieces of a fill a reader may have queued for its client.
const READER_DEPTH: usize = 8;

/// When an entry is asked the store whether it still holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validate {
    /// Before every hit (HeadObject).
    Always,
    /// Once it is older than this since it was filled or last validated.
    Ttl(Duration),
}

impl Validate {
    /// `always` or `ttl=SECONDS`.
    pub fn parse(text: &str) -> Result<Validate, String> {
        if text == "always" {
            return Ok(Validate::Always);
        }
        match text.strip_prefix("ttl=").map(str::parse::<u64>) {
            Some(Ok(seconds)) => Ok(Validate::Ttl(Duration::from_secs(seconds))),
            _ => Err(format!(
                "--cache-validate {text}: expected always or ttl=SECONDS"
            )),
        }
    }
}

/// `--cache-bytes`, `--cache-max-object-bytes`, `--cache-validate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The bytes of the objects kept, at most.
    pub bytes: u64,
    /// The largest object kept.
    pub max_object_bytes: u64,
    /// When an entry is validated.
    pub validate: Validate,
    /// The disk tier, if any.
    pub disk: Option<DiskSettings>,
}

/// An object's bucket and key.
type Key = (String, String);

/// A GET's or a HEAD's answer (`$output`) from the [`Head`] `$head`: its
/// `$length` bytes, the CRC64/NVME `$crc` of the whole object when given,
/// the object's own headers, and the answer's own `{ field: value }`. The
/// one list of the headers a kept object answers with.
macro_rules! answer {
    ($output:ident, $head:expr, $length:expr, $crc:expr, { $($field:ident: $value:expr),* $(,)? }) => {{
        let head: &Head = $head;
        let crc: Option<&str> = $crc;
        $output {
            accept_ranges: Some("bytes".to_owned()),
            content_length: i64::try_from($length).ok(),
            e_tag: head.e_tag.clone(),
            last_modified: head.last_modified.clone(),
            content_type: head.content_type.clone(),
            content_encoding: head.content_encoding.clone(),
            content_disposition: head.content_disposition.clone(),
            content_language: head.content_language.clone(),
            cache_control: head.cache_control.clone(),
            expires: head.expires.clone(),
            metadata: head.metadata.clone(),
            storage_class: head.storage_class.clone(),
            checksum_type: crc.map(|_| ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
            checksum_crc64nvme: crc.map(str::to_owned),
            $($field: $value,)*
            ..$output::default()
        }
    }};
}

/// What a GET's answer says of an object besides its bytes.
struct Head {
    len: u64,
    e_tag: Option<ETag>,
    last_modified: Option<Timestamp>,
    content_type: Option<ContentType>,
    content_encoding: Option<ContentEncoding>,
    content_disposition: Option<ContentDisposition>,
    content_language: Option<ContentLanguage>,
    cache_control: Option<CacheControl>,
    expires: Option<Expires>,
    metadata: Option<Metadata>,
    storage_class: Option<StorageClass>,
    /// The store's checksum of the whole object that its bytes are
    /// checked against when they are filled (of any of S3's algorithms),
    /// when it gave one.
    stored: Option<Stored>,
}

impl Head {
    fn of(output: &GetObjectOutput, len: u64) -> Head {
        Head {
            len,
            e_tag: output.e_tag.clone(),
            last_modified: output.last_modified.clone(),
            content_type: output.content_type.clone(),
            content_encoding: output.content_encoding.clone(),
            content_disposition: output.content_disposition.clone(),
            content_language: output.content_language.clone(),
            cache_control: output.cache_control.clone(),
            expires: output.expires.clone(),
            metadata: output.metadata.clone(),
            storage_class: output.storage_class.clone(),
            stored: Stored::of(output, true),
        }
    }

    /// A GET's answer for the bytes `span` of `body`: the object's headers,
    /// its Content-Range when `span` is a range, and the CRC64/NVME `crc`
    /// of the whole object when asked.
    fn answer(
        &self,
        span: Option<std::ops::Range<u64>>,
        crc: Option<&str>,
        body: StreamingBlob,
    ) -> GetObjectOutput {
        let (length, content_range, checksum) = match span {
            Some(r) => (
                r.end - r.start,
                Some(format!(
                    "bytes {}-{}/{}",
                    r.start,
                    r.end.saturating_sub(1),
                    self.len
                )),
                None,
            ),
            None => (self.len, None, crc.map(str::to_owned)),
        };
        answer!(GetObjectOutput, self, length, checksum.as_deref(), {
            body: Some(body),
            content_range: content_range,
        })
    }

    /// A HEAD's answer, as [`Head::answer`] for the whole object.
    fn head_answer(&self, crc: Option<&str>) -> HeadObjectOutput {
        answer!(HeadObjectOutput, self, self.len, crc, {})
    }

    /// The bytes `range` selects of the object, `None` for all of it; 416
    /// when it selects none.
    fn span(&self, range: Option<Range>) -> S3Result<Option<std::ops::Range<u64>>> {
        range
            .map(|range| {
                range.check(self.len).map_err(|_| {
                    let mut e = s3_error!(InvalidRange, "the range is not satisfiable");
                    e.set_status_code(http::StatusCode::RANGE_NOT_SATISFIABLE);
                    e
                })
            })
            .transpose()
    }

    fn same_version(&self, e_tag: Option<&ETag>) -> bool {
        matches!((&self.e_tag, e_tag), (Some(a), Some(b)) if a.value() == b.value())
    }
}

/// An object kept.
struct Entry {
    head: Arc<Head>,
    bytes: Bytes,
    /// The CRC64/NVME of `bytes`, base64 as S3 sends it.
    crc64nvme: String,
    /// When it was filled or last found to hold.
    checked: Mutex<Option<Instant>>,
    /// `bytes` registered with the RDMA device, once a first RDMA GET of
    /// the entry asked ([`Kept`]); deregistered when the entry is dropped
    /// and no GET reads it any more.
    pinned: Arc<OnceLock<Arc<Pinned>>>,
}

/// A hit's bytes, in the extensions of its answer, for the gateway's RDMA
/// GET to WRITE from where they are kept ([`Pinned`]) instead of copying
/// them into the transfer's buffers.
#[derive(Clone)]
pub struct Kept {
    /// The whole object's bytes.
    pub bytes: Bytes,
    /// Where the answer's bytes start in them.
    pub first: u64,
    /// The entry's registration, made by the first RDMA GET that asks.
    pub pinned: Arc<OnceLock<Arc<Pinned>>>,
}

/// The cache's weights: an entry's bytes (at least 1: an empty object is
/// an entry too).
#[derive(Clone)]
struct Weigh;

impl quick_cache::Weighter<Key, Arc<Entry>> for Weigh {
    fn weight(&self, _key: &Key, entry: &Arc<Entry>) -> u64 {
        (entry.bytes.len() as u64).max(1)
    }
}

/// Counts the entries evicted.
#[derive(Clone, Default)]
struct Evictions;

impl quick_cache::Lifecycle<Key, Arc<Entry>> for Evictions {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), _key: Key, _entry: Arc<Entry>) {
        metrics::cache_evicted();
    }
}

/// Where a fill is.
#[derive(Clone)]
enum Stage {
    /// Waiting for the store's answer.
    Asked,
    /// Its bytes are coming in.
    Streaming,
    /// All of them came and matched.
    Done,
    /// The store's answer was an error, or its bytes failed (short, a
    /// checksum that does not match, the store stopped sending).
    Failed(String),
    /// The object is not kept (too large, no room, no length): each
    /// reader asks the store itself.
    Passed,
}

/// A fill's progress, watched by its readers.
#[derive(Clone)]
struct Progress {
    head: Option<Arc<Head>>,
    received: u64,
    stage: Stage,
}

/// One whole-object GET to the store whose bytes are kept as they come,
/// for every reader of the object meanwhile and then for the cache.
struct Fill {
    progress: watch::Sender<Progress>,
    /// The bytes so far: each piece with its offset in the object.
    pieces: Mutex<Vec<(u64, Bytes)>>,
    /// The store's error answer, when that is how it ended.
    error: Mutex<Option<S3Error>>,
    /// The store's answer to a fill that keeps nothing ([`Stage::Passed`]),
    /// for the first reader it serves as it came (a GET of the whole
    /// object): that reader costs the store no second GET.
    passed: Mutex<Option<S3Response<GetObjectOutput>>>,
}

impl Fill {
    /// The bytes `[from, to)` received so far, as pieces (no copies).
    fn slices(&self, from: u64, to: u64) -> Vec<Bytes> {
        let pieces = lock(&self.pieces);
        let start = pieces.partition_point(|(offset, piece)| offset + piece.len() as u64 <= from);
        let mut out = Vec::new();
        for (offset, piece) in &pieces[start..] {
            if *offset >= to {
                break;
            }
            let a = index(from.saturating_sub(*offset));
            let b = index(to - offset).min(piece.len());
            if a < b {
                out.push(piece.slice(a..b));
            }
        }
        out
    }
}

/// The cache's state, shared with the fills' tasks.
struct Store {
    settings: Settings,
    entries: quick_cache::sync::Cache<
        Key,
        Arc<Entry>,
        Weigh,
        quick_cache::DefaultHashBuilder,
        Evictions,
    >,
    fills: Mutex<HashMap<Key, Arc<Fill>>>,
    /// The bytes fills in progress have taken.
    filling: AtomicU64,
    /// Per stripe of keys, bumped by each write through the gateway; a
    /// fill is kept only if its key's did not move since it began. Held
    /// while an entry is kept, so that a write's invalidation comes before
    /// or after it, whole.
    generations: Box<[Mutex<u64>]>,
    disk: Option<Disk>,
    /// The RDMA memory budget, which the entries and fills are charged to
    /// when the gateway has one.
    room: Option<Room>,
}

impl Store {
    fn generation(&self, key: &Key) -> std::sync::MutexGuard<'_, u64> {
        use std::hash::{Hash, Hasher};
        // A fixed hasher: the same key must reach the same counter.
        let mut fixed = std::hash::DefaultHasher::new();
        key.hash(&mut fixed);
        lock(&self.generations[index(fixed.finish() % GENERATIONS)])
    }

    /// Drops what is known of `key`: its entry, its file, and the fill in
    /// progress for new readers (its own go on).
    fn invalidate(&self, key: &Key) {
        {
            let mut generation = self.generation(key);
            *generation += 1;
            if self.entries.remove(key).is_some() {
                metrics::cache_invalidated();
                self.gauge();
            }
            if let Some(disk) = &self.disk {
                disk.remove(key);
            }
        }
        lock(&self.fills).remove(key);
    }

    /// Keeps `entry` for `key` unless a write moved the key's generation
    /// since `generation`; then, on a disk tier, writes its file (in the
    /// background) and keeps that on the same terms.
    fn keep(self: &Arc<Self>, key: Key, generation: u64, entry: Arc<Entry>, source: Source) {
        {
            let now = self.generation(&key);
            if *now != generation {
                return;
            }
            self.entries.insert(key.clone(), Arc::clone(&entry));
        }
        if self.disk.is_none() || source == Source::Disk {
            return;
        }
        let store = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let Some(disk) = &store.disk else { return };
            match disk.write(&key, &entry.head, &entry.crc64nvme, &entry.bytes) {
                Ok(path) => {
                    let now = store.generation(&key);
                    if *now == generation {
                        disk.commit(key, path, Arc::clone(&entry.head), entry.crc64nvme.clone());
                    } else {
                        drop(now);
                        let _ = std::fs::remove_file(path);
                    }
                }
                Err(e) => eprintln!(
                    "hipobj-s3-server: cache: writing {}/{} to the disk: {e}",
                    key.0, key.1
                ),
            }
        });
    }

    /// Takes `len` bytes for a fill, if fills in progress leave room
    /// (half the capacity in all), and their share of the RDMA memory
    /// budget, if the gateway has one and it has room now (transfers
    /// first: a fill never waits for it). Why not (the outcome counted),
    /// with nothing taken.
    fn reserve(&self, len: u64) -> Result<Option<Held>, &'static str> {
        if len > self.settings.max_object_bytes || len > self.settings.bytes {
            return Err("too_large");
        }
        let limit =
            (self.settings.bytes / 2).max(self.settings.max_object_bytes.min(self.settings.bytes));
        self.filling
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + len <= limit).then_some(held + len)
            })
            .map_err(|_| "too_large")?;
        match &self.room {
            None => Ok(None),
            Some(room) => room.hold(len).map(Some).ok_or_else(|| {
                self.filling.fetch_sub(len, Ordering::AcqRel);
                "no_memory"
            }),
        }
    }

    fn bytes_in_use(&self) -> u64 {
        self.entries.weight() + self.filling.load(Ordering::Acquire)
    }

    /// The in-use gauge, now.
    fn gauge(&self) {
        metrics::cache_in_use(self.bytes_in_use(), self.settings.bytes);
    }
}

/// A backend with the cache in front of its GETs.
pub struct Cached {
    inner: Arc<dyn Backend>,
    store: Arc<Store>,
}

impl Cached {
    /// The cache of `settings` in front of `inner`, its bytes charged to
    /// `room` (the gateway's RDMA memory budget) when given: then
    /// `--cache-bytes` must leave one transfer's room in it.
    pub fn new(
        inner: Arc<dyn Backend>,
        settings: Settings,
        room: Option<Room>,
    ) -> Result<Cached, String> {
        if let Some(room) = &room {
            let need = settings.bytes.saturating_add(room.floor());
            if need > room.limit() {
                return Err(format!(
                    "--cache-bytes {} must leave one transfer's room ({} bytes: --rdma-chunks \
                     buffers of --rdma-chunk-bytes) in --rdma-memory-bytes {}, which holds the \
                     cache too: raise --rdma-memory-bytes to {need} or more, or lower --cache-bytes",
                    settings.bytes,
                    room.floor(),
                    room.limit()
                ));
            }
        }
        let disk = match &settings.disk {
            Some(d) => Some(
                Disk::open(d.clone())
                    .map_err(|e| format!("--cache-dir {}: {e}", d.dir.display()))?,
            ),
            None => None,
        };
        let options = quick_cache::OptionsBuilder::new()
            .shards(1)
            .weight_capacity(settings.bytes)
            .estimated_items_capacity(1024)
            .build()
            .expect("the cache's options are valid");
        let entries = quick_cache::sync::Cache::with_options(
            options,
            Weigh,
            quick_cache::DefaultHashBuilder::default(),
            Evictions,
        );
        metrics::cache_in_use(0, settings.bytes);
        Ok(Cached {
            inner,
            store: Arc::new(Store {
                settings,
                entries,
                fills: Mutex::new(HashMap::new()),
                filling: AtomicU64::new(0),
                generations: (0..GENERATIONS).map(|_| Mutex::new(0)).collect(),
                disk,
                room,
            }),
        })
    }

    /// `store` with the cache `settings` ask for in front, or as it is;
    /// why not, when its directory cannot be used.
    pub fn over(
        store: Arc<dyn Backend>,
        settings: Option<&Settings>,
        room: Option<Room>,
    ) -> Result<Arc<dyn Backend>, String> {
        Ok(match settings {
            Some(settings) => Arc::new(Cached::new(store, settings.clone(), room)?),
            None => store,
        })
    }

    /// The bytes the cache holds now (entries and fills in progress).
    pub fn bytes_in_use(&self) -> u64 {
        self.store.bytes_in_use()
    }

    /// Nothing to check before an operation: the gateway checked the
    /// request's region.
    #[allow(clippy::unused_async, reason = "the form delegate_s3 calls")]
    async fn before<T>(&self, _req: &S3Request<T>) -> S3Result<()> {
        Ok(())
    }

    /// Whether `entry` may be served now ([`holds`]); dropped, with its
    /// file, when it no longer holds.
    async fn entry_holds<T>(&self, req: &S3Request<T>, key: &Key, entry: &Entry) -> S3Result<bool> {
        let holds = holds(
            &*self.inner,
            &self.store.settings,
            req,
            key,
            &entry.head,
            &entry.checked,
        )
        .await?;
        if !holds {
            let _ = self
                .store
                .entries
                .remove_if(key, |kept| std::ptr::eq(Arc::as_ptr(kept), entry));
            if let Some(disk) = &self.store.disk {
                disk.remove(key);
            }
        }
        Ok(holds)
    }

    async fn get(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        if !cacheable(&req.input) {
            metrics::cache_request("bypass");
            return self.inner.get_object(req).await;
        }
        let key = (req.input.bucket.clone(), req.input.key.clone());
        if let Some(entry) = self.store.entries.get(&key) {
            if self.entry_holds(&req, &key, &entry).await? {
                metrics::cache_request("hit");
                return serve_entry(&entry, &req.input);
            }
        }
        metrics::cache_request("miss");
        let fill = self.join_or_start(&key, &req);
        let mut watching = fill.progress.subscribe();
        let head = loop {
            let progress = watching.borrow_and_update().clone();
            match (progress.head, progress.stage) {
                (Some(head), _) => break head,
                (None, Stage::Failed(_)) => {
                    return Err(lock(&fill.error)
                        .as_ref()
                        .map_or_else(|| s3_error!(InternalError), copy_error));
                }
                (None, Stage::Passed) => {
                    return match passed_answer(&fill, &req.input) {
                        Some(answer) => Ok(answer),
                        None => self.inner.get_object(req).await,
                    };
                }
                _ => {}
            }
            if watching.changed().await.is_err() {
                return self.inner.get_object(req).await;
            }
        };
        if let Some(failed) = precondition(&head, &req.input) {
            return Err(failed);
        }
        let span = head.span(req.input.range)?;
        let (from, to) = span.as_ref().map_or((0, head.len), |r| (r.start, r.end));
        let len = usize::try_from(to - from).map_err(|_| s3_error!(InternalError))?;
        let (tx, body) = ChunkStream::new(len, READER_DEPTH);
        tokio::spawn(follow(Arc::clone(&fill), from, to, tx));
        Ok(S3Response::new(head.answer(
            span,
            None,
            StreamingBlob::new(body),
        )))
    }

    /// The fill in progress for `key`, or a new one (its task started).
    fn join_or_start(&self, key: &Key, req: &S3Request<GetObjectInput>) -> Arc<Fill> {
        let mut fills = lock(&self.store.fills);
        if let Some(fill) = fills.get(key) {
            metrics::cache_coalesced();
            return Arc::clone(fill);
        }
        let (progress, _) = watch::channel(Progress {
            head: None,
            received: 0,
            stage: Stage::Asked,
        });
        let fill = Arc::new(Fill {
            progress,
            pieces: Mutex::new(Vec::new()),
            error: Mutex::new(None),
            passed: Mutex::new(None),
        });
        fills.insert(key.clone(), Arc::clone(&fill));
        let generation = *self.store.generation(key);
        let ask = sibling(
            req,
            GetObjectInput {
                bucket: key.0.clone(),
                key: key.1.clone(),
                checksum_mode: Some(ChecksumMode::from_static(ChecksumMode::ENABLED)),
                ..GetObjectInput::default()
            },
        );
        tokio::spawn(run_fill(
            Arc::clone(&self.inner),
            Arc::clone(&self.store),
            key.clone(),
            generation,
            Arc::clone(&fill),
            ask,
        ));
        fill
    }

    async fn head(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let plain = req.input.version_id.is_none()
            && req.input.part_number.is_none()
            && req.input.if_match.is_none()
            && req.input.if_none_match.is_none()
            && req.input.if_modified_since.is_none()
            && req.input.if_unmodified_since.is_none()
            && req.input.sse_customer_key.is_none();
        if let (Validate::Ttl(ttl), true) = (self.store.settings.validate, plain) {
            let key = (req.input.bucket.clone(), req.input.key.clone());
            if let Some(entry) = self.store.entries.peek(&key) {
                if fresh(&entry.checked, ttl) {
                    metrics::cache_request("head_hit");
                    let crc = wants_checksum(req.input.checksum_mode.as_ref())
                        .then_some(entry.crc64nvme.as_str());
                    return Ok(S3Response::new(entry.head.head_answer(crc)));
                }
            }
        }
        self.inner.head_object(req).await
    }

    /// A write of `key` through the gateway: its entry dropped before and
    /// after.
    async fn writing<R>(
        &self,
        keys: Vec<Key>,
        write: impl std::future::Future<Output = S3Result<R>>,
    ) -> S3Result<R> {
        for key in &keys {
            self.store.invalidate(key);
        }
        let answer = write.await;
        for key in &keys {
            self.store.invalidate(key);
        }
        answer
    }
}

/// The keys of the objects a write through the gateway replaces or removes.
trait Writes {
    fn keys(&self) -> Vec<Key>;
}

macro_rules! writes_one_key {
    ($($input:ident),*) => {$(
        impl Writes for $input {
            fn keys(&self) -> Vec<Key> {
                vec![(self.bucket.clone(), self.key.clone())]
            }
        }
    )*};
}
writes_one_key!(
    PutObjectInput,
    CompleteMultipartUploadInput,
    CopyObjectInput,
    DeleteObjectInput
);

impl Writes for DeleteObjectsInput {
    fn keys(&self) -> Vec<Key> {
        self.delete
            .objects
            .iter()
            .map(|o| (self.bucket.clone(), o.key.clone()))
            .collect()
    }
}

/// `Cached`'s own write operations: each drops its keys before and after
/// ([`Cached::writing`]).
macro_rules! writes {
    ($($method:ident: $input:ident => $output:ident = $op:ident;)*) => {
        impl Cached {
            $(
                async fn $method(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    let keys = req.input.keys();
                    self.writing(keys, self.inner.$op(req)).await
                }
            )*
        }
    };
}
writes! {
    put: PutObjectInput => PutObjectOutput = put_object;
    complete: CompleteMultipartUploadInput => CompleteMultipartUploadOutput = complete_multipart_upload;
    copy: CopyObjectInput => CopyObjectOutput = copy_object;
    delete: DeleteObjectInput => DeleteObjectOutput = delete_object;
    delete_many: DeleteObjectsInput => DeleteObjectsOutput = delete_objects;
}

impl Backend for Cached {
    fn describe(&self) -> String {
        let validate = match self.store.settings.validate {
            Validate::Always => "validated always".to_owned(),
            Validate::Ttl(ttl) => format!("trusted for {} s", ttl.as_secs()),
        };
        let disk = self
            .store
            .settings
            .disk
            .as_ref()
            .map_or_else(String::new, |d| {
                format!(", on disk in {} up to {} bytes", d.dir.display(), d.bytes)
            });
        format!(
            "{}, cached: {} bytes, objects up to {} bytes{disk}, {validate}",
            self.inner.describe(),
            self.store.settings.bytes,
            self.store.settings.max_object_bytes
        )
    }
}

delegate_s3!(Cached, inner, [
    create_bucket: CreateBucketInput => CreateBucketOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
    list_object_versions: ListObjectVersionsInput => ListObjectVersionsOutput;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    list_multipart_uploads: ListMultipartUploadsInput => ListMultipartUploadsOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
    get_object_attributes: GetObjectAttributesInput => GetObjectAttributesOutput;
    get_object_tagging: GetObjectTaggingInput => GetObjectTaggingOutput;
    put_object_tagging: PutObjectTaggingInput => PutObjectTaggingOutput;
    delete_object_tagging: DeleteObjectTaggingInput => DeleteObjectTaggingOutput;
    get_bucket_versioning: GetBucketVersioningInput => GetBucketVersioningOutput;
], own [
    get_object: GetObjectInput => GetObjectOutput = get;
    head_object: HeadObjectInput => HeadObjectOutput = head;
    put_object: PutObjectInput => PutObjectOutput = put;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput = complete;
    copy_object: CopyObjectInput => CopyObjectOutput = copy;
    delete_object: DeleteObjectInput => DeleteObjectOutput = delete;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput = delete_many;
]);

/// Whether a GET may be answered from the cache: the current version,
/// whole or a range, with no condition but `If-Match` (what the gateway's
/// own RDMA GET sends) and no answer headers overridden.
fn cacheable(input: &GetObjectInput) -> bool {
    input.version_id.is_none()
        && input.part_number.is_none()
        && input.if_none_match.is_none()
        && input.if_modified_since.is_none()
        && input.if_unmodified_since.is_none()
        && input.sse_customer_algorithm.is_none()
        && input.sse_customer_key.is_none()
        && input.response_cache_control.is_none()
        && input.response_content_disposition.is_none()
        && input.response_content_encoding.is_none()
        && input.response_content_language.is_none()
        && input.response_content_type.is_none()
        && input.response_expires.is_none()
}

/// 412 when `If-Match` names another version than `head`'s.
fn precondition(head: &Head, input: &GetObjectInput) -> Option<S3Error> {
    match &input.if_match {
        Some(ETagCondition::ETag(want)) if !head.same_version(Some(want)) => {
            let mut e = s3_error!(
                PreconditionFailed,
                "At least one of the pre-conditions you specified did not hold"
            );
            e.set_status_code(http::StatusCode::PRECONDITION_FAILED);
            Some(e)
        }
        _ => None,
    }
}

fn wants_checksum(mode: Option<&ChecksumMode>) -> bool {
    mode.is_some_and(|m| m.as_str() == ChecksumMode::ENABLED)
}

/// The answer of a fill that keeps nothing, for a reader that asks what
/// the fill asked (the whole object, no condition; the store's checksums
/// left out unless it asks for them too): `None` for another reader, or
/// once a reader took it.
fn passed_answer(fill: &Fill, input: &GetObjectInput) -> Option<S3Response<GetObjectOutput>> {
    if input.range.is_some() || input.if_match.is_some() {
        return None;
    }
    let mut answer = lock(&fill.passed).take()?;
    if !wants_checksum(input.checksum_mode.as_ref()) {
        let o = &mut answer.output;
        o.checksum_crc32 = None;
        o.checksum_crc32c = None;
        o.checksum_crc64nvme = None;
        o.checksum_sha1 = None;
        o.checksum_sha256 = None;
        o.checksum_type = None;
    }
    Some(answer)
}

/// A hit's answer: the entry's bytes (a slice for a range, no copy).
fn serve_entry(entry: &Entry, input: &GetObjectInput) -> S3Result<S3Response<GetObjectOutput>> {
    if let Some(failed) = precondition(&entry.head, input) {
        return Err(failed);
    }
    let span = entry.head.span(input.range)?;
    let bytes = match &span {
        Some(r) => entry.bytes.slice(index(r.start)..index(r.end)),
        None => entry.bytes.clone(),
    };
    metrics::cache_served(bytes.len() as u64);
    let crc = wants_checksum(input.checksum_mode.as_ref()).then_some(entry.crc64nvme.as_str());
    let mut answer = S3Response::new(entry.head.answer(
        span.clone(),
        crc,
        StreamingBlob::from(s3s::Body::from(bytes)),
    ));
    answer.extensions.insert(Kept {
        bytes: entry.bytes.clone(),
        first: span.map_or(0, |r| r.start),
        pinned: Arc::clone(&entry.pinned),
    });
    Ok(answer)
}

/// A fill: the store's whole object, its bytes kept as they come, checked,
/// and kept in the cache if nothing wrote the key meanwhile.
async fn run_fill(
    inner: Arc<dyn Backend>,
    store: Arc<Store>,
    key: Key,
    generation: u64,
    fill: Arc<Fill>,
    ask: S3Request<GetObjectInput>,
) {
    metrics::cache_fills(1);
    let outcome = match from_disk(&inner, &store, &key, &fill, &ask).await {
        Ok(Some(found)) => Ok(Some(found)),
        Ok(None) => fill_bytes(&inner, &store, &fill, ask).await,
        Err(why) => Err(why),
    };
    metrics::cache_fills(-1);
    let stage = match outcome {
        Ok(Some((entry, reserved, source))) => {
            store.keep(key.clone(), generation, Arc::new(entry), source);
            store.filling.fetch_sub(reserved, Ordering::AcqRel);
            store.gauge();
            Stage::Done
        }
        Ok(None) => Stage::Passed,
        Err(why) => {
            eprintln!(
                "hipobj-s3-server: cache: filling {}/{}: {why}",
                key.0, key.1
            );
            Stage::Failed(why)
        }
    };
    {
        let mut fills = lock(&store.fills);
        if fills.get(&key).is_some_and(|f| Arc::ptr_eq(f, &fill)) {
            fills.remove(&key);
        }
    }
    fill.progress.send_modify(|p| p.stage = stage);
}

/// Where a fill's bytes came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Store,
    Disk,
}

/// The fill's GET and bytes: the entry to keep, the bytes it reserved and
/// where they came from, `None` when the object is not kept, or why it
/// failed.
async fn fill_bytes(
    inner: &Arc<dyn Backend>,
    store: &Store,
    fill: &Fill,
    ask: S3Request<GetObjectInput>,
) -> Result<Option<(Entry, u64, Source)>, String> {
    let mut answer = match inner.get_object(ask).await {
        Ok(answer) => answer,
        Err(e) => {
            let why = format!("{} {:?}", e.code().as_str(), e.message());
            *lock(&fill.error) = Some(e);
            return Err(why);
        }
    };
    let Some(len) = answer
        .output
        .content_length
        .and_then(|n| u64::try_from(n).ok())
    else {
        *lock(&fill.passed) = Some(answer);
        return Ok(None);
    };
    let held = match store.reserve(len) {
        Ok(held) => held,
        Err(outcome) => {
            metrics::cache_request(outcome);
            *lock(&fill.passed) = Some(answer);
            return Ok(None);
        }
    };
    let head = Arc::new(Head::of(&answer.output, len));
    fill.progress.send_modify(|p| {
        p.head = Some(Arc::clone(&head));
        p.stage = Stage::Streaming;
    });
    store.gauge();
    let release = |why: String| {
        store.filling.fetch_sub(len, Ordering::AcqRel);
        store.gauge();
        Err(why)
    };
    let mut body = answer.output.body.take();
    let mut received = 0u64;
    // One pass over the bytes: the CRC64/NVME kept with them, and the
    // store's own algorithm where it is another.
    let mut sums = Stored::hasher(head.stored.as_ref(), true);
    while let Some(piece) = match body.as_mut() {
        Some(b) => b.next().await,
        None => None,
    } {
        let piece = match piece {
            Ok(piece) => piece,
            Err(e) => {
                return release(format!(
                    "the store's body failed after {received} bytes: {e}"
                ))
            }
        };
        if piece.is_empty() {
            continue;
        }
        let n = piece.len() as u64;
        if received + n > len {
            return release(format!(
                "the store sent more than the {len} bytes it announced"
            ));
        }
        sums.update(&piece);
        lock(&fill.pieces).push((received, piece));
        received += n;
        metrics::cache_filled(n);
        fill.progress.send_modify(|p| p.received = received);
    }
    if received != len {
        return release(format!(
            "the store sent {received} of the {len} bytes it announced"
        ));
    }
    let sums = sums.finalize();
    let crc64nvme = sums.checksum_crc64nvme.clone().unwrap_or_default();
    if let Some(stored) = &head.stored {
        let computed = stored.read(&sums).map_or("", String::as_str);
        if computed != stored.value {
            metrics::cache_request("corrupt");
            return release(format!(
                "its bytes' {} is {computed}, the store's is {}: not kept",
                stored.header, stored.value
            ));
        }
    }
    let bytes = {
        let pieces = lock(&fill.pieces);
        match pieces.as_slice() {
            [] => Bytes::new(),
            [(_, one)] => one.clone(),
            many => {
                let mut all = BytesMut::with_capacity(index(len));
                for (_, piece) in many {
                    all.extend_from_slice(piece);
                }
                all.freeze()
            }
        }
    };
    Ok(Some((
        Entry {
            head,
            bytes: charged(bytes, held),
            crc64nvme,
            checked: Mutex::new(Some(Instant::now())),
            pinned: Arc::default(),
        },
        len,
        Source::Store,
    )))
}

/// The fill of an object the disk tier holds: its file's bytes, checked
/// whole before a reader sees one of them, once the entry holds
/// ([`holds`]). `None` when the disk has no file of it that holds and
/// checks out (such a file is deleted): the store is asked. The store's
/// error when it cannot say whether the file holds.
async fn from_disk(
    inner: &Arc<dyn Backend>,
    store: &Arc<Store>,
    key: &Key,
    fill: &Fill,
    ask: &S3Request<GetObjectInput>,
) -> Result<Option<(Entry, u64, Source)>, String> {
    let Some(stored) = store.disk.as_ref().and_then(|disk| disk.get(key)) else {
        return Ok(None);
    };
    let drop_file = || {
        if let Some(disk) = &store.disk {
            disk.remove_if(key, &stored);
        }
    };
    match holds(
        &**inner,
        &store.settings,
        ask,
        key,
        &stored.head,
        &stored.checked,
    )
    .await
    {
        Ok(true) => {}
        Ok(false) => {
            drop_file();
            return Ok(None);
        }
        Err(e) => {
            let why = format!("{} {:?}", e.code().as_str(), e.message());
            *lock(&fill.error) = Some(e);
            return Err(why);
        }
    }
    let len = stored.head.len;
    let Ok(held) = store.reserve(len) else {
        return Ok(None);
    };
    let reading = Arc::clone(&stored);
    let read = tokio::task::spawn_blocking(move || Disk::read(&reading))
        .await
        .unwrap_or_else(|e| Err(format!("the read stopped: {e}")));
    let bytes = match read {
        Ok(Some(bytes)) => charged(bytes, held),
        Ok(None) => {
            // Invalidated or evicted since it was found: not a bad file.
            store.filling.fetch_sub(len, Ordering::AcqRel);
            return Ok(None);
        }
        Err(why) => {
            eprintln!(
                "hipobj-s3-server: cache: {} ({}/{}): {why}: deleted, the store asked",
                stored.path.display(),
                key.0,
                key.1
            );
            metrics::cache_request("disk_corrupt");
            store.filling.fetch_sub(len, Ordering::AcqRel);
            drop_file();
            return Ok(None);
        }
    };
    metrics::cache_from_disk(len);
    fill.progress.send_modify(|p| {
        p.head = Some(Arc::clone(&stored.head));
        p.stage = Stage::Streaming;
    });
    lock(&fill.pieces).push((0, bytes.clone()));
    fill.progress.send_modify(|p| p.received = len);
    let checked = *lock(&stored.checked);
    Ok(Some((
        Entry {
            head: Arc::clone(&stored.head),
            bytes,
            crc64nvme: stored.crc64nvme.clone(),
            checked: Mutex::new(checked),
            pinned: Arc::default(),
        },
        len,
        Source::Disk,
    )))
}

/// `bytes` carrying `held` (their share of the memory budget), given back
/// when the last of them (the entry's, a reader's slice) is dropped.
fn charged(bytes: Bytes, held: Option<Held>) -> Bytes {
    match held {
        Some(held) => Bytes::from_owner(Charged { bytes, _held: held }),
        None => bytes,
    }
}

/// Bytes and their share of the budget ([`charged`]).
struct Charged {
    bytes: Bytes,
    _held: Held,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Whether an entry (`head`, last `checked`) of `key` may be served now:
/// fresh under `ttl`, else what a HeadObject to the store says (the ETag
/// the same; then `checked` is now). The store's error when it cannot
/// say.
async fn holds<T>(
    inner: &dyn Backend,
    settings: &Settings,
    req: &S3Request<T>,
    key: &Key,
    head: &Head,
    checked: &Mutex<Option<Instant>>,
) -> S3Result<bool> {
    if let Validate::Ttl(ttl) = settings.validate {
        if fresh(checked, ttl) {
            return Ok(true);
        }
    }
    let ask = sibling(
        req,
        HeadObjectInput {
            bucket: key.0.clone(),
            key: key.1.clone(),
            ..HeadObjectInput::default()
        },
    );
    match inner.head_object(ask).await {
        Ok(answer) if head.same_version(answer.output.e_tag.as_ref()) => {
            *lock(checked) = Some(Instant::now());
            metrics::cache_validated("same");
            Ok(true)
        }
        Ok(_) => {
            metrics::cache_validated("changed");
            Ok(false)
        }
        Err(e) if e.status_code().is_some_and(|s| s.as_u16() == 404) => {
            metrics::cache_validated("gone");
            Ok(false)
        }
        Err(e) => {
            metrics::cache_validated("failed");
            Err(e)
        }
    }
}

/// Whether an entry last `checked` is younger than `ttl`.
fn fresh(checked: &Mutex<Option<Instant>>, ttl: Duration) -> bool {
    lock(checked).is_some_and(|at| at.elapsed() < ttl)
}

/// A reader of a fill: hands the bytes `[from, to)` to its client's body
/// as they arrive, but for the last piece, held back until the whole
/// object came and passed its checks: a fill that fails (a checksum that
/// does not match, the store stopped) ends the body with an error
/// instead, so that no client takes the bytes of a failed fill for a whole
/// answer.
async fn follow(
    fill: Arc<Fill>,
    from: u64,
    to: u64,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, StdError>>,
) {
    let mut watching = fill.progress.subscribe();
    let mut at = from;
    let mut held: Option<Bytes> = None;
    loop {
        let progress = watching.borrow_and_update().clone();
        let upto = progress.received.min(to);
        if upto > at {
            for piece in fill.slices(at, upto) {
                at += piece.len() as u64;
                if let Some(before) = held.replace(piece) {
                    metrics::cache_served(before.len() as u64);
                    if tx.send(Ok(before)).await.is_err() {
                        return; // the client went away
                    }
                }
            }
        }
        match &progress.stage {
            Stage::Done if at >= to => {
                if let Some(last) = held.take() {
                    metrics::cache_served(last.len() as u64);
                    let _ = tx.send(Ok(last)).await;
                }
                return;
            }
            Stage::Failed(why) => {
                let _ = tx
                    .send(Err(format!(
                        "the object's bytes from the store failed: {why}"
                    )
                    .into()))
                    .await;
                return;
            }
            _ => {}
        }
        if watching.changed().await.is_err() {
            let _ = tx
                .send(Err("the object's fill ended before its bytes".into()))
                .await;
            return;
        }
    }
}

/// An S3 error made again (they are not `Clone`): each reader of a failed
/// fill gets the store's answer.
fn copy_error(e: &S3Error) -> S3Error {
    let mut copy = match e.message() {
        Some(message) => S3Error::with_message(e.code().clone(), message.to_owned()),
        None => S3Error::new(e.code().clone()),
    };
    if let Some(status) = e.status_code() {
        copy.set_status_code(status);
    }
    copy
}

/// An offset or length within an object held in memory (so it fits).
fn index(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
