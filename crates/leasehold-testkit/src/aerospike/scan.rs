//! Scans: every live record of a set (or of the namespace) in the partitions the client asks
//! for, answered as a stream of messages cut into frames. The client lists locks this way; a
//! scan's filter and bin selection are those of a single-record read.

use std::collections::HashSet;

use tokio::time::Instant;

use super::command::{all_bins, check_namespace, filter_of, passes, reply_for, NsConfig};
use super::operation::OP_READ;
use super::result_code as rc;
use super::store::Store;
use super::wire::{self, Message, Reply};

/// Executes a scan: every live record of the set (all sets when none is named) in the requested
/// partitions, as a stream of messages ending with one flagged `INFO3_LAST`. Returns the frames
/// to send.
pub(crate) fn scan(store: &Store, ns: &NsConfig, msg: &Message) -> Vec<Vec<u8>> {
    match scan_inner(store, ns, msg) {
        Ok(frames) => frames,
        Err(code) => vec![Reply {
            info3: wire::INFO3_LAST,
            result_code: code,
            ..Reply::default()
        }
        .to_frame()],
    }
}

/// Bytes of messages gathered before a frame is cut.
const FRAME_TARGET: usize = 64 * 1024;

fn scan_inner(store: &Store, ns: &NsConfig, msg: &Message) -> Result<Vec<Vec<u8>>, u8> {
    check_namespace(msg, ns)?;
    if msg.info2 & wire::INFO2_WRITE != 0 {
        // Background scans (query_operate / UDF) are not served.
        return Err(rc::PARAMETER_ERROR);
    }
    let filter = filter_of(msg)?;
    let set = msg
        .field(wire::FIELD_SET)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .filter(|s| !s.is_empty());
    let partitions = requested_partitions(msg);
    let max_records = msg
        .field(wire::FIELD_MAX_RECORDS)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .filter(|m| *m > 0)
        .unwrap_or(u64::MAX);
    let no_bins = msg.info1 & wire::INFO1_NOBINDATA != 0;
    let names: Vec<&str> = msg
        .ops
        .iter()
        .filter(|op| op.op_type == OP_READ && !op.name.is_empty())
        .map(|op| op.name.as_str())
        .collect();
    let now = Instant::now();
    let mut frames = Vec::new();
    let mut body = Vec::new();
    let mut sent = 0u64;
    for (digest, record) in store.live(set.as_deref(), now) {
        if sent >= max_records {
            break;
        }
        if let Some(parts) = &partitions {
            if !parts.contains(&partition_id(digest)) {
                continue;
            }
        }
        if !passes(filter.as_ref(), record, now)? {
            continue;
        }
        let bins = if no_bins {
            Vec::new()
        } else if names.is_empty() {
            all_bins(record)
        } else {
            names
                .iter()
                .filter_map(|n| record.bin(n).map(|p| ((*n).to_owned(), Some(p.clone()))))
                .collect()
        };
        let mut fields = vec![
            (wire::FIELD_NAMESPACE, ns.namespace.as_bytes().to_vec()),
            (wire::FIELD_DIGEST, digest.to_vec()),
        ];
        if !record.set.is_empty() {
            fields.push((wire::FIELD_SET, record.set.as_bytes().to_vec()));
        }
        if let Some(key) = &record.user_key {
            let mut data = vec![key.ptype];
            data.extend_from_slice(&key.data);
            fields.push((wire::FIELD_KEY, data));
        }
        let mut reply = reply_for(record, bins);
        reply.fields = fields;
        reply.encode_into(&mut body);
        sent += 1;
        if body.len() >= FRAME_TARGET {
            frames.push(wire::frame(wire::TYPE_MESSAGE, &body));
            body.clear();
        }
    }
    Reply {
        info3: wire::INFO3_LAST,
        ..Reply::default()
    }
    .encode_into(&mut body);
    frames.push(wire::frame(wire::TYPE_MESSAGE, &body));
    Ok(frames)
}

/// The partition of a digest, as the client computes it.
pub(crate) fn partition_id(digest: &[u8; 20]) -> u16 {
    (u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]) & 0x0fff) as u16
}

/// The partitions a scan asks for (full partitions and the partitions of resume digests);
/// `None` when it names none, meaning all.
fn requested_partitions(msg: &Message) -> Option<HashSet<u16>> {
    let pids = msg.field(wire::FIELD_PID_ARRAY);
    let digests = msg.field(wire::FIELD_DIGEST_ARRAY);
    if pids.is_none() && digests.is_none() {
        return None;
    }
    let mut out = HashSet::new();
    for chunk in pids.unwrap_or_default().chunks_exact(2) {
        out.insert(u16::from_le_bytes([chunk[0], chunk[1]]));
    }
    // Guess: a partially scanned partition (resume digest) is scanned again in full; the
    // client tolerates the repeats.
    for chunk in digests.unwrap_or_default().chunks_exact(20) {
        if let Ok(d) = <[u8; 20]>::try_from(chunk) {
            out.insert(partition_id(&d));
        }
    }
    Some(out)
}
