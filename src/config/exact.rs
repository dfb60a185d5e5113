//! A level's nodes of one key that name an exact value, found by that value.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::Node;

/// The nodes in a vector, sized to fit once built, and a table of their positions by their
/// value's hash: a table of nodes would hold a node's bytes in each of its spare buckets.
#[derive(Debug, Default)]
pub struct Exact {
    nodes: Vec<Node>,
    by_value: HashTable<u32>,
}

fn hash(value: &str) -> u64 {
    fnv::FnvBuildHasher::default().hash_one(value)
}

fn value_of(n: &Node) -> &str {
    n.value.as_deref().unwrap_or("")
}

impl Exact {
    /// The node of `value`.
    pub fn get(&self, value: &str) -> Option<&Node> {
        let at = self.by_value.find(hash(value), |&at| {
            value_of(&self.nodes[at as usize]) == value
        })?;
        Some(&self.nodes[*at as usize])
    }

    /// Adds `node`; gives it back when its value is here already.
    pub(crate) fn insert(&mut self, node: Node) -> Result<(), Box<Node>> {
        let h = hash(value_of(&node));
        let nodes = &self.nodes;
        if (self.by_value)
            .find(h, |&at| value_of(&nodes[at as usize]) == value_of(&node))
            .is_some()
        {
            return Err(Box::new(node));
        }
        let at = u32::try_from(self.nodes.len()).expect("fewer than 2^32 values on a key");
        let nodes = &self.nodes;
        (self.by_value).insert_unique(h, at, |&at| hash(value_of(&nodes[at as usize])));
        self.nodes.push(node);
        Ok(())
    }

    /// Room for `n` more nodes.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.nodes.reserve_exact(n);
        let nodes = &self.nodes;
        (self.by_value).reserve(n, |&at| hash(value_of(&nodes[at as usize])));
    }

    /// How many nodes it holds.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// How many nodes it has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.nodes.capacity()
    }

    /// The nodes, in the order they were added.
    pub fn values(&self) -> std::slice::Iter<'_, Node> {
        self.nodes.iter()
    }

    pub(crate) fn values_mut(&mut self) -> std::slice::IterMut<'_, Node> {
        self.nodes.iter_mut()
    }

    /// The same nodes in the least memory. The nodes move to a block of their size: a level
    /// built as its file is read grows by doubling, and an allocator may shrink a block in place
    /// and keep its tail (mimalloc does, down to half the block).
    pub(crate) fn shrink_to_fit(&mut self) {
        if self.nodes.capacity() > self.nodes.len() {
            let mut fit = Vec::with_capacity(self.nodes.len());
            fit.append(&mut self.nodes);
            self.nodes = fit;
        }
        let nodes = &self.nodes;
        (self.by_value).shrink_to_fit(|&at| hash(value_of(&nodes[at as usize])));
    }
}
