//! B-tree node encoding. A node fills one `NODE_BYTES` block:
//! header, then `level: u8`, `count: u16`, then `count` entries. Leaves (level 0) hold
//! elements, packed since format version 6 (see `leaf`); internal nodes hold (first key of
//! child, child address) pairs.

use super::coding::{Reader, Writer};
use super::leaf::Leaf;
use super::record::{Element, Key};
use super::{
    open_block, seal_block, BlockHeader, BlockType, Expect, VolumeId, FORMAT_VERSION, HEADER_BYTES,
    NODE_BYTES,
};
use crate::error::{Error, Result};

/// Payload bytes available in a node.
pub const NODE_PAYLOAD_BYTES: usize = NODE_BYTES - HEADER_BYTES - 3;
pub const CHILD_ENTRY_BYTES: usize = Key::ENCODED_BYTES + 8;
pub const LEVEL_MAX: u8 = 32;
/// The first format version whose leaves hold packed elements; older leaves hold elements
/// as section 6 of format.md encodes them (and are packed when read).
pub const PACKED_LEAF_VERSION: u16 = 6;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Leaf(Leaf),
    /// `level` >= 1; children are (first key, address), sorted.
    Internal {
        level: u8,
        children: Vec<(Key, u64)>,
    },
}

impl Node {
    pub fn level(&self) -> u8 {
        match self {
            Node::Leaf(_) => 0,
            Node::Internal { level, .. } => *level,
        }
    }

    pub fn first_key(&self) -> Option<Key> {
        match self {
            Node::Leaf(leaf) => leaf.first_key(),
            Node::Internal { children, .. } => children.first().map(|c| c.0),
        }
    }

    /// A leaf of `elements` (in ascending key order).
    pub fn leaf(elements: &[Element]) -> Node {
        Node::Leaf(Leaf::from_elements(elements))
    }

    /// Payload bytes as a commit counts them against `NODE_PAYLOAD_BYTES`.
    pub fn payload_bytes(&self) -> usize {
        match self {
            Node::Leaf(leaf) => leaf.packed().len(),
            Node::Internal { children, .. } => children.len() * CHILD_ENTRY_BYTES,
        }
    }

    /// Memory held by a decoded node (for the cache budget).
    pub fn memory_bytes(&self) -> usize {
        match self {
            Node::Leaf(leaf) => leaf.memory_bytes() + std::mem::size_of::<Node>(),
            Node::Internal { children, .. } => {
                children.len() * std::mem::size_of::<(Key, u64)>() + std::mem::size_of::<Node>()
            }
        }
    }

