//! What the disk cache holds, as pure data: each block's identity (an object version's id and
//! the block's index, and the file name that spells them), its size on disk, when it was last
//! used, and the eviction order (least recently used first) with the bytes held. No IO: the cache reads and writes the files and keeps this in
//! step, so eviction and accounting are tested here alone.

use std::collections::BTreeMap;
use std::ops::Bound;

/// One block of one object version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct BlockId {
    pub(super) object: [u8; 16],
    pub(super) index: u64,
}

impl BlockId {
    /// The block's file name: the object's id in hex, `-`, the index in hex.
    pub(super) fn file_name(&self) -> String {
        format!("{}-{:x}", hex::encode(self.object), self.index)
    }

    /// The block a file name spells, exactly as [`BlockId::file_name`] writes it; `None` for
    /// anything else (a temporary, a stray file).
    pub(super) fn parse(name: &str) -> Option<BlockId> {
        let (object, index) = name.split_once('-')?;
        let mut id = BlockId { object: [0; 16], index: u64::from_str_radix(index, 16).ok()? };
        hex::decode_to_slice(object, &mut id.object).ok()?;
        (id.file_name() == name).then_some(id)
    }
}

/// A block on disk: its size (with its trailer) and when it was last used.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) bytes: u64,
    used: u64,
}

/// What [`Index::evict_next`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Eviction {
    /// No more than the bound is held.
    WithinBound,
    /// Past the bound, and every block left may not be evicted (pinned, or the one kept).
    OnlyUnevictable,
    /// This block, the least recently used that may be, is no longer in the index.
    Evicted(BlockId),
}

/// What is on disk, in eviction order. Each use has a distinct tick (`used`), so the order
/// is total.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// By identity, in order, so the scrub walks them with a cursor.
    blocks: BTreeMap<BlockId, Held>,
    /// By last use, oldest first.
    order: BTreeMap<u64, BlockId>,
    held: u64,
}

impl Index {
    /// Records block `id`, `bytes` on disk, used at tick `used` (replacing any record of it).
    pub(super) fn insert(&mut self, id: BlockId, bytes: u64, used: u64) {
        self.remove(id);
        self.blocks.insert(id, Held { bytes, used });
        self.order.insert(used, id);
        self.held += bytes;
    }

    pub(super) fn remove(&mut self, id: BlockId) -> Option<Held> {
        let held = self.blocks.remove(&id)?;
        self.order.remove(&held.used);
        self.held -= held.bytes;
        Some(held)
    }

    /// Block `id` was read at tick `now`: it becomes the most recently used.
    pub(super) fn used(&mut self, id: BlockId, now: u64) {
        if let Some(held) = self.blocks.get_mut(&id) {
            self.order.remove(&held.used);
            held.used = now;
            self.order.insert(now, id);
        }
    }

