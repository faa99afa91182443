//! What the end-to-end tests check wordcount's committed output against,
//! computed here from the generator's definition, independently of the
//! runtime.

use std::collections::HashMap;
use std::path::Path;

/// SplitMix64, written out again so that the tests do not trust the
/// runtime's copy.
fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn expected_counts(records: u64, keys: u64, seed: u64) -> HashMap<u64, u64> {
    let mut counts = HashMap::new();
    for i in 0..records {
        *counts.entry(mix(seed, i) % keys).or_insert(0) += 1;
    }
    counts
}

/// Lines of the committed files: those directly in `dir` whose names do not
/// start with `.` or `_`.
pub fn committed(dir: &Path) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let (k, c) = line.split_once(',').expect("key,count");
            out.push((k.parse().unwrap(), c.parse().unwrap()));
        }
    }
    out
}

/// With `--emit updates`, exactly once means every key's counts are exactly
/// 1..=c(key): no duplicate, no gap, no stranger.
pub fn assert_updates_exactly_once(dir: &Path, records: u64, keys: u64, seed: u64, context: &str) {
    let expected = expected_counts(records, keys, seed);
    let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
    for (k, c) in committed(dir) {
        seen.entry(k).or_default().push(c);
    }
    assert_eq!(seen.len(), expected.len(), "{context}: keys in the output");
    for (key, mut counts) in seen {
        counts.sort_unstable();
        let want: Vec<u64> = (1..=expected[&key]).collect();
        if counts != want {
            let dups = counts.windows(2).filter(|w| w[0] == w[1]).count();
            panic!(
                "{context}: key {key} has {} counts for {} records ({dups} duplicates)",
                counts.len(),
                want.len()
            );
        }
    }
}

/// Copies a directory tree, so that each restore works on its own copy: a
/// restored job checkpoints into its directory and may subsume, or a test
/// delete, the original.
#[allow(dead_code)]
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
