//! Info commands (frame type 1): the node identity, cluster and partition map the client's seed
//! check and tend ask for.
//!
//! A request is newline-separated command names; the answer is one `name\tvalue\n` line per
//! command. What the client (aerospike-core 3.0) sends:
//!
//! - seed check: `node`, `cluster-name`, `build`, `partition-generation` (a build below 4.9.0.3
//!   and a partition generation of -1 are rejected);
//! - every tend (1 s): `node` (must never change), `cluster-name`, `peers-generation`,
//!   `partition-generation`;
//! - when a generation changed: `peers-clear-std` (`gen,port,[]`: no peers) and `replicas`
//!   together with `partition-generation` (`ns:regime,replica-count,<base64 bitmap>`, this node
//!   owning all 4096 partitions).
//!
//! What the node says it owns follows [`Partitions`] ([`Faults::set_partitions`](super::Faults::set_partitions)):
//! no partition (a zero bitmap) or no table at all (an empty `replicas`), the partition
//! generation changing with it.
//!
//! Unknown commands get an empty value, like a real server. The reported build is `7.2.0.1`:
//! recent enough for partition scans and batch-any, older than 8.1 so the client skips
//! `user-agent-set` (it would get an empty answer anyway).

use base64::Engine;

use super::faults::Partitions;

/// Server version the fixture reports.
pub(crate) const BUILD: &str = "7.2.0.1";
/// Number of partitions of a namespace.
const PARTITIONS: usize = 4096;

/// The values the info commands report; fixed for a fixture's lifetime.
#[derive(Debug, Clone)]
pub(crate) struct NodeInfo {
    pub(crate) node_name: String,
    pub(crate) cluster_name: String,
    pub(crate) namespace: String,
    pub(crate) port: u16,
}

impl NodeInfo {
    fn value(&self, command: &str, (partitions, generation): (Partitions, u64)) -> String {
        match command {
            "node" => self.node_name.clone(),
            "cluster-name" => self.cluster_name.clone(),
            "build" | "version" => BUILD.to_owned(),
            "edition" => "Aerospike Community Edition".to_owned(),
            "partition-generation" | "rebalance-generation" => generation.to_string(),
            "peers-generation" => "1".to_owned(),
            "peers-clear-std" | "peers-clear-alt" | "peers-tls-std" | "peers-tls-alt" => {
                format!("1,{},[]", self.port)
            }
            "partitions" => PARTITIONS.to_string(),
            "replicas" | "replicas-master" | "replicas-all" => {
                let owned = match partitions {
                    Partitions::NoTable => return String::new(),
                    Partitions::Unowned => 0u8,
                    _ => 0xff,
                };
                let bitmap = base64::engine::general_purpose::STANDARD.encode([owned; PARTITIONS / 8]);
                if command == "replicas" {
                    format!("{}:0,1,{bitmap}", self.namespace)
                } else {
                    format!("{}:{bitmap}", self.namespace)
                }
            }
            "namespaces" => self.namespace.clone(),
            "features" => "batch-any;blob-bits;cdt-list;cdt-map;float;geo;peers;pipelining;pquery;pscans;query-show;relaxed-sc;replicas;truncate-namespace;udf".to_owned(),
            "racks:" | "rack-ids" => format!("{}:0", self.namespace),
            "statistics" => "cluster_size=1".to_owned(),
            _ => String::new(),
        }
    }

    /// Answers one info request body; `partitions` is what the node owns and its partition
    /// generation.
    pub(crate) fn answer(&self, request: &[u8], partitions: (Partitions, u64)) -> Vec<u8> {
        let request = String::from_utf8_lossy(request);
        let mut commands: Vec<&str> = request
            .split('\n')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if commands.is_empty() {
            // An empty request asks for the server's default summary.
            commands = vec!["node", "build", "cluster-name", "partition-generation"];
        }
        let mut out = String::new();
        for command in commands {
            out.push_str(command);
            out.push('\t');
            out.push_str(&self.value(command, partitions));
            out.push('\n');
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_tend_commands() {
        let info = NodeInfo {
            node_name: "BB9".into(),
            cluster_name: "fixture".into(),
            namespace: "test".into(),
            port: 3000,
        };
        let owned = (Partitions::Owned, 1);
        let out = String::from_utf8(info.answer(b"node\npeers-clear-std\nnope\n", owned)).unwrap();
        assert_eq!(out, "node\tBB9\npeers-clear-std\t1,3000,[]\nnope\t\n");
        let replicas = info.value("replicas", owned);
        let bitmap = replicas.strip_prefix("test:0,1,").unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(bitmap)
            .unwrap();
        assert_eq!(decoded.len(), 512);
        assert!(!replicas.ends_with(';'));

        let unowned = info.value("replicas", (Partitions::Unowned, 2));
        let bitmap = unowned.strip_prefix("test:0,1,").unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(bitmap)
            .unwrap();
        assert!(decoded.iter().all(|b| *b == 0), "owns nothing");
        assert_eq!(
            info.value("partition-generation", (Partitions::Unowned, 2)),
            "2"
        );
        assert_eq!(info.value("replicas", (Partitions::NoTable, 3)), "");
    }
}
