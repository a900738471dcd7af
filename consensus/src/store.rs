//! Raft storage in one RocksDB database: the log, the vote, the accounting store and the record
//! of the latest snapshot, plus the state machine that applies committed entries to the
//! in-memory hot [`ClusterState`] and the accounting store.
//!
//! Column families:
//! - `logs`: log index as big-endian `u64` -> encoded entry;
//! - `meta`: `vote`, `committed`, `last_purged`, `acct_gen` (the accounting generation);
//! - `sm`: `snapshot` -> encoded `(SnapshotMeta, file name)`; the file (frames of the hot state,
//!   see [`crate::snapshot`]) is in `snapshots/` beside the database's files;
//! - `acct`, `acct_idx`: the accounting store ([`crate::accounting`]), LZ4-compressed.
//!
//! Every value is encoded with `proto::codec`. Appends are made durable by group commit: a
//! dedicated flusher thread takes every callback queued so far, syncs the WAL once, then completes
//! them all, so concurrent appends share one fsync.

use std::fmt::{Debug, Display};
use std::fs::File;
use std::io::{self, BufReader};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use futures_util::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, IOFlushed, LogState, RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder};
use proto::{Command, CommandResult, Job, JobId, JobQuery, JOB_PAGE_SCAN_MAX};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompressionType, Direction, IteratorMode, Options, WriteBatch,
    WriteOptions, DB,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::accounting::{self, CF_ACCT, CF_ACCT_IDX};
use crate::inbox::SnapshotInbox;
use crate::snapshot::{self, AccountingSource, Snapshot, SnapshotData};
use crate::state::ClusterState;
use crate::types::{Entry, LogCommand, LogId, SnapshotMeta, StoredMembership, TypeConfig, Vote};

const CF_LOGS: &str = "logs";
const CF_META: &str = "meta";
const CF_SM: &str = "sm";

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_SNAPSHOT: &[u8] = b"snapshot";
const KEY_ACCT_GEN: &[u8] = b"acct_gen";

/// Largest value read back from disk. Values are written by us, but a torn or foreign file must
/// give an error, not an unbounded allocation.
const DISK_VALUE_BYTES_MAX: usize = 4 * 1024 * 1024 * 1024;

/// Appends whose WAL sync is pending at most; `append` waits for room beyond that.
const FLUSH_QUEUE_DEPTH: usize = 4096;

/// The most an injected slow disk delays one WAL sync.
pub const WAL_SYNC_DELAY_MS_MAX: u64 = 10_000;

/// How long `open_store` retries while a previous handle on the same directory is still closing.
const OPEN_LOCK_WAIT_MS: u64 = 10_000;

fn io_other(context: &str, e: impl Display) -> io::Error {
    io::Error::other(format!("{context}: {e}"))
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    proto::encode(value)
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    proto::decode(bytes, DISK_VALUE_BYTES_MAX).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decode {what}: {e}")))
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn key_index(key: &[u8]) -> io::Result<u64> {
    let bytes: [u8; 8] =
        key.try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("log key of {} bytes, not 8", key.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

fn cf<'a>(db: &'a DB, name: &str) -> io::Result<&'a ColumnFamily> {
    db.cf_handle(name).ok_or_else(|| io::Error::other(format!("column family '{name}' is missing")))
}

fn synced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    opts
}

fn read_meta<T: DeserializeOwned>(db: &DB, key: &[u8]) -> io::Result<Option<T>> {
    let what = String::from_utf8_lossy(key);
    let bytes = db.get_cf(cf(db, CF_META)?, key).map_err(|e| io_other(&format!("read {what}"), e))?;
    bytes.map(|b| decode(&b, &what)).transpose()
}

/// Opens (or creates) the database at `dir` and returns the log store and the state machine,
/// the latter loaded from the latest snapshot.
pub fn open_store(dir: &Path) -> io::Result<(LogStore, StateMachine)> {
    open_store_with(dir, Arc::new(AtomicU64::new(0)))
}

/// [`open_store`] with a fault-injection hook: every WAL sync first waits `wal_sync_delay_ms`
/// (a slow disk; zero adds nothing).
pub fn open_store_with(dir: &Path, wal_sync_delay_ms: Arc<AtomicU64>) -> io::Result<(LogStore, StateMachine)> {
    let db = Arc::new(open_db(dir)?);
    let log = LogStore::new(db.clone(), wal_sync_delay_ms)?;
    let sm = StateMachine::load(db, dir)?;
    Ok((log, sm))
}

