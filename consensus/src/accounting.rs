//! The accounting store: finished jobs moved out of the hot [`ClusterState`] (by a committed
//! `ArchiveJobs`), kept on every voter in RocksDB with indexes for the queries users make, and
//! removed by a committed `PruneAccounting` once past the retention.
//!
//! Written only by the state machine's apply, so every voter holds the same records. Both
//! commands name their jobs and are idempotent (a put of the same record, a delete of a missing
//! one), which is what lets a restart replay the log over a store that is already ahead of the
//! loaded snapshot, and a snapshot stream the store as it is when sent (ZooKeeper's fuzzy
//! snapshot): everything the log holds after the snapshot is applied again on top.
//!
//! Keys start with the store's generation (big-endian `u32`, from `meta/acct_gen`): a received
//! snapshot is written under the next generation and switched to in one synced write, so a crash
//! mid-install leaves the old store whole.
//! - `acct`: `gen ++ job id` → the encoded [`Job`], its environment and script left out (as
//!   Slurm's accounting keeps neither unless asked to);
//! - `acct_idx`: `gen ++ kind ++ key ++ job id` → empty, for kind `u` user, `a` account, `n`
//!   name, `s` state, `r` array (the array's id), and `t` end time (`gen ++ t ++ end_ms ++ id`).
//!
//! [`ClusterState`]: crate::ClusterState

use std::io;

use proto::{Job, JobId, JobQuery, JobState};
use rocksdb::{ColumnFamily, Direction, IteratorMode, ReadOptions, WriteBatch, DB};
use sha2::{Digest, Sha256};

pub const CF_ACCT: &str = "acct";
pub const CF_ACCT_IDX: &str = "acct_idx";

/// Largest accounting record read back.
const RECORD_BYTES_MAX: usize = 4 * 1024 * 1024;

const KIND_USER: u8 = b'u';
const KIND_ACCOUNT: u8 = b'a';
const KIND_NAME: u8 = b'n';
const KIND_STATE: u8 = b's';
const KIND_ARRAY: u8 = b'r';
const KIND_TIME: u8 = b't';

fn io_other(context: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{context}: {e}"))
}

fn cf<'a>(db: &'a DB, name: &str) -> io::Result<&'a ColumnFamily> {
    db.cf_handle(name).ok_or_else(|| io::Error::other(format!("column family '{name}' is missing")))
}

/// What the store keeps of a finished job: everything `sacct` and `corral show` print, without
/// the environment and the script.
pub fn record_of(job: &Job) -> Job {
    let mut record = job.clone();
    let spec = std::sync::Arc::make_mut(&mut record.spec);
    spec.env.clear();
    spec.script = None;
    record
}

fn job_key(gen: u32, id: JobId) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&gen.to_be_bytes());
    key[4..].copy_from_slice(&id.to_be_bytes());
    key
}

/// `gen ++ kind ++ len(u16) ++ value`: the prefix of one index value's entries.
fn index_prefix(gen: u32, kind: u8, value: &[u8]) -> Vec<u8> {
    let len = value.len().min(u16::MAX as usize);
    let mut key = Vec::with_capacity(7 + len + 8);
    key.extend_from_slice(&gen.to_be_bytes());
    key.push(kind);
    key.extend_from_slice(&(len as u16).to_be_bytes());
    key.extend_from_slice(&value[..len]);
    key
}

fn state_value(state: JobState) -> [u8; 1] {
    [state as u8]
}

/// Every index key of `record`.
fn index_keys(gen: u32, record: &Job) -> Vec<Vec<u8>> {
    let id = record.id.to_be_bytes();
    let mut keys = vec![
        index_prefix(gen, KIND_USER, record.spec.user.as_bytes()),
        index_prefix(gen, KIND_NAME, record.spec.name.as_bytes()),
        index_prefix(gen, KIND_STATE, &state_value(record.state)),
    ];
    if let Some(account) = &record.spec.account {
        keys.push(index_prefix(gen, KIND_ACCOUNT, account.as_bytes()));
    }
    if let Some(a) = &record.array {
        keys.push(index_prefix(gen, KIND_ARRAY, &a.array_job.to_be_bytes()));
    }
    let mut time = index_prefix(gen, KIND_TIME, &[]);
    time.extend_from_slice(&record.end_ms.unwrap_or(0).to_be_bytes());
    keys.push(time);
    for key in &mut keys {
        key.extend_from_slice(&id);
    }
    keys
}

