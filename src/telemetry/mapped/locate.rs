//! The line of a key in a mapping file, for errors found after the file parsed: the file is
//! read again by a visitor that stops with an error where the key is, and the parser's error
//! carries that place.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;

use crate::config::yaml_options;

/// The 1-based line of `key` in the `index`-th mapping (in `defaults` when `None`); none when
/// that mapping has no such key.
pub(super) fn line_of(text: &str, index: Option<usize>, key: &str) -> Option<usize> {
    let probe = Probe { index, key };
    let err = serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options(), |d| {
        d.deserialize_map(probe)
    })
    .err()?;
    err.location().map(|l| l.line() as usize)
}

/// Raised where the key (or the mapping) is.
const FOUND: &str = "found";

#[derive(Clone, Copy)]
struct Probe<'a> {
    index: Option<usize>,
    key: &'a str,
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping file")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(k) = map.next_key::<String>()? {
            match (k.as_str(), self.index) {
                ("mappings", Some(i)) => map.next_value_seed(Nth { probe: self, i })?,
                ("defaults", None) => map.next_value_seed(AtKey(self.key))?,
                _ => map.next_value::<IgnoredAny>().map(|_| ())?,
            }
        }
        Ok(())
    }
}

/// The `i`-th element of `mappings`.
struct Nth<'a> {
    probe: Probe<'a>,
    i: usize,
}

impl<'de> DeserializeSeed<'de> for Nth<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Nth<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of mappings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        for _ in 0..self.i {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(AtKey(self.probe.key))?;
        Ok(())
    }
}

/// Stops at `key` in a mapping.
struct AtKey<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for AtKey<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AtKey<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(k) = map.next_key::<String>()? {
            if k == self.0 {
                // An error raised inside the value's own deserialization carries its place.
                map.next_value_seed(FailOnValue)?;
                return Err(de::Error::custom(FOUND));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// Fails on whatever value it is given.
struct FailOnValue;

impl<'de> DeserializeSeed<'de> for FailOnValue {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for FailOnValue {
    type Value = ();

    /// Every visit fails (the default methods refuse every type), with this as its message.
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(FOUND)
    }
}
