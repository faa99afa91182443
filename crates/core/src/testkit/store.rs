//! An embedded store that keeps its column families in sorted maps, so that
//! this crate's tests run the write-back cache, native snapshots and
//! restores of [`crate::state::EmbeddedKeyedStateBackend`] without RocksDB
//! (whose own tests, in `tidemark-rocksdb`, hold it to the same behaviour).
//! A native checkpoint is one file, `families`, of the maps.

use crate::dataflow::task::NativeFile;
use crate::model::ids::KeyGroup;
use crate::model::key_group::KeyGroupRange;
use crate::state::store::{
    ColumnFamily, Cursor, Database, EmbeddedStore, MergeFunction, SortedWrites, Write,
};
use crate::state::ttl::Filtered;
use crate::state::StateError;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The file of a native checkpoint.
const FAMILIES: &str = "families";

type Entries = BTreeMap<Vec<u8>, Vec<u8>>;

/// Sorted maps in memory, with working directories under `local_dir`.
#[derive(Debug)]
pub struct MemoryStore {
    local_dir: PathBuf,
    opened: AtomicU64,
    multi_gets: MultiGets,
}

/// What each multi-get of the store's databases read: its column family
/// and the key group of each key, in order.
type MultiGets = Arc<Mutex<Vec<(String, Vec<u16>)>>>;

impl MemoryStore {
    /// A store whose working directories go under `local_dir`.
    pub fn new(local_dir: impl Into<PathBuf>) -> Self {
        MemoryStore {
            local_dir: local_dir.into(),
            opened: AtomicU64::new(0),
            multi_gets: MultiGets::default(),
        }
    }

    /// The key groups each multi-get of column family `family` read, in
    /// order, since the last call: what tests of reading ahead look at.
    pub fn take_multi_gets(&self, family: &str) -> Vec<Vec<u16>> {
        let taken = std::mem::take(&mut *self.multi_gets.lock().unwrap());
        taken
            .into_iter()
            .filter(|(f, _)| f == family)
            .map(|(_, groups)| groups)
            .collect()
    }
}

impl EmbeddedStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn remove_checkpoint(&self, dir: &Path) {
        let _ = fs::remove_dir_all(dir);
    }

    fn local_dir(&self) -> &Path {
        &self.local_dir
    }

    fn open(
        &self,
        label: &str,
        range: KeyGroupRange,
        families: &[ColumnFamily],
        native: Option<&Path>,
    ) -> Result<Box<dyn Database>, StateError> {
        let instance = self.opened.fetch_add(1, Ordering::Relaxed);
        let dir = self.local_dir.join(format!("{label}-{instance}"));
        fs::create_dir_all(&dir).map_err(|e| StateError::io(&dir, e))?;
        let mut db = MemoryDb {
            dir,
            instance,
            multi_gets: self.multi_gets.clone(),
            families: families
                .iter()
                .map(|f| (f.name.clone(), (f.clone(), Entries::new())))
                .collect(),
        };
        if let Some(native) = native {
            db.import(native, range, families)?;
        }
        Ok(Box::new(db))
    }
}

struct MemoryDb {
    dir: PathBuf,
    instance: u64,
    multi_gets: MultiGets,
    families: BTreeMap<String, (ColumnFamily, Entries)>,
}

impl MemoryDb {
    fn family(&self, name: &str) -> &Entries {
        &self.families[name].1
    }
}

impl Drop for MemoryDb {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Database for MemoryDb {
    fn working_dir(&self) -> &Path {
        &self.dir
    }

    fn instance(&self) -> u64 {
        self.instance
    }

    fn create_family(&mut self, family: &ColumnFamily) -> Result<(), StateError> {
        self.families
            .entry(family.name.clone())
            .or_insert_with(|| (family.clone(), Entries::new()));
        Ok(())
    }

    fn get(
        &self,
        family: &str,
        key: &[u8],
        found: &mut dyn FnMut(&[u8]),
    ) -> Result<(), StateError> {
        if let Some(value) = self.family(family).get(key) {
            found(value);
        }
        Ok(())
    }

