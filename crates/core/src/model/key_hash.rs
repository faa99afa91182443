//! The key hash behind key groups, version [`KEY_HASH_VERSION`]: a stable
//! function of a key's value, the same on every platform, toolchain and
//! dependency version, as Flink relies on Java's specified `hashCode`.
//!
//! A key is hashed through its `Serialize` implementation, with a fixed
//! encoding and no allocation: every integer as its value widened to 64
//! bits (so `usize` is the same on 32- and 64-bit targets), floats by their
//! bits, strings and byte arrays as their length and then their bytes in
//! little-endian 8-byte words, sequences and maps as their length then
//! their elements, enums by variant index; struct and field names do not
//! count. The words are mixed as FxHash 1 mixes them
//! (`(h.rotl(5) ^ w) * 0x517cc1b727220a95`, written out here rather than
//! taken from a crate whose algorithm may change) and the result goes
//! through MurmurHash3's 64-bit finaliser. Integer keys take the fast path
//! the encoding gives them: one mixing step.

use serde::ser::{self, Serialize};
use std::fmt;

/// The scheme recorded in every checkpoint; a restore refuses another.
pub const KEY_HASH_VERSION: u32 = 1;

/// The hash of `key`'s value; see the module documentation.
#[inline]
pub fn stable_hash<K: Serialize + ?Sized>(key: &K) -> u64 {
    let mut hasher = StableHasher(0);
    // The hasher never fails; a key whose `Serialize` fails (a custom
    // implementation's error) hashes what it wrote before failing.
    let _ = key.serialize(&mut hasher);
    fmix64(hasher.0)
}

/// MurmurHash3's 64-bit finaliser.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

struct StableHasher(u64);

impl StableHasher {
    #[inline]
    fn word(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.word(bytes.len() as u64);
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.word(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(last));
        }
    }
}

/// Never raised: the hasher accepts everything.
#[derive(Debug)]
struct Never;

impl fmt::Display for Never {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a custom Serialize implementation failed")
    }
}

impl std::error::Error for Never {}

impl ser::Error for Never {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Never
    }
}

type Done = Result<(), Never>;

impl ser::Serializer for &mut StableHasher {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Done {
        self.word(u64::from(v));
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Done {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Done {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Done {
        self.serialize_i64(i64::from(v))
    }
    #[inline]
    fn serialize_i64(self, v: i64) -> Done {
        self.word(v as u64);
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Done {
        self.word(v as u64);
        self.word((v >> 64) as u64);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Done {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Done {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Done {
        self.serialize_u64(u64::from(v))
    }
    #[inline]
    fn serialize_u64(self, v: u64) -> Done {
        self.word(v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Done {
        self.word(v as u64);
        self.word((v >> 64) as u64);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Done {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Done {
        self.word(v.to_bits());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Done {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_str(self, v: &str) -> Done {
        self.bytes(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Done {
        self.bytes(v);
        Ok(())
    }
    fn serialize_none(self) -> Done {
        self.word(0);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        self.word(1);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Done {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Done {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, index: u32, _: &'static str) -> Done {
        self.serialize_u32(index)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Done {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        value: &T,
    ) -> Done {
        self.word(u64::from(index));
        value.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self, Never> {
        self.word(len.map_or(u64::MAX, |n| n as u64));
        Ok(self)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, Never> {
        self.word(u64::from(index));
        Ok(self)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self, Never> {
        self.serialize_seq(len)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Never> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, Never> {
        self.word(u64::from(index));
        Ok(self)
    }
}

/// Elements, fields and entries are hashed in order, one after the other.
macro_rules! in_order {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for &mut StableHasher {
            type Ok = ();
            type Error = Never;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
                value.serialize(&mut **self)
            }
            fn end(self) -> Done {
                Ok(())
            }
        }
    )*};
}

in_order!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for &mut StableHasher {
    type Ok = ();
    type Error = Never;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
        key.serialize(&mut **self)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(&mut **self)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

/// Struct fields count by position, not by name.
macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for &mut StableHasher {
            type Ok = ();
            type Error = Never;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Done {
                value.serialize(&mut **self)
            }
            fn end(self) -> Done {
                Ok(())
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned: a change here moves every key of every existing checkpoint
    /// and savepoint to another key group, so it needs a new
    /// `KEY_HASH_VERSION`.
    #[test]
    fn the_hash_of_sample_keys_of_every_supported_type_is_pinned() {
        #[derive(serde::Serialize)]
        struct Account {
            region: u16,
            id: String,
        }
        #[derive(serde::Serialize)]
        enum Side {
            Buy(u64),
        }
        let hashes = [
            stable_hash(&0u64),
            stable_hash(&42u64),
            stable_hash(&42u32),
            stable_hash(&42usize),
            stable_hash(&-42i64),
            stable_hash("key-42"),
            stable_hash(&String::from("key-42")),
            stable_hash(serde_bytes::Bytes::new(b"\x00\x01\x02")),
            stable_hash(&(7u64, "seven")),
            stable_hash(&Some(3u8)),
            stable_hash(&vec![1u64, 2, 3]),
            stable_hash(&Account {
                region: 3,
                id: "acme".into(),
            }),
            stable_hash(&Side::Buy(9)),
            stable_hash(&1.5f64),
            stable_hash(&'x'),
            stable_hash(&true),
        ];
        assert_eq!(
            hashes,
            [
                0x0,
                0x2558_5839_4b61_ab76,
                0x2558_5839_4b61_ab76,
                0x2558_5839_4b61_ab76,
                0xc6fb_dedb_7ff5_25f1,
                0x504c_2bc7_62c2_c456,
                0x504c_2bc7_62c2_c456,
                0xf89b_c3bb_9b74_a018,
                0xdef1_a62f_ecd3_3427,
                0x15b5_ee47_2c1a_5f5e,
                0xdfe8_f402_56f1_a5ba,
                0x00ba_b927_d786_2dfc,
                0x7878_dbb8_3af2_a23c,
                0xf2e6_4dad_c51c_7988,
                0xb5fb_207b_6a6e_b90e,
                0x37e8_d294_6949_7cd2,
            ],
            "pinned hashes changed: {hashes:#x?}"
        );
    }

    #[test]
    fn integers_hash_by_value_whatever_their_width() {
        assert_eq!(stable_hash(&42u64), stable_hash(&42u32));
        assert_eq!(stable_hash(&42u64), stable_hash(&42usize));
        assert_eq!(stable_hash(&42u64), stable_hash(&42u8));
        assert_eq!(stable_hash("key-42"), stable_hash(&String::from("key-42")));
        assert_ne!(stable_hash(&1u64), stable_hash(&2u64));
        assert_ne!(stable_hash("ab"), stable_hash("ab\0"));
    }
}
