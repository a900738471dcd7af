//! The MIG layouts a pass asks for: GPUs an operator pinned, then layouts chosen from the
//! pending demand, one job at a time. A GPU is re-carved around the instances jobs hold (they
//! stay where they are, so their slots keep naming them): its idle instances and free slices
//! are laid out again, as `nvidia-smi mig` does on a GPU whose other instances run work.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::Pass;
use crate::fit::{is_mig_profile, node_matches};
use crate::mig::{self, Model, Placed, COMPUTE_SLICES};
use crate::view::{GpuSlot, JobRequest};

/// Pending MIG jobs one pass lays out GPUs for, at most: each costs a look at every node.
const MIG_JOBS_PER_PASS_MAX: usize = 64;

/// One instance of a GPU as this pass sees it: held by a job, or promised to a job of this pass.
#[derive(Clone)]
struct Inst {
    placed: Placed,
    taken: bool,
}

/// What re-carving one GPU would give a job: instances of its profile, and the layout.
#[derive(Clone)]
struct Carve {
    gives: u32,
    layout: mig::Layout,
}

/// The cache key of a carve: the model, the held instances (each its start slice and its
/// profile's place in the model's table, a byte each), the profile's place, the count.
type CarveKey = (&'static str, u64, usize, u32);

impl Pass<'_> {
    /// Idle GPUs pinned to a MIG layout they do not have (`corral mig set`) are re-partitioned
    /// into it, before any demand-driven relayout and within the same per-pass bound; a pinned
    /// GPU still running work takes none new meanwhile (`GpuSlot::draining`).
    pub(super) fn pinned_layouts(&mut self) {
        let max = self.view.config.mig_layouts_per_pass_max as usize;
        for node in &self.nodes {
            for g in node.gpus.iter().filter(|g| g.draining() && g.healthy && !g.busy && !g.mig.iter().any(|m| m.busy)) {
                if self.plan.mig_layouts.len() >= max {
                    return;
                }
                if let Some(pinned) = &g.pinned {
                    self.plan.mig_layouts.push((node.id, g.index, pinned.clone()));
                }
            }
        }
    }

    /// Layouts for the pending jobs that ask for a MIG profile, in queue order: each job's
    /// instances on a node come from idle instances of its profile first, then from GPUs
    /// re-carved around what jobs hold, on the nodes that need the fewest GPUs changed and then
    /// have the least room left on those GPUs (best fit: idle GPUs stay whole for the largest
    /// profiles). What one job is given is promised to it for the rest of the pass.
    pub(super) fn mig_relayout(&mut self) {
        let max = self.view.config.mig_layouts_per_pass_max as usize;
        let mut jobs: Vec<usize> = (0..self.view.jobs.len())
            .filter(|&i| {
                let j = &self.view.jobs[i];
                j.gpu_type.as_deref().is_some_and(is_mig_profile)
                    && self.plan.pending.get(&j.id).is_some_and(|r| !r.iter().any(|r| r.starts_with("held for backfill")))
                    && self.eligibility(j).is_empty()
            })
            .collect();
        if jobs.is_empty() {
            return;
        }
        jobs.sort_by_key(|&i| (Reverse(self.prio[i]), self.view.jobs[i].submit_ms, self.view.jobs[i].id));
        let mut layouts: BTreeMap<(usize, u32), Vec<Inst>> = BTreeMap::new();
        let mut cache: BTreeMap<CarveKey, Option<Carve>> = BTreeMap::new();
        for &i in jobs.iter().take(MIG_JOBS_PER_PASS_MAX) {
            if self.plan.mig_layouts.len() >= max {
                break;
            }
            let j = &self.view.jobs[i];
            let Some(profile) = j.gpu_type.clone() else { continue };
            let need = j.gpus_per_node.max(1);
            let mut offers: Vec<(usize, Offer)> = Vec::new();
            for n in 0..self.nodes.len() {
                if let Some(offer) = self.offer(n, j, &profile, need, &layouts, &mut cache) {
                    offers.push((n, offer));
                }
            }
            if offers.len() < j.nodes.max(1) as usize {
                continue;
            }
            offers.sort_by_key(|(n, o)| (o.changes.len(), o.destroys, o.room, *n));
            for (n, offer) in offers.into_iter().take(j.nodes.max(1) as usize) {
                let node = &self.nodes[n];
                let mut left = need;
                // Idle instances of the profile first, then the re-carved GPUs.
                for g in node.gpus.iter() {
                    let insts = layouts.entry((n, g.index)).or_insert_with(|| current(g));
                    for inst in insts.iter_mut().filter(|x| !x.taken && x.placed.profile == profile) {
                        if left == 0 || offer.changes.iter().any(|(gi, _)| *gi == g.index) {
                            break;
                        }
                        inst.taken = true;
                        left -= 1;
                    }
                }
                for (gi, carve) in offer.changes {
                    let mut insts: Vec<Inst> = carve.layout.instances.iter().map(|p| Inst { placed: p.clone(), taken: false }).collect();
                    let held =
                        layouts.get(&(n, gi)).map(|v| v.iter().filter(|x| x.taken).map(|x| x.placed.start_slice).collect::<Vec<_>>());
                    for inst in insts.iter_mut() {
                        if held.as_ref().is_some_and(|h| h.contains(&inst.placed.start_slice)) {
                            inst.taken = true;
                        } else if left > 0 && inst.placed.profile == profile {
                            inst.taken = true;
                            left -= 1;
                        }
                    }
                    self.plan.mig_layouts.push((node.id, gi, carve.layout.profiles()));
                    layouts.insert((n, gi), insts);
                }
            }
        }
    }

    /// How node `n` would serve `need` instances of `profile` for `j`: `None` where it cannot.
    fn offer(
        &self,
        n: usize,
        j: &JobRequest,
        profile: &str,
        need: u32,
        layouts: &BTreeMap<(usize, u32), Vec<Inst>>,
        cache: &mut BTreeMap<CarveKey, Option<Carve>>,
    ) -> Option<Offer> {
        let node = &self.nodes[n];
        let part = self.partition_of(j)?;
        if !self.node_parts[n].contains(&part)
            || node_matches(node, j).is_err()
            || node.cpus_free() < j.cpus_per_node
            || node.mem_free_mib() < j.mem_per_node_mib
        {
            return None;
        }
        let size = node.gpus.iter().find_map(|g| g.model.and_then(|m| m.profile(profile)))?.compute_slices;
        if node.gpus.iter().all(|g| g.busy || !g.mig_enabled) {
            return None;
        }
        let mut have = 0u32;
        // (room, GPU, instances it adds, idle instances it destroys, its carve in `cache`)
        let mut carvable: Vec<(u32, u32, u32, u32, CarveKey)> = Vec::new();
        for g in node.gpus.iter() {
            // A GPU waiting for a layout (asked in an earlier pass, or an operator's) will have
            // its instances of the profile: counted, so a job is not carved a second GPU for.
            if let Some(pinned) = g.pinned.as_ref().filter(|_| g.draining() && g.healthy && !g.busy) {
                let coming = pinned.iter().filter(|p| *p == profile).count() as u32;
                let held = g.mig.iter().filter(|m| m.busy && m.profile == profile).count() as u32;
                have += coming.saturating_sub(held);
                continue;
            }
            let Some(model) =
                g.model.filter(|m| g.mig_enabled && g.healthy && !g.busy && g.pinned.is_none() && m.profile(profile).is_some())
            else {
                continue;
            };
            let overlay = layouts.get(&(n, g.index));
            // One look at its instances, with no copy of them: most GPUs go no further.
            let (mut idle, mut idle_all, mut held) = (0u32, 0u32, 0u32);
            let mut sig = Some(0u64);
            let mut k = 0;
            let mut look = |name: &str, start: u32, taken: bool| {
                if !taken {
                    idle_all += 1;
                    idle += u32::from(name == profile);
                    return;
                }
                held += model.profile(name).map_or(COMPUTE_SLICES, |p| p.compute_slices);
                sig = sig.and_then(|s| carve_sig(model, s, k, name, start));
                k += 1;
            };
            match overlay {
                Some(v) => v.iter().for_each(|x| look(&x.placed.profile, x.placed.start_slice, x.taken)),
                None => g.mig.iter().for_each(|m| look(&m.profile, m.start_slice, m.busy)),
            }
            have += idle;
            let room = COMPUTE_SLICES.saturating_sub(held);
            if room < size {
                continue;
            }
            let (Some(sig), Some(place)) = (sig, profile_place(model, profile)) else { continue };
            let key: CarveKey = (model.name(), sig, place, need);
            let gives = cache
                .entry(key)
                .or_insert_with(|| {
                    let kept: Vec<Placed> = match overlay {
                        Some(v) => v.iter().filter(|x| x.taken).map(|x| x.placed.clone()).collect(),
                        None => current(g).into_iter().filter(|x| x.taken).map(|x| x.placed).collect(),
                    };
                    carve(model, &kept, profile, need)
                })
                .as_ref()
                .map_or(0, |c| c.gives);
            if gives > idle {
                carvable.push((room, g.index, gives - idle, idle_all, key));
            }
        }
        // Those giving the most of what is missing, then destroying the fewest idle instances
        // (free slices are carved before instances are), then with the least room.
        let missing = need.saturating_sub(have);
        carvable.sort_by_key(|&(room, index, gives, destroys, _)| (Reverse(gives.min(missing)), destroys, room, index));
        let mut offer = Offer { changes: Vec::new(), destroys: 0, room: 0 };
        for (room, index, gives, destroys, key) in carvable {
            if have >= need {
                break;
            }
            let Some(Some(c)) = cache.get(&key) else { continue };
            have += gives;
            offer.room += room;
            offer.destroys += destroys;
            offer.changes.push((index, c.clone()));
        }
        (have >= need).then_some(offer)
    }
}