    fn multi_get(
        &self,
        family: &str,
        keys: &[&[u8]],
        found: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StateError> {
        let groups = keys.iter().map(|k| u16::from_be_bytes([k[0], k[1]]));
        let read = (family.to_owned(), groups.collect());
        self.multi_gets.lock().unwrap().push(read);
        for (i, key) in keys.iter().enumerate() {
            self.get(family, key, &mut |value| found(i, value))?;
        }
        Ok(())
    }

    /// Merge operands are combined as they are written.
    fn write(&mut self, family: &str, writes: &SortedWrites) -> Result<(), StateError> {
        let (family, entries) = self.families.get_mut(family).expect("declared");
        let merge: &Option<MergeFunction> = &family.merge;
        for write in writes.iter() {
            match write {
                Write::Put(key, value) => {
                    entries.insert(key.to_vec(), value.to_vec());
                }
                Write::Merge(key, operand) => {
                    let merge = merge.as_ref().expect("merges go to reducing states");
                    let stored = entries.get(key).map(Vec::as_slice);
                    let merged = merge(stored, &mut std::iter::once(operand))
                        .ok_or_else(|| StateError::Store(format!("memory: merge of {key:?}")))?;
                    entries.insert(key.to_vec(), merged);
                }
                Write::Delete(key) => {
                    entries.remove(key);
                }
            }
        }
        Ok(())
    }

    fn replace(&mut self, family: &str, writes: &SortedWrites) -> Result<(), StateError> {
        self.families.get_mut(family).expect("declared").1.clear();
        self.write(family, writes)
    }

    fn checkpoint(&mut self, _: &[&str], into: &Path) -> Result<Vec<NativeFile>, StateError> {
        let maps: BTreeMap<&String, &Entries> =
            self.families.iter().map(|(n, (_, e))| (n, e)).collect();
        let bytes = rmp_serde::to_vec(&maps).expect("maps serialize to memory");
        fs::create_dir(into).map_err(|e| StateError::io(into, e))?;
        let file = into.join(FAMILIES);
        fs::write(&file, &bytes).map_err(|e| StateError::io(&file, e))?;
        Ok(vec![NativeFile {
            name: FAMILIES.into(),
            size: bytes.len() as u64,
        }])
    }

    fn import(
        &mut self,
        dir: &Path,
        range: KeyGroupRange,
        families: &[ColumnFamily],
    ) -> Result<(), StateError> {
        let file = dir.join(FAMILIES);
        let bytes = fs::read(&file).map_err(|e| StateError::io(&file, e))?;
        let maps: BTreeMap<String, Entries> =
            rmp_serde::from_slice(&bytes).map_err(|e| StateError::Decode(e.to_string()))?;
        for (name, entries) in maps {
            if !families.iter().any(|f| f.name == name) {
                if entries.is_empty() {
                    continue;
                }
                return Err(StateError::UnknownState(name));
            }
            let owned = entries.into_iter().filter(|(key, _)| {
                range.contains(KeyGroup(u32::from(u16::from_be_bytes([key[0], key[1]]))))
            });
            let (_, to) = self.families.get_mut(&name).expect("declared");
            to.extend(owned);
        }
        fs::remove_dir_all(dir).map_err(|e| StateError::io(dir, e))
    }

    fn scan<'a>(&'a self, family: &str) -> Box<dyn Cursor + 'a> {
        Box::new(Scan(self.family(family).iter()))
    }

    fn compact(&mut self) -> Result<(), StateError> {
        let mut out = Vec::new();
        for (family, entries) in self.families.values_mut() {
            let Some(filter) = &family.ttl else { continue };
            entries.retain(|_, value| match filter(value, &mut out) {
                Filtered::Keep => true,
                Filtered::Remove => false,
                Filtered::Change => {
                    value.clone_from(&out);
                    true
                }
            });
        }
        Ok(())
    }
}

struct Scan<'a>(std::collections::btree_map::Iter<'a, Vec<u8>, Vec<u8>>);

impl Cursor for Scan<'_> {
    fn next_entry(&mut self) -> Option<(&[u8], &[u8])> {
        self.0.next().map(|(k, v)| (k.as_slice(), v.as_slice()))
    }
}
