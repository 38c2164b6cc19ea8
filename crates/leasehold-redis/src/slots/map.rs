//! The slot map: which master serves each slot, read from `CLUSTER SLOTS`.
//!
//! Masters only: the direct route sends every command to a slot's master, and leaves replicas
//! (and anything the map cannot vouch for) to the cluster client.

use std::sync::Arc;

use redis::{RedisError, RedisResult, Value};

use super::key_slots::SLOT_COUNT;
use super::nodes::{Node, NodeAddress};

/// A range of slots and the master serving it, as `CLUSTER SLOTS` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRange {
    pub(crate) start: u16,
    pub(crate) end: u16,
    /// The master's preferred endpoint and port. The endpoint is empty or `?` when the node does
    /// not know it; such a master is never connected to directly.
    pub(crate) master: NodeAddress,
}

/// Parses a `CLUSTER SLOTS` reply, `[[start, end, [host, port, id, …], replica…], …]`, keeping
/// the masters (the first node of each range). A malformed reply is an error, so a refresh keeps
/// the map it had.
pub(crate) fn parse_cluster_slots(reply: Value) -> RedisResult<Vec<SlotRange>> {
    let malformed = |what: &str| {
        RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected CLUSTER SLOTS reply",
            what.to_owned(),
        ))
    };
    let Value::Array(ranges) = reply else {
        return Err(malformed("not an array"));
    };
    let mut parsed = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(malformed("a range is not an array"));
        };
        let mut fields = fields.into_iter();
        let (Some(start), Some(end), Some(master)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(malformed("a range has no master"));
        };
        let start: u16 = redis::from_redis_value(start)?;
        let end: u16 = redis::from_redis_value(end)?;
        if start > end || usize::from(end) >= SLOT_COUNT {
            return Err(malformed("a range is out of bounds"));
        }
        let Value::Array(node) = master else {
            return Err(malformed("a master is not an array"));
        };
        let mut node = node.into_iter();
        let (Some(host), Some(port)) = (node.next(), node.next()) else {
            return Err(malformed("a master has no host and port"));
        };
        let host: String = match host {
            Value::Nil => String::new(),
            host => redis::from_redis_value(host)?,
        };
        let port: u16 = redis::from_redis_value(port)?;
        parsed.push(SlotRange {
            start,
            end,
            master: (host, port),
        });
    }
    Ok(parsed)
}

/// Every master of `ranges`, once each, in order of first appearance.
pub(crate) fn masters_of(ranges: &[SlotRange]) -> Vec<NodeAddress> {
    let mut masters: Vec<NodeAddress> = Vec::new();
    for range in ranges {
        if !masters.contains(&range.master) {
            masters.push(range.master.clone());
        }
    }
    masters
}

/// Whether a master's endpoint can be connected to (Redis says `?` or nothing when it does not
/// know the endpoint clients should use).
pub(super) fn reachable(address: &NodeAddress) -> bool {
    !address.0.is_empty() && address.0 != "?"
}

/// The slot map: for each slot, its master.
pub(super) struct Table {
    /// Per slot, an index into `nodes`, or [`Table::NONE`].
    owner: Vec<u16>,
    pub(super) nodes: Vec<Arc<Node>>,
    pub(super) ranges: Vec<SlotRange>,
}

impl Table {
    const NONE: u16 = u16::MAX;

    pub(super) fn empty() -> Table {
        Table {
            owner: vec![Table::NONE; SLOT_COUNT],
            nodes: Vec::new(),
            ranges: Vec::new(),
        }
    }

    pub(super) fn new(ranges: Vec<SlotRange>, nodes: Vec<Arc<Node>>) -> Table {
        let mut owner = vec![Table::NONE; SLOT_COUNT];
        for range in &ranges {
            let Some(index) = nodes.iter().position(|n| n.address == range.master) else {
                continue;
            };
            let index = u16::try_from(index).unwrap_or(Table::NONE);
            let end = usize::from(range.end).min(SLOT_COUNT - 1);
            if let Some(slots) = owner.get_mut(usize::from(range.start)..=end) {
                slots.fill(index);
            }
        }
        Table {
            owner,
            nodes,
            ranges,
        }
    }

    pub(super) fn node_of(&self, slot: u16) -> Option<&Arc<Node>> {
        let index = *self.owner.get(usize::from(slot))?;
        self.nodes.get(usize::from(index))
    }

    pub(super) fn node(&self, address: &NodeAddress) -> Option<&Arc<Node>> {
        self.nodes.iter().find(|n| &n.address == address)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::super::nodes::shown;
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![bulk(host), Value::Int(port), bulk(id)])
    }

    #[test]
    fn cluster_slots_gives_each_range_its_master() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7001, "a"),
                node("127.0.0.1", 7004, "d"),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                // Redis 7 adds a metadata map after the id; a replica-less range has no more.
                Value::Array(vec![
                    bulk("10.0.0.2"),
                    Value::Int(7002),
                    bulk("b"),
                    Value::Map(vec![(bulk("hostname"), bulk("n2"))]),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                node("", 7003, "c"),
            ]),
            Value::Array(vec![
                Value::Int(100),
                Value::Int(100),
                node("127.0.0.1", 7001, "a"),
            ]),
        ]);
        let ranges = parse_cluster_slots(reply).unwrap();
        assert_eq!(
            ranges,
            [
                SlotRange {
                    start: 0,
                    end: 5460,
                    master: ("127.0.0.1".into(), 7001)
                },
                SlotRange {
                    start: 5461,
                    end: 10922,
                    master: ("10.0.0.2".into(), 7002)
                },
                SlotRange {
                    start: 10923,
                    end: 16383,
                    master: (String::new(), 7003)
                },
                SlotRange {
                    start: 100,
                    end: 100,
                    master: ("127.0.0.1".into(), 7001)
                },
            ]
        );
        assert_eq!(
            masters_of(&ranges),
            [
                ("127.0.0.1".to_owned(), 7001),
                ("10.0.0.2".to_owned(), 7002),
                (String::new(), 7003)
            ]
        );
        assert!(!reachable(&(String::new(), 7003)));
        assert!(!reachable(&("?".to_owned(), 7003)));
    }

    #[test]
    fn a_malformed_slots_reply_is_an_error() {
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(10)])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(10),
                Value::Int(0),
                node("h", 1, "a"),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(16384),
                node("h", 1, "a"),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Array(vec![bulk("h")]),
            ])]),
        ] {
            assert!(parse_cluster_slots(reply.clone()).is_err(), "{reply:?}");
        }
    }

    #[test]
    fn the_table_names_each_slots_master() {
        let ranges = parse_cluster_slots(Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(99), node("h", 1, "a")]),
            Value::Array(vec![Value::Int(200), Value::Int(16383), node("h", 2, "b")]),
        ]))
        .unwrap();
        let nodes = masters_of(&ranges)
            .into_iter()
            .map(|address| {
                Arc::new(Node {
                    shown: shown(&address),
                    address,
                    conn: None,
                    broken: Arc::new(AtomicBool::new(false)),
                })
            })
            .collect();
        let table = Table::new(ranges, nodes);
        assert_eq!(table.node_of(0).unwrap().shown, "h:1");
        assert_eq!(table.node_of(99).unwrap().shown, "h:1");
        assert!(
            table.node_of(150).is_none(),
            "an unserved slot has no master"
        );
        assert_eq!(table.node_of(16383).unwrap().shown, "h:2");
        assert!(table.node_of(16384).is_none());
        assert_eq!(shown(&("::1".to_owned(), 7001)), "[::1]:7001");
    }
}