/// A node's way to serve a job: the GPUs to re-carve, the idle instances that destroys, and the
/// compute slices free on them.
struct Offer {
    changes: Vec<(u32, Carve)>,
    destroys: u32,
    room: u32,
}

/// The instances of GPU `g` now, those jobs hold taken.
fn current(g: &GpuSlot) -> Vec<Inst> {
    g.mig
        .iter()
        .map(|m| Inst {
            placed: Placed { profile: m.profile.clone(), start_slice: m.start_slice, size_slices: m.size_slices },
            taken: m.busy,
        })
        .collect()
}

/// `sig` with the `k`th held instance (profile `name` at slice `start`) added, a byte each (its
/// start slice and its profile's place in the table); `None` where the key cannot hold it.
fn carve_sig(model: Model, sig: u64, k: usize, name: &str, start: u32) -> Option<u64> {
    let code = ((profile_place(model, name)? as u64) << 3 | u64::from(start)) + 1;
    (k < 8 && start < 8 && code <= 0xff).then(|| sig | code << (8 * k))
}

/// Where profile `name` is in `model`'s table.
fn profile_place(model: Model, name: &str) -> Option<usize> {
    model.profiles().iter().position(|p| p.name == name)
}

/// The layout of a GPU of `model` re-carved around `kept` for as many of `need` instances of
/// `profile` as fit, and how many it gives beyond `kept`'s. Nothing else is carved: slices no
/// job asks for stay free, for the next job's profile, rather than filled with instances only a
/// re-carve could reclaim (on FGD's default list at 100% load, filling them with the smallest
/// profile placed 86.56% of the GPUs asked, leaving them free 90.32%).
fn carve(model: Model, kept: &[Placed], profile: &str, need: u32) -> Option<Carve> {
    let mut layout = None;
    for k in 1..=need.min(mig::COMPUTE_SLICES) {
        match mig::placeable_with(model, kept, &vec![profile; k as usize]) {
            Ok(l) => layout = Some(l),
            Err(_) => break,
        }
    }
    let layout = layout?;
    let gives = (layout.instances.len() - kept.len()) as u32;
    Some(Carve { gives, layout })
}
