//! The tiered chunk producer every computed view uses for chunks computed one at a time: a
//! view supplies its chunk plan ([`ChunkPlan`]: each chunk's length and `compute(id)`);
//! [`Tiered`] does the rest once: the memory and disk keys of each chunk, the lookup through
//! the tiers (memory, disk cache, compute pool) in the reader's [`ReadCtx`], read-ahead,
//! warming with the lengths of the parts, and whether the chunks are kept on disk.
//!
//! kt-int8, whose one job computes every NUMA part's files of a projection together
//! (siblings) and reads ahead across matrices, keeps a producer of its own.

use std::sync::Arc;

use super::{ChunkProducer, Extent, Tiers, ViewError};
use crate::store::{DiskKey, Group, Priority, ProducerKey, ReadCtx, Warmed};

/// What a view says about its chunks: how long each is and how it is computed.
pub trait ChunkPlan: Send + Sync + 'static {
    /// What the chunks are of (a tensor's name), for messages.
    fn name(&self) -> &str;
    /// The length of chunk `id`.
    fn chunk_len(&self, id: u64) -> u64;
    /// Chunk `id`, computed (a pure function of the plan: it may run twice when hedged).
    fn compute(&self, id: u64) -> Result<Arc<[u8]>, ViewError>;
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

    /// The extent of chunk `id`.
    pub fn extent(self: &Arc<Self>, id: u64) -> Extent {
        Extent::Computed { producer: self.clone(), id, len: self.plan.chunk_len(id) }
    }

    fn group(&self, id: u64) -> Arc<Group<ViewError>> {
        let plan = self.plan.clone();
        let group = Group::single((self.id, id), self.key.chunk(id), move || plan.compute(id));
        Arc::new(if self.persist { group } else { group.memory_only() })
    }
}

impl<P: ChunkPlan> ChunkProducer for Tiered<P> {
    fn chunk(&self, id: u64, ctx: ReadCtx) -> Result<Arc<[u8]>, ViewError> {
        self.tiers.get(&self.group(id), 0, ctx)
    }
    fn ready(&self, id: u64) -> bool {
        self.tiers.in_memory(&(self.id, id))
    }
    fn persistent(&self) -> bool {
        self.persist
    }
    fn warm(&self, id: u64, prio: Priority) -> Result<Warmed, ViewError> {
        self.tiers.warm(&self.group(id), &[self.plan.chunk_len(id)], prio)
    }
    fn prefetch(&self, id: u64, ctx: ReadCtx) {
        self.tiers.prefetch(&self.group(id), 0, ctx);
    }
    fn disk_key(&self, id: u64) -> Option<DiskKey> {
        Some(self.key.chunk(id))
    }
}