/// Memory RocksDB may use, whatever the history: all memtables together, and one block cache
/// (index and filter blocks included) shared by every column family.
const MEMTABLES_BYTES_MAX: usize = 64 * 1024 * 1024;
const BLOCK_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// WAL kept at most: past it the column families that pin old WAL files (`meta`, `sm`, written
/// rarely) are flushed, so the WAL does not grow with history.
const WAL_BYTES_MAX: u64 = 64 * 1024 * 1024;

fn open_db(dir: &Path) -> io::Result<DB> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_db_write_buffer_size(MEMTABLES_BYTES_MAX);
    opts.set_max_total_wal_size(WAL_BYTES_MAX);
    let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    let started = Instant::now();
    loop {
        let cfs = [CF_LOGS, CF_META, CF_SM, CF_ACCT, CF_ACCT_IDX].map(|name| {
            let mut cf_opts = Options::default();
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&cache);
            table.set_cache_index_and_filter_blocks(true);
            cf_opts.set_block_based_table_factory(&table);
            let buffer_mib = match name {
                CF_LOGS => 16,
                CF_ACCT | CF_ACCT_IDX => 8,
                _ => 1,
            };
            cf_opts.set_write_buffer_size(buffer_mib * 1024 * 1024);
            if name == CF_ACCT || name == CF_ACCT_IDX {
                cf_opts.set_compression_type(DBCompressionType::Lz4);
            }
            ColumnFamilyDescriptor::new(name, cf_opts)
        });
        match DB::open_cf_descriptors(&opts, dir, cfs) {
            Ok(db) => return Ok(db),
            // A previous handle of this process may still be closing (its flusher thread ends
            // after the Raft that owned it shut down).
            Err(e) if e.to_string().contains("lock") && started.elapsed() < Duration::from_millis(OPEN_LOCK_WAIT_MS) => {
                debug!(dir = %dir.display(), error = %e, "database locked, retrying");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(io_other(&format!("open rocksdb at {}", dir.display()), e)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Log

/// The Raft log and vote. Owned by openraft's core task.
pub struct LogStore {
    db: Arc<DB>,
    flush_tx: mpsc::Sender<IOFlushed<TypeConfig>>,
    wal_syncs: Arc<AtomicU64>,
}

impl LogStore {
    fn new(db: Arc<DB>, wal_sync_delay_ms: Arc<AtomicU64>) -> io::Result<LogStore> {
        for name in [CF_LOGS, CF_META] {
            cf(&db, name)?;
        }
        let (flush_tx, flush_rx) = mpsc::channel(FLUSH_QUEUE_DEPTH);
        let wal_syncs = Arc::new(AtomicU64::new(0));
        // Weak: while it waits, the flusher owns no database, so the last owner drops RocksDB on
        // its own thread (never this one while the process exits, which aborts in RocksDB).
        let flusher_db = Arc::downgrade(&db);
        let flusher_syncs = wal_syncs.clone();
        std::thread::Builder::new()
            .name("corral-wal-sync".into())
            .spawn(move || run_flusher(flusher_db, flush_rx, flusher_syncs, wal_sync_delay_ms))
            .map_err(|e| io_other("spawn wal sync thread", e))?;
        Ok(LogStore { db, flush_tx, wal_syncs })
    }

    /// WAL syncs done for appends so far (at most one per append; fewer when they batch).
    pub fn wal_syncs(&self) -> u64 {
        self.wal_syncs.load(Ordering::Relaxed)
    }
}

/// Group commit: waits for a queued append, takes all queued after it, syncs the WAL once and
/// completes them all, in order. Ends when the log store is dropped.
fn run_flusher(
    db: std::sync::Weak<DB>,
    mut rx: mpsc::Receiver<IOFlushed<TypeConfig>>,
    wal_syncs: Arc<AtomicU64>,
    delay_ms: Arc<AtomicU64>,
) {
    let mut pending = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        let delay_ms = delay_ms.load(Ordering::Relaxed);
        if delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(delay_ms.min(WAL_SYNC_DELAY_MS_MAX)));
        }
        while let Ok(next) = rx.try_recv() {
            pending.push(next);
        }
        let result = match db.upgrade() {
            Some(db) => db.flush_wal(true).map_err(|e| e.to_string()),
            None => Err("the log store is closed".to_string()),
        };
        wal_syncs.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &result {
            warn!(error = %e, appends = pending.len(), "wal sync failed");
        }
        for callback in pending.drain(..) {
            callback.io_completed(result.clone().map_err(|e| io::Error::other(format!("sync wal: {e}"))));
        }
    }
    debug!("wal sync thread stopped");
}