    pub fn encode(&self, volume_id: VolumeId, tid: u64, address: u64) -> Vec<u8> {
        debug_assert!(self.check_order().is_ok());
        let mut w = Writer::with_capacity(NODE_BYTES);
        w.u8(self.level());
        let block_type = match self {
            Node::Leaf(leaf) => {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "a node's payload is at most 16 KiB (asserted below), so it holds \
                              fewer than 65536 elements"
                )]
                w.u16(leaf.len() as u16);
                w.raw(leaf.packed());
                BlockType::Leaf
            }
            Node::Internal { children, .. } => {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "a node's payload is at most 16 KiB (asserted below), so it holds \
                              fewer than 65536 children"
                )]
                w.u16(children.len() as u16);
                for (key, child) in children {
                    key.encode(&mut w);
                    w.u64(*child);
                }
                BlockType::Internal
            }
        };
        assert!(
            w.len() <= NODE_BYTES - HEADER_BYTES,
            "node overflow: {} bytes",
            w.len()
        );
        let header = BlockHeader {
            version: FORMAT_VERSION,
            block_type,
            volume_id,
            tid,
            address,
            payload_bytes: 0, // seal_block writes the payload's length
        };
        seal_block(&header, &w.bytes, NODE_BYTES)
    }

    /// Decodes a node read from `address`, expecting it at `level` (None: any level).
    pub fn decode(
        bytes: &[u8],
        volume_id: &VolumeId,
        address: u64,
        level: Option<u8>,
    ) -> Result<(Node, u64)> {
        let location = || format!("node at byte {address}");
        let block_type = match level {
            Some(0) => BlockType::Leaf,
            Some(_) => BlockType::Internal,
            None if bytes.len() > HEADER_BYTES + 6 && bytes[6] == BlockType::Leaf as u8 => {
                BlockType::Leaf
            }
            None => BlockType::Internal,
        };
        let expect = Expect {
            block_type,
            volume_id: Some(volume_id),
            address,
        };
        let (header, payload) = open_block(bytes, &expect)?;
        let mut r = Reader::new(payload, "node");
        let node_level = r.u8()?;
        let count = r.u16()? as usize;
        if level.is_some_and(|l| l != node_level) || node_level > LEVEL_MAX {
            return Err(Error::corrupt(
                format!("unexpected node level {node_level}"),
                location(),
            ));
        }
        if (node_level == 0) != (block_type == BlockType::Leaf) {
            return Err(Error::corrupt(
                "level does not match block type",
                location(),
            ));
        }
        if node_level == 0 {
            let leaf = if header.version >= PACKED_LEAF_VERSION {
                let rest = r.remaining();
                Leaf::from_packed(r.take(rest)?, count).map_err(|e| match e {
                    Error::Corrupt { what, .. } => Error::corrupt(what, location()),
                    other => other,
                })?
            } else {
                // Each element takes at least 36 bytes; bound the count before allocating.
                if count > payload.len() / 36 {
                    return Err(Error::corrupt("element count out of range", location()));
                }
                let mut elements = Vec::with_capacity(count);
                for _ in 0..count {
                    elements.push(Element::decode(&mut r)?);
                }
                if !elements.windows(2).all(|w| w[0].key < w[1].key) {
                    return Err(Error::corrupt("keys out of order", location()));
                }
                Leaf::from_elements(&elements)
            };
            return Ok((Node::Leaf(leaf), header.tid));
        }
        let node = {
            if count == 0 || count > payload.len() / CHILD_ENTRY_BYTES {
                return Err(Error::corrupt("child count out of range", location()));
            }
            let mut children = Vec::with_capacity(count);
            for _ in 0..count {
                let key = Key::decode(&mut r)?;
                children.push((key, r.u64()?));
            }
            Node::Internal {
                level: node_level,
                children,
            }
        };
        node.check_order()
            .map_err(|what| Error::corrupt(what, location()))?;
        Ok((node, header.tid))
    }

    /// Keys strictly ascending.
    pub fn check_order(&self) -> std::result::Result<(), String> {
        let ascending = match self {
            Node::Leaf(leaf) => (1..leaf.len()).all(|i| leaf.key(i - 1) < leaf.key(i)),
            Node::Internal { children, .. } => children.windows(2).all(|w| w[0].0 < w[1].0),
        };
        if ascending {
            Ok(())
        } else {
            Err("keys out of order".to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{rtype, Payload};

    #[test]
    fn round_trip_and_bounds() {
        let elements: Vec<Element> = (0..100)
            .map(|i| Element {
                key: Key {
                    obj: 2,
                    rtype: rtype::DATA,
                    key: i * 65536,
                    create_tid: 1,
                },
                delete_tid: 0,
                payload: Payload::Inline(vec![i as u8; 50]),
            })
            .collect();
        let node = Node::leaf(&elements);
        let bytes = node.encode([1; 16], 4, 1 << 20);
        let (back, tid) = Node::decode(&bytes, &[1; 16], 1 << 20, Some(0)).unwrap();
        assert_eq!((back, tid), (node, 4));
        assert!(
            Node::decode(&bytes, &[2; 16], 1 << 20, Some(0)).is_err(),
            "foreign volume"
        );
        assert!(
            Node::decode(&bytes, &[1; 16], 2 << 20, Some(0)).is_err(),
            "misdirected"
        );
        assert!(
            Node::decode(&bytes, &[1; 16], 1 << 20, Some(1)).is_err(),
            "wrong level"
        );
    }

    /// A leaf as builds before version 6 wrote it: elements in section 6's encoding.
    fn version_5_leaf(elements: &[Element], address: u64) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(0);
        w.u16(elements.len() as u16);
        for e in elements {
            e.encode(&mut w);
        }
        let header = BlockHeader {
            version: PACKED_LEAF_VERSION - 1,
            block_type: BlockType::Leaf,
            volume_id: [1; 16],
            tid: 3,
            address,
            payload_bytes: 0,
        };
        seal_block(&header, &w.bytes, NODE_BYTES)
    }

    #[test]
    fn leaves_written_before_packing_read_the_same() {
        let elements: Vec<Element> = (0..200u64)
            .map(|i| Element {
                key: Key {
                    obj: 1000 + i / 2,
                    rtype: if i % 2 == 0 {
                        rtype::INODE
                    } else {
                        rtype::DATA
                    },
                    key: (i % 2) * 65536,
                    create_tid: 7,
                },
                delete_tid: if i % 3 == 0 { 9 } else { 0 },
                payload: Payload::Inline(vec![i as u8; 40]),
            })
            .collect();
        let old = version_5_leaf(&elements, 1 << 20);
        let (node, tid) = Node::decode(&old, &[1; 16], 1 << 20, Some(0)).unwrap();
        assert_eq!((node.clone(), tid), (Node::leaf(&elements), 3));
        let Node::Leaf(leaf) = &node else {
            unreachable!()
        };
        assert_eq!(leaf.to_vec(), elements);
        // Written again, the leaf is packed and smaller, and reads back the same.
        let new = node.encode([1; 16], 4, 1 << 20);
        assert_eq!(
            u16::from_le_bytes([new[4], new[5]]),
            FORMAT_VERSION,
            "version"
        );
        assert!(node.payload_bytes() < elements.iter().map(Element::encoded_bytes).sum());
        let (again, _) = Node::decode(&new, &[1; 16], 1 << 20, Some(0)).unwrap();
        assert_eq!(again, node);
        // An old leaf with its keys out of order is refused, as it always was.
        let mut swapped = elements.clone();
        swapped.swap(3, 4);
        let bad = version_5_leaf(&swapped, 1 << 20);
        assert!(Node::decode(&bad, &[1; 16], 1 << 20, Some(0)).is_err());
    }
}
