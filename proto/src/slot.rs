//! What an entry of `Allocation::gpus` names: a whole GPU by its index, a MIG instance of a
//! GPU, or shards of a GPU shared with other jobs. One `u32` each, so an allocation stays a
//! list of numbers on the wire and in the log.

/// `Allocation::gpus` entries at or above this name a MIG instance, not a whole GPU:
/// `MIG_SLOT_BASE | gpu_index << 8 | start_slice`. See [`mig_slot`] and [`decode_slot`].
pub const MIG_SLOT_BASE: u32 = 0x8000_0000;

/// `Allocation::gpus` entries with this bit (and not [`MIG_SLOT_BASE`]'s) name shards of a GPU:
/// `SHARD_SLOT_BASE | gpu_index << 16 | shards`. See [`shard_slot`] and [`decode_slot`].
pub const SHARD_SLOT_BASE: u32 = 0x4000_0000;

/// GPUs with an index at or above this have no shards to give: the index must fit 14 bits.
pub const SHARD_GPU_INDEX_LIMIT: u32 = 1 << 14;

/// The `Allocation::gpus` entry for `shards` shards of GPU `gpu` (below
/// [`SHARD_GPU_INDEX_LIMIT`], at most `limits::SHARDS_PER_GPU_MAX` shards).
pub fn shard_slot(gpu: u32, shards: u32) -> u32 {
    assert!(
        gpu < SHARD_GPU_INDEX_LIMIT && shards <= crate::limits::SHARDS_PER_GPU_MAX,
        "shard slot out of range: gpu {gpu} shards {shards}"
    );
    SHARD_SLOT_BASE | (gpu << 16) | shards
}

/// The `Allocation::gpus` entry for the MIG instance starting at `start_slice` of GPU `gpu`.
pub fn mig_slot(gpu: u32, start_slice: u32) -> u32 {
    assert!(gpu < (1 << 20) && start_slice < 256, "mig slot out of range: gpu {gpu} slice {start_slice}");
    MIG_SLOT_BASE | (gpu << 8) | start_slice
}

/// What an `Allocation::gpus` entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slot {
    Gpu(u32),
    Mig {
        gpu: u32,
        start_slice: u32,
    },
    /// `shards` of GPU `gpu`'s `GpuInfo::shards`, beside other jobs' shards of it.
    Shard {
        gpu: u32,
        shards: u32,
    },
}

impl Slot {
    /// The index of the GPU it is on.
    pub fn gpu(self) -> u32 {
        match self {
            Slot::Gpu(gpu) | Slot::Mig { gpu, .. } | Slot::Shard { gpu, .. } => gpu,
        }
    }
}

pub fn decode_slot(id: u32) -> Slot {
    if id & MIG_SLOT_BASE != 0 {
        Slot::Mig { gpu: (id & !MIG_SLOT_BASE) >> 8, start_slice: id & 0xff }
    } else if id & SHARD_SLOT_BASE != 0 {
        Slot::Shard { gpu: (id & !SHARD_SLOT_BASE) >> 16, shards: id & 0xffff }
    } else {
        Slot::Gpu(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_slot_decodes_to_what_made_it() {
        assert_eq!(decode_slot(7), Slot::Gpu(7));
        assert_eq!(decode_slot(mig_slot(3, 4)), Slot::Mig { gpu: 3, start_slice: 4 });
        let top = SHARD_GPU_INDEX_LIMIT - 1;
        assert_eq!(decode_slot(shard_slot(top, crate::limits::SHARDS_PER_GPU_MAX)), Slot::Shard { gpu: top, shards: 65_535 });
        assert_eq!(decode_slot(shard_slot(2, 1)).gpu(), 2);
        assert_eq!(decode_slot(mig_slot(5, 0)).gpu(), 5);
    }
}