fn id_suffix(key: &[u8]) -> io::Result<JobId> {
    let tail = key.len().checked_sub(8).and_then(|at| key.get(at..)).ok_or_else(|| io::Error::other("index key too short"))?;
    let bytes: [u8; 8] = tail.try_into().map_err(|_| io::Error::other("index key too short"))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Adds `records` (already stripped by [`record_of`]) to `batch`: each under its id with its
/// index entries.
pub fn put_records(db: &DB, batch: &mut WriteBatch, gen: u32, records: &[Job]) -> io::Result<()> {
    let (jobs, idx) = (cf(db, CF_ACCT)?, cf(db, CF_ACCT_IDX)?);
    for record in records {
        batch.put_cf(jobs, job_key(gen, record.id), proto::encode(record));
        for key in index_keys(gen, record) {
            batch.put_cf(idx, key, []);
        }
    }
    Ok(())
}

/// Adds the deletion of `ids` (and their index entries) to `batch`; an id with no record is
/// skipped.
pub fn delete_records(db: &DB, batch: &mut WriteBatch, gen: u32, ids: &[JobId]) -> io::Result<()> {
    let (jobs, idx) = (cf(db, CF_ACCT)?, cf(db, CF_ACCT_IDX)?);
    for &id in ids {
        let Some(record) = get(db, gen, id)? else { continue };
        batch.delete_cf(jobs, job_key(gen, id));
        for key in index_keys(gen, &record) {
            batch.delete_cf(idx, key);
        }
    }
    Ok(())
}

/// The record of job `id`, if the store has it.
pub fn get(db: &DB, gen: u32, id: JobId) -> io::Result<Option<Job>> {
    let bytes = db.get_cf(cf(db, CF_ACCT)?, job_key(gen, id)).map_err(|e| io_other("read accounting record", e))?;
    bytes.map(|b| decode_record(&b)).transpose()
}

fn decode_record(bytes: &[u8]) -> io::Result<Job> {
    proto::decode(bytes, RECORD_BYTES_MAX).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decode accounting record: {e}")))
}

/// Deletes every key of generations other than `keep` (what a crash mid-install left, or the
/// generation a finished install replaced).
pub fn drop_other_generations(db: &DB, keep: u32) -> io::Result<()> {
    for name in [CF_ACCT, CF_ACCT_IDX] {
        let handle = cf(db, name)?;
        if keep > 0 {
            db.delete_range_cf(handle, 0u32.to_be_bytes().as_slice(), keep.to_be_bytes().as_slice())
                .map_err(|e| io_other("drop old accounting", e))?;
        }
        if let Some(next) = keep.checked_add(1) {
            db.delete_range_cf(handle, next.to_be_bytes().as_slice(), [0xff; 13].as_slice())
                .map_err(|e| io_other("drop old accounting", e))?;
        }
    }
    Ok(())
}

/// Up to `limit` ids of records that ended before `before_ms`, oldest first.
pub fn ended_before(db: &DB, gen: u32, before_ms: u64, limit: usize) -> io::Result<Vec<JobId>> {
    let prefix = index_prefix(gen, KIND_TIME, &[]);
    let mut upper = prefix.clone();
    upper.extend_from_slice(&before_ms.to_be_bytes());
    let mut ids = Vec::new();
    let mut opts = ReadOptions::default();
    opts.set_iterate_upper_bound(upper);
    for item in db.iterator_cf_opt(cf(db, CF_ACCT_IDX)?, opts, IteratorMode::From(&prefix, Direction::Forward)) {
        let (key, _) = item.map_err(|e| io_other("read accounting index", e))?;
        if ids.len() >= limit {
            break;
        }
        ids.push(id_suffix(&key)?);
    }
    Ok(ids)
}

/// Records of every job in id order, `chunk` at a time, as the store is when called: what a
/// snapshot streams. `f` gets each chunk.
pub fn for_each_chunk(db: &DB, gen: u32, chunk: usize, mut f: impl FnMut(Vec<Job>) -> io::Result<()>) -> io::Result<u64> {
    let start = job_key(gen, 0);
    let mut opts = ReadOptions::default();
    opts.set_iterate_upper_bound(job_key(gen.saturating_add(1), 0).to_vec());
    let mut batch = Vec::with_capacity(chunk);
    let mut count = 0u64;
    for item in db.iterator_cf_opt(cf(db, CF_ACCT)?, opts, IteratorMode::From(&start, Direction::Forward)) {
        let (_, value) = item.map_err(|e| io_other("read accounting", e))?;
        batch.push(decode_record(&value)?);
        count += 1;
        if batch.len() >= chunk {
            f(std::mem::take(&mut batch))?;
        }
    }
    if !batch.is_empty() {
        f(batch)?;
    }
    Ok(count)
}

/// Records in the store and the hex SHA-256 over them in id order: equal on voters that applied
/// the same log (tests compare it across replicas).
pub fn digest(db: &DB, gen: u32) -> io::Result<(u64, String)> {
    let mut hash = Sha256::new();
    let count = for_each_chunk(db, gen, 1024, |records| {
        for r in records {
            hash.update(proto::encode(&r));
        }
        Ok(())
    })?;
    Ok((count, hex::encode(hash.finalize())))
}

/// One page of finished jobs matching `query` (ids above `query.after`), in id order, reading at
/// most `scan_max` records. Returns the matches and, when the scan stopped before the end, the
/// last id it read (the page covers ids up to there only).
pub fn query(db: &DB, gen: u32, query: &JobQuery, limit: usize, scan_max: usize) -> io::Result<(Vec<Job>, Option<JobId>)> {
    if !query.finished || !query.history {
        return Ok((Vec::new(), None));
    }
    if !query.ids.is_empty() {
        return query_ids(db, gen, query, limit);
    }
    let index = if !query.users.is_empty() {
        Some((KIND_USER, query.users.iter().map(|u| u.as_bytes().to_vec()).collect::<Vec<_>>()))
    } else if !query.accounts.is_empty() {
        Some((KIND_ACCOUNT, query.accounts.iter().map(|a| a.as_bytes().to_vec()).collect()))
    } else if !query.names.is_empty() {
        Some((KIND_NAME, query.names.iter().map(|n| n.as_bytes().to_vec()).collect()))
    } else if !query.states.is_empty() {
        Some((KIND_STATE, query.states.iter().map(|s| state_value(*s).to_vec()).collect()))
    } else {
        None
    };
    match index {
        Some((kind, values)) => query_index(db, gen, query, kind, &values, limit, scan_max),
        None => query_scan(db, gen, query, limit, scan_max),
    }
}

/// Ids asked for by name: each one's record and, for an array's id, its tasks' records.
fn query_ids(db: &DB, gen: u32, query: &JobQuery, limit: usize) -> io::Result<(Vec<Job>, Option<JobId>)> {
    let mut found = std::collections::BTreeMap::new();
    for &id in &query.ids {
        if let Some(r) = get(db, gen, id)? {
            found.insert(r.id, r);
        }
        let (tasks, _) = query_index(
            db,
            gen,
            &JobQuery { ids: Vec::new(), ..query.clone() },
            KIND_ARRAY,
            &[id.to_be_bytes().to_vec()],
            limit,
            usize::MAX,
        )?;
        for t in tasks {
            found.insert(t.id, t);
        }
    }
    let mut matches: Vec<Job> = found.into_values().filter(|j| j.id > query.after && query.matches(j)).take(limit + 1).collect();
    if matches.len() > limit {
        matches.truncate(limit);
        let last = matches.last().map(|j| j.id);
        return Ok((matches, last));
    }
    Ok((matches, None))
}

/// Merges the id-ordered entries of each index value, reading each matching record.
fn query_index(
    db: &DB,
    gen: u32,
    query: &JobQuery,
    kind: u8,
    values: &[Vec<u8>],
    limit: usize,
    scan_max: usize,
) -> io::Result<(Vec<Job>, Option<JobId>)> {
    let idx = cf(db, CF_ACCT_IDX)?;
    let mut ids = std::collections::BTreeSet::new();
    let mut stopped_at: Option<JobId> = None;
    for value in values {
        let prefix = index_prefix(gen, kind, value);
        let mut from = prefix.clone();
        from.extend_from_slice(&query.after.saturating_add(1).to_be_bytes());
        let mut taken = 0usize;
        for item in db.prefix_iterator_cf(idx, &from) {
            let (key, _) = item.map_err(|e| io_other("read accounting index", e))?;
            if !key.starts_with(&prefix) || key.len() != prefix.len() + 8 {
                break;
            }
            let id = id_suffix(&key)?;
            if stopped_at.is_some_and(|s| id > s) {
                break;
            }
            ids.insert(id);
            taken += 1;
            if taken >= scan_max {
                stopped_at = Some(stopped_at.map_or(id, |s: JobId| s.min(id)));
                break;
            }
        }
    }
    let mut matches = Vec::new();
    for id in ids {
        if stopped_at.is_some_and(|s| id > s) {
            break;
        }
        let Some(record) = get(db, gen, id)? else { continue };
        if query.matches(&record) {
            matches.push(record);
            if matches.len() >= limit {
                return Ok((matches, Some(id)));
            }
        }
    }
    Ok((matches, stopped_at))
}

/// Reads records in id order from `query.after`, at most `scan_max` of them.
fn query_scan(db: &DB, gen: u32, query: &JobQuery, limit: usize, scan_max: usize) -> io::Result<(Vec<Job>, Option<JobId>)> {
    let start = job_key(gen, query.after.saturating_add(1));
    let mut opts = ReadOptions::default();
    opts.set_iterate_upper_bound(job_key(gen.saturating_add(1), 0).to_vec());
    let mut matches = Vec::new();
    for (scanned, item) in db.iterator_cf_opt(cf(db, CF_ACCT)?, opts, IteratorMode::From(&start, Direction::Forward)).enumerate() {
        let (_, value) = item.map_err(|e| io_other("read accounting", e))?;
        let record = decode_record(&value)?;
        let id = record.id;
        if query.matches(&record) {
            matches.push(record);
            if matches.len() >= limit {
                return Ok((matches, Some(id)));
            }
        }
        if scanned + 1 >= scan_max {
            return Ok((matches, Some(id)));
        }
    }
    Ok((matches, None))
}
