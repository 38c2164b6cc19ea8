//! Batch requests: the batch-index protocol the client uses for `Client::batch` (reads, writes
//! and deletes of several records in one message, each row with its own attributes).
//!
//! The message carries the batch field (41): `u32` row count, a flags byte, then each row: `u32`
//! index, the 20-byte digest, and either `BATCH_MSG_REPEAT` (the previous row's namespace, set,
//! attributes, fields and operations again, for this digest) or a type byte whose bits say which
//! attributes follow (`INFO`: read, write and info attributes; `INFO4`: the transaction byte;
//! `GEN`: a `u16` generation; `TTL`: a `u32` expiration; type 0 is the older read row, one read
//! attribute), then `u16` field count, `u16` operation count, the fields (namespace, set, and
//! optionally a filter expression and the user key) and the operations, as in a single-record
//! message. Each row runs as the single-record command those attributes describe (same
//! semantics, see [`command`](super::command)); the answer is one message per row (result code,
//! generation, void time, the row's index in the header's transaction-TTL slot, the row's bins)
//! and a last message flagged `INFO3_LAST`.

use super::command::{self, NsConfig};
use super::store::Store;
use super::wire::{self, Field, Message, Reader, Reply, WireError};

/// The previous row's header, fields and operations again, for this row's digest.
const MSG_REPEAT: u8 = 0x1;
/// Read, write and info attribute bytes follow.
const MSG_INFO: u8 = 0x2;
/// A `u16` generation follows.
const MSG_GEN: u8 = 0x4;
/// A `u32` expiration follows.
const MSG_TTL: u8 = 0x8;
/// The transaction attribute byte follows the info attributes.
const MSG_INFO4: u8 = 0x10;

/// One row of a batch, as the single-record message it amounts to.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The row's index in the request, echoed in its answer.
    pub(crate) index: u32,
    pub(crate) digest: [u8; 20],
    /// The row's command, with a digest field.
    pub(crate) msg: Message,
}

/// Parses the rows of a batch message. The message's own filter expression applies to rows
/// that carry none.
pub(crate) fn parse(msg: &Message) -> Result<Vec<Row>, WireError> {
    let body = msg
        .field(wire::FIELD_BATCH_INDEX)
        .ok_or(WireError::Truncated("batch field"))?;
    let parent_filter = msg.field(wire::FIELD_FILTER_EXP);
    let mut r = Reader::new(body);
    let count = r.u32("batch row count")?;
    let _flags = r.u8("batch flags")?;
    let mut rows: Vec<Row> = Vec::with_capacity((count as usize).min(1024));
    for _ in 0..count {
        let index = r.u32("batch row index")?;
        let digest: [u8; 20] = r
            .bytes(20, "batch row digest")?
            .try_into()
            .map_err(|_| WireError::Truncated("batch row digest"))?;
        let kind = r.u8("batch row type")?;
        let mut row_msg = if kind == MSG_REPEAT {
            let previous = rows.last().ok_or(WireError::Truncated(
                "batch repeat row without a previous row",
            ))?;
            let mut msg = previous.msg.clone();
            // A row that sends its user key is never a repeat: the previous row's is not this one's.
            msg.fields.retain(|f| f.ftype != wire::FIELD_KEY);
            msg
        } else {
            let (mut info1, mut info2, mut info3) = (0, 0, 0);
            if kind & MSG_INFO != 0 {
                info1 = r.u8("batch row attributes")?;
                info2 = r.u8("batch row attributes")?;
                info3 = r.u8("batch row attributes")?;
            } else if kind == 0 {
                info1 = r.u8("batch row attributes")?;
            }
            if kind & MSG_INFO4 != 0 {
                let _txn_attr = r.u8("batch row attributes")?;
            }
            let generation = if kind & MSG_GEN != 0 {
                u32::from(r.u16("batch row generation")?)
            } else {
                0
            };
            let expiration = if kind & MSG_TTL != 0 {
                r.u32("batch row expiration")?
            } else {
                0
            };
            let field_count = r.u16("batch row field count")?;
            let op_count = r.u16("batch row op count")?;
            let mut fields = r.fields(field_count)?;
            if let Some(filter) = parent_filter {
                if !fields.iter().any(|f| f.ftype == wire::FIELD_FILTER_EXP) {
                    fields.push(Field {
                        ftype: wire::FIELD_FILTER_EXP,
                        data: filter.to_vec(),
                    });
                }
            }
            Message {
                info1,
                info2,
                info3,
                generation,
                expiration,
                fields,
                ops: r.ops(op_count)?,
            }
        };
        row_msg.fields.retain(|f| f.ftype != wire::FIELD_DIGEST);
        row_msg.fields.push(Field {
            ftype: wire::FIELD_DIGEST,
            data: digest.to_vec(),
        });
        rows.push(Row {
            index,
            digest,
            msg: row_msg,
        });
    }
    if r.remaining() != 0 {
        return Err(WireError::Trailing(r.remaining()));
    }
    Ok(rows)
}