/// Reads the log; cloned into each replication task.
#[derive(Clone)]
pub struct LogReader {
    db: Arc<DB>,
}

impl LogReader {
    fn entries<RB: RangeBounds<u64>>(&self, range: RB) -> io::Result<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => match i.checked_add(1) {
                Some(i) => i,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let logs = cf(&self.db, CF_LOGS)?;
        let key = index_key(start);
        let mut entries = Vec::new();
        for item in self.db.iterator_cf(logs, IteratorMode::From(&key, Direction::Forward)) {
            let (key, value) = item.map_err(|e| io_other("read log", e))?;
            let index = key_index(&key)?;
            if !range.contains(&index) {
                break;
            }
            let entry: Entry = decode(&value, "log entry")?;
            if entry.index() != index {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("log entry under key {index} has index {}", entry.index())));
            }
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        self.entries(range)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        read_meta(&self.db, KEY_VOTE)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        LogReader { db: self.db.clone() }.entries(range)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        read_meta(&self.db, KEY_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged_log_id: Option<LogId> = read_meta(&self.db, KEY_LAST_PURGED)?;
        let last = self.db.iterator_cf(cf(&self.db, CF_LOGS)?, IteratorMode::End).next();
        let last_log_id = match last {
            Some(item) => {
                let (_, value) = item.map_err(|e| io_other("read last log entry", e))?;
                let entry: Entry = decode(&value, "log entry")?;
                Some(entry.log_id())
            }
            None => last_purged_log_id,
        };
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader { db: self.db.clone() }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let db = self.db.clone();
        let bytes = encode(vote);
        tokio::task::spawn_blocking(move || {
            db.put_cf_opt(cf(&db, CF_META)?, KEY_VOTE, bytes, &synced()).map_err(|e| io_other("save vote", e))
        })
        .await
        .map_err(|e| io_other("save vote", e))?
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not synced: a lost update only means re-applying less after a crash; the next append's
        // sync makes it durable anyway.
        self.db.put_cf(cf(&self.db, CF_META)?, KEY_COMMITTED, encode(&committed)).map_err(|e| io_other("save committed", e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(read_meta::<Option<LogId>>(&self.db, KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let logs = cf(&self.db, CF_LOGS)?;
        let mut batch = WriteBatch::default();
        for entry in entries {
            batch.put_cf(logs, index_key(entry.index()), encode(&entry));
        }
        // Readable once written; durable once the flusher synced the WAL and called back.
        self.db.write(batch).map_err(|e| io_other("append log", e))?;
        self.flush_tx.send(callback).await.map_err(|_| io::Error::other("wal sync thread stopped"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        debug!(from, "truncate log");
        // One range delete removes the whole tail at once: no hole is ever visible.
        self.db.delete_range_cf(cf(&self.db, CF_LOGS)?, index_key(from), index_key(u64::MAX)).map_err(|e| io_other("truncate log", e))?;
        // Entry u64::MAX is outside the range above; it cannot exist in practice, but be exact.
        self.db.delete_cf(cf(&self.db, CF_LOGS)?, index_key(u64::MAX)).map_err(|e| io_other("truncate log", e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        debug!(upto = log_id.index(), "purge log");
        let mut batch = WriteBatch::default();
        batch.put_cf(cf(&self.db, CF_META)?, KEY_LAST_PURGED, encode(&log_id));
        batch.delete_range_cf(cf(&self.db, CF_LOGS)?, index_key(0), index_key(log_id.index() + 1));
        self.db.write(batch).map_err(|e| io_other("purge log", e))
    }
}

// ---------------------------------------------------------------------------------------------
// State machine

/// Read access to the applied cluster state and the accounting store, shared with the rest of
/// the node.
#[derive(Clone)]
pub struct StateHandle {
    state: Arc<RwLock<ClusterState>>,
    applied: watch::Receiver<u64>,
    last_change: Arc<AtomicU64>,
    accounting: AccountingSource,
    inbox: Arc<SnapshotInbox>,
}

impl StateHandle {
    /// Runs `f` on the current state under a read lock. Keep `f` short: apply waits for it.
    pub fn read<R>(&self, f: impl FnOnce(&ClusterState) -> R) -> R {
        f(&read_lock(&self.state))
    }

    /// Index of the last applied log entry (0 before anything was applied; index 0 itself is the
    /// initial membership entry, never a command).
    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Index of the last entry that did more than submit jobs (`Command::submits_only`), as of
    /// the state `read` shows: stored before such an entry changes the state, so a caller that
    /// reads it inside [`StateHandle::read`] and finds at most J knows that the state it reads
    /// holds no such entry after J (it may name one whose change is not there yet: a caller
    /// errs towards a pass). Starts at the index of the state loaded or installed.
    pub fn last_change_index(&self) -> u64 {
        self.last_change.load(Ordering::Acquire)
    }

    /// Waits until the entry at `index` is applied; false on timeout or when the state machine
    /// stopped.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        let mut rx = self.applied.clone();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|&applied| applied >= index)).await;
        matches!(reached, Ok(Ok(_)))
    }

    /// A receiver of the last applied index; it changes after each applied entry.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.clone()
    }

    fn gen(&self) -> u32 {
        self.accounting.gen.load(Ordering::Acquire)
    }

    /// Where this node receives snapshots (for [`crate::handle_raft_rpc`]).
    pub fn snapshot_inbox(&self) -> &SnapshotInbox {
        &self.inbox
    }

    /// Job `id` from the hot state, else its accounting record.
    pub fn job(&self, id: JobId) -> io::Result<Option<Job>> {
        if let Some(job) = self.read(|s| s.jobs.get(&id).cloned()) {
            return Ok(Some(job));
        }
        accounting::get(&*self.accounting.db()?, self.gen(), id)
    }

    /// The accounting record of job `id` (a finished job that left the hot state).
    pub fn archived_job(&self, id: JobId) -> io::Result<Option<Job>> {
        accounting::get(&*self.accounting.db()?, self.gen(), id)
    }

    /// One page of jobs matching `query`: the hot state's and the accounting store's, merged in
    /// id order (the hot state's copy wins), and the cursor of the next page.
    pub fn query_jobs(&self, query: &JobQuery) -> io::Result<(Vec<Job>, Option<JobId>)> {
        let limit = query.page_limit();
        let (archived, covered_to) = accounting::query(&*self.accounting.db()?, self.gen(), query, limit, JOB_PAGE_SCAN_MAX as usize)?;
        let hot: Vec<Job> = self.read(|s| {
            s.jobs
                .range(query.after.saturating_add(1)..)
                .map(|(_, j)| j)
                .take_while(|j| covered_to.is_none_or(|c| j.id <= c))
                .filter(|j| query.matches(j))
                .take(limit + 1)
                .cloned()
                .collect()
        });
        let mut merged: std::collections::BTreeMap<JobId, Job> = archived.into_iter().map(|j| (j.id, j)).collect();
        merged.extend(hot.into_iter().map(|j| (j.id, j)));
        let mut jobs: Vec<Job> = merged.into_values().collect();
        let next = if jobs.len() > limit {
            jobs.truncate(limit);
            jobs.last().map(|j| j.id)
        } else {
            covered_to
        };
        if query.brief {
            for j in &mut jobs {
                let spec = std::sync::Arc::make_mut(&mut j.spec);
                spec.env.clear();
                spec.script = None;
            }
        }
        Ok((jobs, next))
    }

    /// Up to `limit` ids of accounting records that ended before `before_ms` (retention).
    pub fn accounting_ended_before(&self, before_ms: u64, limit: usize) -> io::Result<Vec<JobId>> {
        accounting::ended_before(&*self.accounting.db()?, self.gen(), before_ms, limit)
    }

    /// Bytes the accounting store takes on disk (its SST files; what is still in memtables is
    /// not counted).
    pub fn accounting_disk_bytes(&self) -> io::Result<u64> {
        let db = self.accounting.db()?;
        let mut bytes = 0;
        for name in [CF_ACCT, CF_ACCT_IDX] {
            let v = db.property_int_value_cf(cf(&db, name)?, "rocksdb.total-sst-files-size").map_err(|e| io_other("read sst size", e))?;
            bytes += v.unwrap_or(0);
        }
        Ok(bytes)
    }

    /// Records in the accounting store and their digest (equal on replicas at the same index
    /// once the log is applied through).
    pub fn accounting_digest(&self) -> io::Result<(u64, String)> {
        accounting::digest(&*self.accounting.db()?, self.gen())
    }
}

fn read_lock(state: &RwLock<ClusterState>) -> RwLockReadGuard<'_, ClusterState> {
    // A panic in apply (a broken invariant) poisons the lock; readers still get the state, and
    // the state machine refuses to apply anything more.
    state.read().unwrap_or_else(PoisonError::into_inner)
}

/// What `sm/snapshot` records: the latest snapshot's meta and its file in the snapshot folder.
type SnapshotRecord = (SnapshotMeta, String);

/// Applies committed entries to the in-memory [`ClusterState`] and the accounting store; builds
/// and installs snapshots.
/// A Raft node of the job log.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;

pub struct StateMachine {
    db: Arc<DB>,
    state: Arc<RwLock<ClusterState>>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    applied_tx: watch::Sender<u64>,
    applied_rx: watch::Receiver<u64>,
    /// See [`StateHandle::last_change_index`].
    last_change: Arc<AtomicU64>,
    /// Serializes writes of the stored snapshot (a build may finish after an install).
    snapshot_write: Arc<Mutex<()>>,
    /// Snapshot files (`snap-*.bin`) and snapshots being received (`incoming/`).
    snap_dir: PathBuf,
    accounting: AccountingSource,
    inbox: Arc<SnapshotInbox>,
}

impl StateMachine {
    fn load(db: Arc<DB>, dir: &Path) -> io::Result<StateMachine> {
        cf(&db, CF_SM)?;
        let snap_dir = dir.join(SNAPSHOT_DIR);
        std::fs::create_dir_all(snap_dir.join(INCOMING_DIR)).map_err(|e| io_other("create snapshot folder", e))?;
        let gen: u32 = read_meta(&db, KEY_ACCT_GEN)?.unwrap_or(0);
        accounting::drop_other_generations(&db, gen)?;
        let stored = read_snapshot_record(&db)?;
        let (last_applied, membership, state) = match &stored {
            Some((meta, name)) => {
                let file = File::open(snap_dir.join(name)).map_err(|e| io_other(&format!("open snapshot {name}"), e))?;
                let hot = snapshot::read_hot(&mut BufReader::new(file))?;
                if hot.last_applied != meta.last_log_id {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("snapshot {name} holds state up to {:?} but its record says {:?}", hot.last_applied, meta.last_log_id),
                    ));
                }
                info!(last_applied = hot.last_applied.map(|l| l.index()), jobs = hot.state.jobs.len(), "loaded snapshot");
                (hot.last_applied, hot.membership, hot.state)
            }
            None => (None, StoredMembership::default(), ClusterState::default()),
        };
        remove_stale_snapshots(&snap_dir, stored.as_ref().map(|(_, n)| n.as_str()), true);
        let (applied_tx, applied_rx) = watch::channel(last_applied.map_or(0, |l| l.index()));
        let last_change = Arc::new(AtomicU64::new(last_applied.map_or(0, |l| l.index())));
        let accounting = AccountingSource { db: Arc::downgrade(&db), gen: Arc::new(AtomicU32::new(gen)) };
        Ok(StateMachine {
            db,
            state: Arc::new(RwLock::new(state)),
            last_applied,
            membership,
            applied_tx,
            applied_rx,
            last_change,
            snapshot_write: Arc::new(Mutex::new(())),
            inbox: Arc::new(SnapshotInbox::new(snap_dir.join(INCOMING_DIR))),
            snap_dir,
            accounting,
        })
    }

    /// A read handle on the applied state.
    pub fn handle(&self) -> StateHandle {
        StateHandle {
            state: self.state.clone(),
            applied: self.applied_rx.clone(),
            last_change: self.last_change.clone(),
            accounting: self.accounting.clone(),
            inbox: self.inbox.clone(),
        }
    }

    fn write_state(&self) -> io::Result<RwLockWriteGuard<'_, ClusterState>> {
        self.state.write().map_err(|_| io::Error::other("state machine poisoned by a failed apply"))
    }

    /// Records that the entry `log_id` does more than submit jobs, before it changes the state
    /// (see [`StateHandle::last_change_index`]).
    fn mark_change(&self, log_id: Option<LogId>) {
        self.last_change.store(log_id.map_or(0, |l| l.index()), Ordering::Release);
    }

    fn set_applied(&mut self, log_id: Option<LogId>) {
        self.last_applied = log_id;
        self.applied_tx.send_replace(log_id.map_or(0, |l| l.index()));
    }

    /// Applies `cmd` to the hot state and, under the same write lock (so no reader sees a job in
    /// neither place), what it moved or pruned to the accounting store.
    fn apply_command(&self, cmd: &Command) -> io::Result<CommandResult> {
        let mut state = self.write_state()?;
        let mut archived = Vec::new();
        let result = state.apply_archiving(cmd, &mut archived);
        let pruned = match cmd {
            Command::PruneAccounting { jobs, .. } if result == CommandResult::Ok => jobs.as_slice(),
            _ => &[],
        };
        if !archived.is_empty() || !pruned.is_empty() {
            let gen = self.accounting.gen.load(Ordering::Acquire);
            let records: Vec<Job> = archived.iter().map(accounting::record_of).collect();
            let mut batch = WriteBatch::default();
            accounting::put_records(&self.db, &mut batch, gen, &records)?;
            accounting::delete_records(&self.db, &mut batch, gen, pruned)?;
            // Not synced: the log is the durable record, and replaying it writes the same.
            self.db.write(batch).map_err(|e| io_other("write accounting", e))?;
        }
        drop(state);
        Ok(result)
    }
}

const SNAPSHOT_DIR: &str = "snapshots";
const INCOMING_DIR: &str = "incoming";

fn read_snapshot_record(db: &DB) -> io::Result<Option<SnapshotRecord>> {
    let bytes = db.get_cf(cf(db, CF_SM)?, KEY_SNAPSHOT).map_err(|e| io_other("read snapshot record", e))?;
    bytes.map(|b| decode(&b, "snapshot record")).transpose()
}

/// Deletes snapshot files other than `keep` (and, at start, whatever was being received).
fn remove_stale_snapshots(snap_dir: &Path, keep: Option<&str>, incoming_too: bool) {
    let mut dirs = vec![snap_dir.to_path_buf()];
    if incoming_too {
        dirs.push(snap_dir.join(INCOMING_DIR));
    }
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if is_file && Some(name.as_str()) != keep {
                if let Err(e) = std::fs::remove_file(entry.path()) {
                    warn!(file = %entry.path().display(), error = %e, "could not remove an old snapshot");
                }
            }
        }
    }
}

