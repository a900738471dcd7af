//! Small JSON files a node keeps beside its runs (run records, reports, the daemon record):
//! written atomically, read with a size limit.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

/// The most any file of a run directory or the daemon record may hold.
pub const RECORD_BYTES_MAX: u64 = 4 << 20;

/// Writes `value` as JSON to `path` atomically (write, then rename). No fsync: these files
/// matter only while this host stays up.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(value).with_context(|| format!("encode {}", path.display()))?;
    std::fs::write(&tmp, bytes).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))
}

/// Reads JSON from `path`, at most [`RECORD_BYTES_MAX`]; none when there is no file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    read_json_max(path, RECORD_BYTES_MAX)
}

/// Reads JSON from `path`, refusing a file over `bytes_max`; none when there is no file.
pub fn read_json_max<T: serde::de::DeserializeOwned>(path: &Path, bytes_max: u64) -> anyhow::Result<Option<T>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("open {}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(bytes_max + 1).read_to_end(&mut bytes).with_context(|| format!("read {}", path.display()))?;
    anyhow::ensure!(bytes.len() as u64 <= bytes_max, "{} exceeds {bytes_max} bytes", path.display());
    Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("decode {}", path.display()))?))
}
