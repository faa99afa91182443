//! Reading the state of due timers' keys ahead of firing them, on an
//! embedded backend. A watermark that makes many timers due fires them in
//! time order, which is random order to a store sorted by key: the keys of
//! one time, read ahead together, found about one key per data block and
//! decompressed a block for each. Taking the next keys due a chunk at a
//! time, sorted by key group, and reading a slice of the chunk each turn
//! while earlier ones fire, reads each block once for all the chunk's keys
//! in it. The heap needs none of it, nor a cache that holds every value.

use crate::state::{Key, KeySlot, KeyedStateBackend};

/// The keys due next, read ahead of firing a slice a turn.
pub(crate) struct DueReads<K> {
    /// The chunk being read, sorted by key group.
    chunk: Vec<K>,
    /// How many of `chunk` were read.
    read: usize,
    /// Due keys, from the next to fire on, that chunks took.
    ahead: usize,
    slots: Vec<KeySlot>,
}

impl<K: Key> DueReads<K> {
    /// Keys a chunk takes: with 10,000,000 held timers on RocksDB, about a
    /// dozen of a chunk's keys share a data block.
    pub(crate) const CHUNK: usize = 1 << 16;
    /// Keys read in one turn: twice what a turn fires, so that reading
    /// keeps a chunk ahead of firing, in a few milliseconds.
    pub(crate) const SLICE: usize = 1 << 11;

    pub(crate) fn new() -> Self {
        DueReads {
            chunk: Vec::new(),
            read: 0,
            ahead: 0,
            slots: Vec::new(),
        }
    }

    /// Before a turn of firing: reads the next slice of the chunk, first
    /// taking a new chunk from `due` (the keys due, in firing order, from
    /// the next to fire on) once the last one is read and at most a chunk
    /// is ahead of firing.
    pub(crate) fn turn<'k>(
        &mut self,
        states: &mut KeyedStateBackend<K>,
        due: impl Iterator<Item = &'k K>,
    ) where
        K: 'k,
    {
        if !states.reads_on_miss() {
            return;
        }
        if self.read == self.chunk.len() && self.ahead <= Self::CHUNK {
            self.chunk.clear();
            self.read = 0;
            self.chunk
                .extend(due.skip(self.ahead).take(Self::CHUNK).cloned());
            self.ahead += self.chunk.len();
            self.chunk
                .sort_by_cached_key(|key| states.locate(key).group);
        }
        let end = self.chunk.len().min(self.read + Self::SLICE);
        if end > self.read {
            states.prepare(&self.chunk[self.read..end], &mut self.slots);
            self.read = end;
        }
    }

    /// `fired` due keys were visited since the last turn.
    pub(crate) fn fired(&mut self, fired: usize) {
        self.ahead = self.ahead.saturating_sub(fired);
    }

    /// Every due timer fired: what comes due next starts a chunk.
    pub(crate) fn clear(&mut self) {
        self.chunk.clear();
        self.read = 0;
        self.ahead = 0;
    }
}
