//! A node's GPUs counted in the units a job asks: whole GPUs of a type, MIG instances of a
//! profile, or GPUs with enough free shards (`--gres=shard:N`); and what a node has free once
//! some of its allocations end, for backfill reservations and preemption.

use proto::Allocation;

use crate::view::{decode_slot, GpuSlot, JobRequest, NodeView, Slot};

/// Type id of "any whole GPU".
pub(crate) const ANY: u16 = 0;

/// The pass's GPU types by id: each one's name (a GRES type or a MIG profile; [`ANY`]'s is
/// empty) and whether it is a MIG profile.
#[derive(Clone, Copy)]
pub(crate) struct Kinds<'a> {
    pub names: &'a [String],
    pub is_mig: &'a [bool],
}

impl Kinds<'_> {
    /// Free units of type `tid` on a node: whole GPUs, or MIG instances of a profile.
    pub fn free(&self, node: &NodeView, tid: u16) -> u32 {
        self.count(node, tid, true)
    }

    /// Units of type `tid` on a node, free or not (healthy ones).
    pub fn total(&self, node: &NodeView, tid: u16) -> u32 {
        self.count(node, tid, false)
    }

    fn count(&self, node: &NodeView, tid: u16, only_free: bool) -> u32 {
        let t = tid as usize;
        if self.is_mig[t] {
            node.gpus
                .iter()
                .filter(|g| g.healthy && g.mig_enabled && !(only_free && g.draining()))
                .flat_map(|g| g.mig.iter())
                .filter(|m| (!only_free || !m.busy) && m.profile == self.names[t])
                .count() as u32
        } else {
            node.gpus.iter().filter(|g| self.whole(g, tid) && (!only_free || g.free())).count() as u32
        }
    }

    /// A healthy GPU outside MIG mode of type `tid` (any for [`ANY`]).
    pub fn whole(&self, g: &GpuSlot, tid: u16) -> bool {
        g.healthy && !g.mig_enabled && (tid == ANY || g.gres_type == self.names[tid as usize])
    }

    /// Whole GPUs or MIG instances of type `tid` that `alloc` frees on `node` when it ends.
    /// Shards free no whole GPU by themselves: [`Freeing`] counts those on the GPUs' state.
    pub fn freed(&self, node: &NodeView, alloc: &Allocation, tid: u16) -> u32 {
        let t = tid as usize;
        alloc
            .gpus
            .iter()
            .filter(|&&s| match decode_slot(s) {
                Slot::Gpu(i) => !self.is_mig[t] && node.gpus.iter().any(|g| g.index == i && self.whole(g, tid)),
                Slot::Mig { gpu, start_slice } => {
                    self.is_mig[t]
                        && node
                            .gpus
                            .iter()
                            .any(|g| g.index == gpu && g.mig.iter().any(|m| m.start_slice == start_slice && m.profile == self.names[t]))
                }
                Slot::Shard { .. } => false,
            })
            .count() as u32
    }

    /// GPUs of type `tid` with at least `shards` shards free now (`only_free`) or configured.
    pub fn shard_gpus(&self, node: &NodeView, tid: u16, shards: u32, only_free: bool) -> u32 {
        node.gpus
            .iter()
            .filter(|g| self.whole(g, tid) && if only_free { g.shards_free() >= shards } else { g.shards_total >= shards })
            .count() as u32
    }

    /// The units `j` asks of a node free now: GPUs with its shards free for a shard job, else
    /// [`Kinds::free`].
    pub fn units_free(&self, node: &NodeView, j: &JobRequest, tid: u16) -> u32 {
        match j.shards_per_node {
            0 => self.free(node, tid),
            n => self.shard_gpus(node, tid, n, true),
        }
    }

    /// The units `j` asks of a node, free or not.
    pub fn units_total(&self, node: &NodeView, j: &JobRequest, tid: u16) -> u32 {
        match j.shards_per_node {
            0 => self.total(node, tid),
            n => self.shard_gpus(node, tid, n, false),
        }
    }

    /// The units one node of `j` needs: one GPU for a shard job.
    pub fn units_needed(j: &JobRequest) -> u32 {
        if j.shards_per_node > 0 {
            1
        } else {
            j.gpus_per_node
        }
    }
}

/// What a node has free for a job as its allocations end one by one: units of the job's kind,
/// CPUs and memory. Where shards are involved (a shard job, or shards held on the node) a
/// copy of the node, made at the first release, is given each allocation back and counted
/// again; else the count is kept by [`Kinds::freed`] alone, without a copy.
pub(crate) struct Freeing<'a> {
    kinds: Kinds<'a>,
    node: &'a NodeView,
    job: &'a JobRequest,
    tid: u16,
    exact: bool,
    copy: Option<NodeView>,
    pub units: u32,
    pub cpus: u32,
    pub mem_mib: u64,
}

impl<'a> Freeing<'a> {
    pub fn new(kinds: Kinds<'a>, node: &'a NodeView, job: &'a JobRequest, tid: u16) -> Freeing<'a> {
        let exact = job.shards_per_node > 0 || node.gpus.iter().any(|g| g.shards_used > 0);
        Freeing {
            kinds,
            node,
            job,
            tid,
            exact,
            copy: None,
            units: kinds.units_free(node, job, tid),
            cpus: node.cpus_free(),
            mem_mib: node.mem_free_mib(),
        }
    }

    /// `alloc` has ended: what it held is free.
    pub fn release(&mut self, alloc: &Allocation) {
        self.cpus = self.cpus.saturating_add(alloc.cpus);
        self.mem_mib = self.mem_mib.saturating_add(alloc.mem_mib);
        if !self.exact {
            self.units = self.units.saturating_add(self.kinds.freed(self.node, alloc, self.tid));
            return;
        }
        let copy = self.copy.get_or_insert_with(|| self.node.clone());
        copy.give_back(alloc);
        self.units = self.kinds.units_free(copy, self.job, self.tid);
    }

    /// Whether what is free now holds one node's share of the job.
    pub fn enough(&self) -> bool {
        self.units >= Kinds::units_needed(self.job) && self.cpus >= self.job.cpus_per_node && self.mem_mib >= self.job.mem_per_node_mib
    }
}
