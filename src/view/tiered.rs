//! The tiered chunk producer every computed view uses: a view supplies its chunk plan
//! ([`ChunkPlan`]: each chunk's length and `compute(id)`, or, for sibling chunks computed
//! by one job, `compute_all()`); [`Tiered`] does the rest once: the memory and disk keys of
//! each chunk and of the job, the lookup through the tiers (memory, disk cache, compute
//! pool) in the reader's [`ReadCtx`], read-ahead, warming with the lengths of the parts, and
//! whether the chunks are kept on disk.

use std::sync::Arc;

use super::{Chunk, ChunkProducer, Extent, Tiers, ViewError};
use crate::store::{DiskKey, Group, Priority, ProducerKey, ReadCtx, Warmed};

/// What a view says about its chunks: how long each is and how it is computed.
pub trait ChunkPlan: Send + Sync + 'static {
    /// What the chunks are of (a tensor's name), for messages.
    fn name(&self) -> &str;
    /// The length of chunk `id`.
    fn chunk_len(&self, id: u64) -> u64;
    /// Chunk `id`, computed (a pure function of the plan: it may run twice when hedged).
    /// Not called for a plan of [`siblings`](ChunkPlan::siblings).
    fn compute(&self, id: u64) -> Result<Arc<[u8]>, ViewError>;
    /// `Some(n)`: chunks `0..n` are siblings, computed together by one job,
    /// [`compute_all`](ChunkPlan::compute_all) (kt-int8: every NUMA part's files of one
    /// projection from one decode); `None` (the default): each chunk by itself.
    fn siblings(&self) -> Option<u64> {
        None
    }
    /// Every sibling chunk, in id order.
    fn compute_all(&self) -> Result<Vec<Arc<[u8]>>, ViewError> {
        Err(ViewError::Internal(format!("{}: not a plan of sibling chunks", self.name())))
    }
    /// After a client's read of chunk `id`: read ahead beyond the file, if the view knows
    /// what comes next (kt-int8: the next matrices).
    fn read_ahead(&self, _id: u64, _ctx: ReadCtx) {}
}

/// The chunks of a [`ChunkPlan`], through the tiers (see the module documentation).
pub struct Tiered<P> {
    plan: Arc<P>,
    tiers: Arc<Tiers>,
    /// The memory tier's producer id.
    id: u64,
    /// The disk-cache key of its chunks: everything their bytes depend on.
    key: ProducerKey,
    /// Kept on disk too (off for source bytes served after a check: the source is their
    /// durable copy).
    persist: bool,
}

impl<P> std::fmt::Debug for Tiered<P>
where
    P: ChunkPlan,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tiered({})", self.plan.name())
    }
}

impl<P: ChunkPlan> Tiered<P> {
    /// The chunks of `plan`, keyed by `key`, kept in memory and in the disk cache.
    pub fn new(plan: P, tiers: &Arc<Tiers>, key: ProducerKey) -> Arc<Self> {
        Arc::new(Tiered { plan: Arc::new(plan), tiers: tiers.clone(), id: tiers.mem.producer_id(), key, persist: true })
    }

    /// The chunks of `plan`, kept in memory only.
    pub fn memory_only(plan: P, tiers: &Arc<Tiers>, key: ProducerKey) -> Arc<Self> {
        Arc::new(Tiered { plan: Arc::new(plan), tiers: tiers.clone(), id: tiers.mem.producer_id(), key, persist: false })
    }

    /// The view's plan.
    pub fn plan(&self) -> &P {
        &self.plan
    }

    /// The extent of chunk `id`.
    pub fn extent(self: &Arc<Self>, id: u64) -> Extent {
        Extent::Computed { producer: self.clone(), id, len: self.plan.chunk_len(id) }
    }

    /// The job that computes chunk `id`, and the chunk's part in it.
    fn group(&self, id: u64) -> (Arc<Group<ViewError>>, usize) {
        let plan = self.plan.clone();
        let (group, part) = match self.plan.siblings() {
            Some(n) => {
                let parts = (0..n).map(|i| ((self.id, i), self.key.chunk(i))).collect();
                (Group::siblings(self.key.group(), parts, move || plan.compute_all()), id as usize)
            }
            None => (Group::single((self.id, id), self.key.chunk(id), move || plan.compute(id)), 0),
        };
        (Arc::new(if self.persist { group } else { group.memory_only() }), part)
    }
}

impl<P: ChunkPlan> ChunkProducer for Tiered<P> {
    fn chunk(&self, id: u64, ctx: ReadCtx) -> Result<Chunk, ViewError> {
        let (group, part) = self.group(id);
        let (bytes, tier) = self.tiers.get(&group, part, ctx)?;
        if ctx.reads_ahead() {
            self.plan.read_ahead(id, ctx);
        }
        Ok(Chunk { bytes, tier })
    }
    fn ready(&self, id: u64) -> bool {
        self.tiers.in_memory(&(self.id, id))
    }
    fn persistent(&self) -> bool {
        self.persist
    }
    fn warm_group(&self, id: u64) -> u64 {
        if self.plan.siblings().is_some() { 0 } else { id }
    }
    fn warm(&self, id: u64, prio: Priority) -> Result<Warmed, ViewError> {
        let lens: Vec<u64> = match self.plan.siblings() {
            Some(n) => (0..n).map(|i| self.plan.chunk_len(i)).collect(),
            None => vec![self.plan.chunk_len(id)],
        };
        self.tiers.warm(&self.group(id).0, &lens, prio)
    }
    fn prefetch(&self, id: u64, ctx: ReadCtx) {
        let (group, part) = self.group(id);
        self.tiers.prefetch(&group, part, ctx);
    }
    fn disk_key(&self, id: u64) -> Option<DiskKey> {
        Some(self.key.chunk(id))
    }
}