    /// The block held after `after` (the first with `None`), in identity order, and its size
    /// on disk: the scrub's next block.
    pub(super) fn next_after(&self, after: Option<BlockId>) -> Option<(BlockId, u64)> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.blocks.range((from, Bound::Unbounded)).next().map(|(id, held)| (*id, held.bytes))
    }

    pub(super) fn contains(&self, id: BlockId) -> bool {
        self.blocks.contains_key(&id)
    }

    pub(super) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Bytes on disk, trailers included.
    pub(super) fn held(&self) -> u64 {
        self.held
    }

    /// While more than `max_bytes` is held, removes the least recently used block `evictable`
    /// accepts and says which; the caller unlinks its file.
    pub(super) fn evict_next(&mut self, max_bytes: u64, evictable: impl Fn(&BlockId) -> bool) -> Eviction {
        if self.held <= max_bytes {
            return Eviction::WithinBound;
        }
        match self.order.values().copied().find(|id| evictable(id)) {
            Some(victim) => {
                self.remove(victim);
                Eviction::Evicted(victim)
            }
            None => Eviction::OnlyUnevictable,
        }
    }

    /// The bytes of an object of `size` bytes, in blocks of `block_bytes`, whose blocks are
    /// held (the last block may be short).
    pub(super) fn held_of(&self, object: [u8; 16], size: u64, block_bytes: u64) -> u64 {
        (0..size.div_ceil(block_bytes))
            .filter(|&i| self.blocks.contains_key(&BlockId { object, index: i }))
            .map(|i| ((i + 1) * block_bytes).min(size) - i * block_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(object: u8, index: u64) -> BlockId {
        BlockId { object: [object; 16], index }
    }

    #[test]
    fn a_block_s_file_name_reads_back_and_nothing_else_reads_as_a_block() {
        let id = block(0xab, 0x1f);
        assert_eq!(id.file_name(), format!("{}-1f", "ab".repeat(16)));
        assert_eq!(BlockId::parse(&id.file_name()), Some(id));
        for name in [
            "x",
            &format!("{}-1F", "ab".repeat(16)),
            &format!("{}-01f", "ab".repeat(16)),
            &format!("{}-1f", "ab".repeat(15)),
            &format!("{}-1f.tmp", "ab".repeat(16)),
            &format!("{}--1", "ab".repeat(16)),
        ] {
            assert_eq!(BlockId::parse(name), None, "{name}");
        }
    }

    #[test]
    fn eviction_takes_the_least_recently_used_block_it_may_until_the_bound_is_kept() {
        let mut index = Index::default();
        for (tick, id) in [block(1, 0), block(1, 1), block(2, 0), block(3, 0)].into_iter().enumerate() {
            index.insert(id, 10, tick as u64);
        }
        assert_eq!(index.held(), 40);
        // Reading block(1, 0) makes it the most recently used.
        index.used(block(1, 0), 10);
        // Object 2 is pinned: it is passed over.
        let evictable = |id: &BlockId| id.object != [2; 16];
        assert_eq!(index.evict_next(40, evictable), Eviction::WithinBound);
        assert_eq!(index.evict_next(25, evictable), Eviction::Evicted(block(1, 1)));
        assert_eq!(index.evict_next(25, evictable), Eviction::Evicted(block(3, 0)));
        assert_eq!(index.held(), 20);
        assert_eq!(index.evict_next(5, evictable), Eviction::Evicted(block(1, 0)));
        assert_eq!(index.evict_next(5, evictable), Eviction::OnlyUnevictable);
        assert_eq!((index.held(), index.len()), (10, 1));
        assert!(index.contains(block(2, 0)));
    }

    #[test]
    fn a_block_recorded_again_is_counted_once_and_removed_blocks_leave_no_bytes() {
        let mut index = Index::default();
        index.insert(block(1, 0), 10, 0);
        index.insert(block(1, 0), 12, 1);
        assert_eq!((index.held(), index.len()), (12, 1));
        assert_eq!(index.remove(block(1, 0)).map(|h| h.bytes), Some(12));
        assert!(index.remove(block(1, 0)).is_none());
        assert_eq!((index.held(), index.len()), (0, 0));
        assert_eq!(index.evict_next(0, |_| true), Eviction::WithinBound);
    }

    #[test]
    fn an_object_s_held_bytes_count_only_its_blocks_on_disk_and_a_short_last_block() {
        let mut index = Index::default();
        // 25 bytes in blocks of 10: blocks 0, 1 and a last block of 5.
        index.insert(block(1, 0), 18, 0);
        index.insert(block(1, 2), 13, 1);
        index.insert(block(2, 1), 18, 2);
        assert_eq!(index.held_of([1; 16], 25, 10), 15);
        assert_eq!(index.held_of([2; 16], 25, 10), 10);
        assert_eq!(index.held_of([3; 16], 25, 10), 0);
        assert_eq!(index.held_of([1; 16], 0, 10), 0);
    }

    #[test]
    fn the_scrub_walks_every_block_once_in_identity_order_whatever_is_removed_meanwhile() {
        let mut index = Index::default();
        for (tick, id) in [block(2, 0), block(1, 1), block(1, 0), block(3, 5)].into_iter().enumerate() {
            index.insert(id, 10 + tick as u64, tick as u64);
        }
        assert_eq!(index.next_after(None), Some((block(1, 0), 12)));
        assert_eq!(index.next_after(Some(block(1, 0))), Some((block(1, 1), 11)));
        // The cursor's own block gone (evicted, or found damaged), the walk goes on after it.
        index.remove(block(1, 1));
        assert_eq!(index.next_after(Some(block(1, 1))), Some((block(2, 0), 10)));
        assert_eq!(index.next_after(Some(block(2, 0))), Some((block(3, 5), 13)));
        assert_eq!(index.next_after(Some(block(3, 5))), None);
    }
}