/// A name no other snapshot file of this folder has.
fn snapshot_file_name(meta: &SnapshotMeta) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let index = meta.last_log_id.map_or(0, |l| l.index());
    format!("snap-{index:020}-{nanos}-{}.bin", SEQ.fetch_add(1, Ordering::Relaxed))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Records `meta` and file `name` as the latest snapshot (with `gen`, the accounting
/// generation, in the same synced write), unless `force` is off and a newer one is recorded.
/// Returns whether it was recorded.
fn record_snapshot(db: &DB, lock: &Mutex<()>, meta: &SnapshotMeta, name: &str, gen: Option<u32>, force: bool) -> io::Result<bool> {
    let _guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
    if !force {
        if let Some((stored, _)) = read_snapshot_record(db)? {
            if stored.last_log_id > meta.last_log_id {
                debug!("a newer snapshot is recorded already; keeping it");
                return Ok(false);
            }
        }
    }
    let mut batch = WriteBatch::default();
    batch.put_cf(cf(db, CF_SM)?, KEY_SNAPSHOT, encode(&(meta, name)));
    if let Some(gen) = gen {
        batch.put_cf(cf(db, CF_META)?, KEY_ACCT_GEN, encode(&gen));
    }
    db.write_opt(batch, &synced()).map_err(|e| io_other("record snapshot", e))?;
    Ok(true)
}

/// A point-in-time copy of the hot state, encoded on the state machine task; written out
/// elsewhere.
pub struct SnapshotBuilder {
    db: Arc<DB>,
    meta: SnapshotMeta,
    frames: Vec<Vec<u8>>,
    snap_dir: PathBuf,
    snapshot_write: Arc<Mutex<()>>,
    accounting: AccountingSource,
}

impl SnapshotBuilder {
    fn write(self) -> io::Result<Snapshot> {
        let started = Instant::now();
        let name = snapshot_file_name(&self.meta);
        let tmp = self.snap_dir.join(INCOMING_DIR).join(format!("{name}.tmp"));
        snapshot::write_file(&tmp, &self.frames)?;
        let path = self.snap_dir.join(&name);
        std::fs::rename(&tmp, &path).map_err(|e| io_other("move snapshot into place", e))?;
        sync_dir(&self.snap_dir)?;
        let file = File::open(&path)?;
        if record_snapshot(&self.db, &self.snapshot_write, &self.meta, &name, None, false)? {
            remove_stale_snapshots(&self.snap_dir, Some(&name), false);
        } else {
            // A newer one is recorded: this file is open for the caller and goes once closed.
            let _ = std::fs::remove_file(&path);
        }
        let bytes = self.frames.iter().map(Vec::len).sum::<usize>();
        let build_ms = started.elapsed().as_millis() as u64;
        info!(last_log = self.meta.last_log_id.map(|l| l.index()), bytes, build_ms, "built snapshot");
        Ok(Snapshot { meta: self.meta, snapshot: SnapshotData { file, path, accounting: Some(self.accounting) } })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let builder = SnapshotBuilder {
            db: self.db.clone(),
            meta: self.meta.clone(),
            frames: std::mem::take(&mut self.frames),
            snap_dir: self.snap_dir.clone(),
            snapshot_write: self.snapshot_write.clone(),
            accounting: self.accounting.clone(),
        };
        tokio::task::spawn_blocking(move || builder.write()).await.map_err(|e| io_other("build snapshot", e))?
    }
}

/// Installs a received snapshot: its accounting records under the next generation, its hot
/// part as this node's snapshot file, then one synced write switches both. Returns the hot
/// state and the new generation.
fn install_files(
    db: &DB,
    lock: &Mutex<()>,
    snap_dir: &Path,
    meta: &SnapshotMeta,
    data: &SnapshotData,
    gen: &AtomicU32,
) -> io::Result<ClusterState> {
    let mut reader = BufReader::new(snapshot::rewound(&data.file)?);
    let hot = snapshot::read_hot(&mut reader)?;
    if hot.last_applied != meta.last_log_id {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("snapshot holds state up to {:?} but its meta says {:?}", hot.last_applied, meta.last_log_id),
        ));
    }
    let old_gen = gen.load(Ordering::Acquire);
    let new_gen = old_gen.wrapping_add(1);
    accounting::drop_other_generations(db, old_gen)?;
    let mut write = |records: Vec<Job>| {
        let mut batch = WriteBatch::default();
        accounting::put_records(db, &mut batch, new_gen, &records)?;
        db.write(batch).map_err(|e| io_other("write received accounting", e))
    };
    let records = match &data.accounting {
        Some(source) => accounting::for_each_chunk(&*source.db()?, source.gen.load(Ordering::Acquire), 2048, &mut write)?,
        None => snapshot::read_accounting(&mut reader, &mut write)?,
    };
    let name = snapshot_file_name(meta);
    let tmp = snap_dir.join(INCOMING_DIR).join(format!("{name}.tmp"));
    snapshot::copy_prefix(&data.file, hot.bytes, &tmp)?;
    std::fs::rename(&tmp, snap_dir.join(&name)).map_err(|e| io_other("move snapshot into place", e))?;
    sync_dir(snap_dir)?;
    // The synced write also makes every unsynced write before it durable (one WAL).
    record_snapshot(db, lock, meta, &name, Some(new_gen), true)?;
    gen.store(new_gen, Ordering::Release);
    accounting::drop_other_generations(db, new_gen)?;
    remove_stale_snapshots(snap_dir, Some(&name), false);
    info!(last_log = meta.last_log_id.map(|l| l.index()), jobs = hot.state.jobs.len(), records, "installed snapshot");
    Ok(hot.state)
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let log_id = entry.log_id;
            if !matches!(&entry.payload, EntryPayload::Normal(LogCommand(cmd)) if cmd.submits_only()) {
                self.mark_change(Some(log_id));
            }
            let result = match entry.payload {
                EntryPayload::Blank => CommandResult::Ok,
                EntryPayload::Normal(LogCommand(cmd)) => self.apply_command(&cmd)?,
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(log_id), membership);
                    CommandResult::Ok
                }
            };
            self.set_applied(Some(log_id));
            if let Some(responder) = responder {
                responder.send(result);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        let meta = SnapshotMeta { last_log_id: self.last_applied, last_membership: self.membership.clone() };
        let frames = snapshot::encode_hot(&self.last_applied, &self.membership, &read_lock(&self.state));
        SnapshotBuilder {
            db: self.db.clone(),
            meta,
            frames,
            snap_dir: self.snap_dir.clone(),
            snapshot_write: self.snapshot_write.clone(),
            accounting: self.accounting.clone(),
        }
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: SnapshotData) -> Result<(), io::Error> {
        let db = self.db.clone();
        let lock = self.snapshot_write.clone();
        let snap_dir = self.snap_dir.clone();
        let gen = self.accounting.gen.clone();
        let stored_meta = meta.clone();
        let state = tokio::task::spawn_blocking(move || install_files(&db, &lock, &snap_dir, &stored_meta, &snapshot, &gen))
            .await
            .map_err(|e| io_other("install snapshot", e))??;
        self.mark_change(meta.last_log_id);
        *self.write_state()? = state;
        self.membership = meta.last_membership.clone();
        self.set_applied(meta.last_log_id);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let Some((meta, name)) = read_snapshot_record(&self.db)? else { return Ok(None) };
        let path = self.snap_dir.join(&name);
        let file = File::open(&path).map_err(|e| io_other(&format!("open snapshot {name}"), e))?;
        Ok(Some(Snapshot { meta, snapshot: SnapshotData { file, path, accounting: Some(self.accounting.clone()) } }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::log::{StoreBuilder, Suite};
    use openraft::type_config::TypeConfigExt;
    use openraft::vote::RaftLeaderIdExt;
    use openraft::StorageError;

    use super::*;

    type LeaderId = <TypeConfig as openraft::RaftTypeConfig>::LeaderId;

    struct TempStoreBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for TempStoreBuilder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
            let dir = tempfile::tempdir().map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?;
            let (log, sm) = open_store(dir.path()).map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?;
            Ok((dir, log, sm))
        }
    }

    fn log_id(index: u64) -> LogId {
        LogId::new(LeaderId::new_committed(1, 1), index)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_share_wal_syncs_and_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let appends = 200;
        {
            let (mut log, _sm) = open_store(dir.path()).expect("open store");
            let mut flushed = Vec::new();
            for index in 0..appends {
                let (tx, rx) = TypeConfig::oneshot();
                let entry = Entry::new_blank(log_id(index));
                log.append([entry], IOFlushed::signal(tx)).await.expect("append");
                flushed.push(rx);
            }
            for rx in flushed {
                rx.await.expect("callback called").expect("wal synced");
            }
            let syncs = log.wal_syncs();
            assert!((1..=appends).contains(&syncs), "{syncs} syncs");
        }
        let (mut log, _sm) = open_store(dir.path()).expect("reopen store");
        let entries = log.try_get_log_entries(..).await.expect("read log");
        assert_eq!(entries.len() as u64, appends);
        assert_eq!(entries.last().map(|e| e.log_id), Some(log_id(appends - 1)));
        log.truncate_after(Some(log_id(99))).await.expect("truncate");
        log.purge(log_id(9)).await.expect("purge");
        let state = log.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id, Some(log_id(9)));
        assert_eq!(state.last_log_id, Some(log_id(99)));
        let entries = log.try_get_log_entries(0..1000).await.expect("read log");
        assert_eq!(entries.first().map(|e| e.index()), Some(10));
        assert_eq!(entries.len(), 90);
    }

    #[test]
    fn garbage_on_disk_is_an_error_not_a_panic() {
        assert!(decode::<Entry>(&[], "entry").is_err());
        assert!(decode::<Entry>(&[proto::PROTOCOL_VERSION, 0xff, 0xff], "entry").is_err());
        assert!(key_index(&[1, 2, 3]).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_openraft_storage_suite() {
        Suite::test_all(TempStoreBuilder).await.expect("storage suite");
    }
}