/// Runs the rows in order and answers each (`forced`: a result code a fault imposes on a row
/// instead of running it), then the last message.
///
/// Guess: the rows of one batch are applied one after another, in the request's order, and
/// every row is answered whatever the others' results (the client asks for all keys by
/// default). A server may run a batch's rows in parallel; any order of them is one the fixture
/// could have chosen too, and a client that depends on none of them is right against both.
pub(crate) fn execute(
    store: &mut Store,
    ns: &NsConfig,
    rows: &[Row],
    forced: &[Option<u8>],
) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 * rows.len().max(1));
    for (i, row) in rows.iter().enumerate() {
        let mut reply = match forced.get(i).copied().flatten() {
            Some(code) => Reply::code(code),
            // UDF rows are not served, as single UDF calls are not.
            None if row.msg.field(wire::FIELD_UDF_PACKAGE).is_some() => {
                Reply::code(super::result_code::PARAMETER_ERROR)
            }
            None => command::execute(store, ns, &row.msg),
        };
        reply.batch_index = row.index;
        reply.encode_into(&mut body);
    }
    Reply {
        info3: wire::INFO3_LAST,
        ..Reply::default()
    }
    .encode_into(&mut body);
    wire::frame(wire::TYPE_MESSAGE, &body)
}

/// A batch the fixture cannot parse answers this, as one last message.
pub(crate) fn refused(code: u8) -> Vec<u8> {
    Reply {
        info3: wire::INFO3_LAST,
        result_code: code,
        ..Reply::default()
    }
    .to_frame()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch_message(field: Vec<u8>) -> Message {
        Message {
            info1: wire::INFO1_BATCH,
            info2: 0,
            info3: 0,
            generation: 0,
            expiration: 0,
            fields: vec![Field {
                ftype: wire::FIELD_BATCH_INDEX,
                data: field,
            }],
            ops: Vec::new(),
        }
    }

    /// A row reading every bin of `digest` in namespace `test`, set `s`.
    fn read_row(index: u32, digest: [u8; 20]) -> Vec<u8> {
        let mut out = index.to_be_bytes().to_vec();
        out.extend_from_slice(&digest);
        out.push(MSG_INFO | MSG_TTL);
        out.extend_from_slice(&[wire::INFO1_GET_ALL, 0, 0]);
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&2u16.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        for (ftype, data) in [
            (wire::FIELD_NAMESPACE, &b"test"[..]),
            (wire::FIELD_SET, b"s"),
        ] {
            out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
            out.push(ftype);
            out.extend_from_slice(data);
        }
        out
    }

    #[test]
    fn rows_and_repeats_parse_into_single_record_messages() {
        let mut field = 3u32.to_be_bytes().to_vec();
        field.push(0);
        field.extend(read_row(0, [1; 20]));
        for (index, digest) in [(1u32, [2u8; 20]), (2, [3; 20])] {
            field.extend_from_slice(&index.to_be_bytes());
            field.extend_from_slice(&digest);
            field.push(MSG_REPEAT);
        }
        let rows = parse(&batch_message(field)).unwrap();
        assert_eq!(rows.len(), 3);
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.index, i as u32);
            assert_eq!(row.msg.info1, wire::INFO1_GET_ALL);
            assert_eq!(row.msg.field(wire::FIELD_SET), Some(&b"s"[..]));
            assert_eq!(
                row.msg.field(wire::FIELD_DIGEST),
                Some(&[i as u8 + 1; 20][..]),
                "each row its own digest"
            );
        }
    }

    #[test]
    fn malformed_batches_are_errors() {
        let mut repeat_first = 1u32.to_be_bytes().to_vec();
        repeat_first.push(0);
        repeat_first.extend_from_slice(&0u32.to_be_bytes());
        repeat_first.extend_from_slice(&[1; 20]);
        repeat_first.push(MSG_REPEAT);
        assert!(parse(&batch_message(repeat_first)).is_err());
        let mut short = 2u32.to_be_bytes().to_vec();
        short.push(0);
        short.extend(read_row(0, [1; 20]));
        assert!(
            parse(&batch_message(short.clone())).is_err(),
            "a row missing"
        );
        let mut trailing = 1u32.to_be_bytes().to_vec();
        trailing.push(0);
        trailing.extend(read_row(0, [1; 20]));
        trailing.push(0);
        assert!(parse(&batch_message(trailing)).is_err());
    }
}
