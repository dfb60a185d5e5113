//! A level's wildcard nodes of one key, in file order, with an index over their literal
//! prefixes: the first pattern (in file order) that matches a value is found without trying
//! every pattern.

use fnv::FnvHashMap;

use super::{glob, Node};

/// Wildcard nodes (`value` holding a `*`) in file order. A pattern can only match values that
/// start with its literal prefix (the text before its first `*`), so the index files each
/// pattern under that prefix: a value is tried against the patterns filed under its own
/// prefixes of the lengths some pattern has, lowest file position first, and the lowest
/// position that matches wins, as a scan in file order would decide.
#[derive(Debug, Default)]
pub struct Wildcards(Option<Box<Index>>);

/// The patterns of a key that has some (most keys have none: they cost a pointer).
#[derive(Debug, Default)]
struct Index {
    nodes: Vec<Node>,
    /// Positions in `nodes`, ascending, by their pattern's literal prefix.
    by_prefix: FnvHashMap<Box<[u8]>, Vec<u32>>,
    /// The distinct lengths of those prefixes, ascending.
    lens: Vec<usize>,
}

impl Wildcards {
    /// Adds `node` after the others (its `value` is a pattern).
    pub(crate) fn push(&mut self, node: Node) {
        let ix = self.0.get_or_insert_with(Box::default);
        let pattern = node.value.as_deref().unwrap_or("").as_bytes();
        let prefix = &pattern[..pattern
            .iter()
            .position(|&c| c == b'*')
            .unwrap_or(pattern.len())];
        let at = u32::try_from(ix.nodes.len()).expect("fewer than 2^32 patterns on a key");
        ix.by_prefix.entry(prefix.into()).or_default().push(at);
        if let Err(i) = ix.lens.binary_search(&prefix.len()) {
            ix.lens.insert(i, prefix.len());
        }
        ix.nodes.push(node);
    }

    /// The first node in file order whose pattern matches `value`.
    pub fn find(&self, value: &str) -> Option<&Node> {
        let ix = self.0.as_deref()?;
        let bytes = value.as_bytes();
        let mut best: Option<u32> = None;
        for &len in ix.lens.iter().take_while(|&&len| len <= bytes.len()) {
            let Some(ats) = ix.by_prefix.get(&bytes[..len]) else {
                continue;
            };
            for &at in ats {
                if best.is_some_and(|b| at >= b) {
                    break;
                }
                let node = &ix.nodes[at as usize];
                if glob(node.value.as_deref().unwrap_or(""), value) {
                    best = Some(at);
                    break;
                }
            }
        }
        best.map(|at| &ix.nodes[at as usize])
    }

    /// How many patterns it holds.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |ix| ix.nodes.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The nodes in file order.
    pub fn iter(&self) -> std::slice::Iter<'_, Node> {
        self.0.as_deref().map_or(&[][..], |ix| &ix.nodes[..]).iter()
    }

    pub(crate) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Node> {
        self.0
            .as_deref_mut()
            .map_or(&mut [][..], |ix| &mut ix.nodes[..])
            .iter_mut()
    }

    /// The same nodes, in the least memory.
    pub(crate) fn shrink_to_fit(&mut self) {
        if let Some(ix) = self.0.as_deref_mut() {
            ix.nodes.shrink_to_fit();
            ix.by_prefix.shrink_to_fit();
            ix.lens.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, LoadOptions};

    fn group_of(yaml: &str) -> Config {
        Config::from_sources(&[("t.yaml".into(), yaml.into())], LoadOptions::default()).unwrap()
    }

    /// The first pattern in file order that matches, by a plain scan: what the index must agree
    /// with.
    fn scan<'a>(w: &'a Wildcards, value: &str) -> Option<&'a str> {
        w.iter()
            .find(|n| glob(n.value.as_deref().unwrap(), value))
            .and_then(|n| n.value.as_deref())
    }

    #[test]
    fn the_index_finds_what_a_scan_in_file_order_finds() {
        let patterns = [
            "ab*", "a*", "abc*", "*c", "a*c", "", "b*", "abcd*x", "*", "ab*d", "x*y*z", "ab",
        ];
        let mut yaml = String::from("domain: d\ndescriptors:\n");
        for p in patterns.iter().filter(|p| p.contains('*')) {
            yaml.push_str(&format!("  - key: k\n    value: \"{p}\"\n"));
        }
        let c = group_of(&yaml);
        let w = &c.domains["d"].root.group("k").unwrap().wildcards;
        let values = [
            "", "a", "ab", "abc", "abcd", "abcdx", "abd", "b", "bc", "c", "xyz", "xaybzc", "é*",
            "abé", "zzz",
        ];
        for v in values {
            assert_eq!(
                w.find(v).and_then(|n| n.value.as_deref()),
                scan(w, v),
                "value {v:?}"
            );
        }
        // Without the catch-all, a value no pattern's prefix starts finds nothing.
        let c = group_of(
            "domain: d\ndescriptors:\n  - key: k\n    value: p1-*\n  - key: k\n    value: p2-*\n",
        );
        let w = &c.domains["d"].root.group("k").unwrap().wildcards;
        assert_eq!(
            w.find("p2-x").and_then(|n| n.value.as_deref()),
            Some("p2-*")
        );
        assert!(w.find("p3-x").is_none());
        assert!(w.find("p").is_none());
    }
}
