//! Framing and bounds-checked parsing of the Aerospike wire protocol.
//!
//! Every frame starts with an 8-byte proto header: version (2), type (1 info, 3 message,
//! 4 compressed message) and a 48-bit big-endian body length. A message body starts with a
//! 22-byte header, then `field_count` fields (`u32` size including the type byte, type, data)
//! and `op_count` operations (`u32` size, op type, particle type, version, name length, name,
//! value). Nothing here panics on hostile input: every read is checked and a malformed message
//! is a [`WireError`].

use thiserror::Error;

/// Proto version every frame carries.
pub(crate) const PROTO_VERSION: u8 = 2;
/// Frame type of an info request/response.
pub(crate) const TYPE_INFO: u8 = 1;
/// Frame type of security (admin) messages: login, authenticate.
pub(crate) const TYPE_ADMIN: u8 = 2;
/// Frame type of a data message.
pub(crate) const TYPE_MESSAGE: u8 = 3;
/// Frame type of a zlib-compressed data message (not supported by the fixture).
pub(crate) const TYPE_COMPRESSED: u8 = 4;
/// Size of a message header, after the proto header.
pub(crate) const MSG_HEADER_SIZE: u8 = 22;
/// Largest body the fixture accepts (the client's own limit is in the same range).
pub(crate) const MAX_BODY: usize = 128 * 1024 * 1024;

// info1 bits.
pub(crate) const INFO1_GET_ALL: u8 = 1 << 1;
pub(crate) const INFO1_BATCH: u8 = 1 << 3;
pub(crate) const INFO1_NOBINDATA: u8 = 1 << 5;
// info2 bits.
pub(crate) const INFO2_WRITE: u8 = 1;
pub(crate) const INFO2_DELETE: u8 = 1 << 1;
pub(crate) const INFO2_GENERATION: u8 = 1 << 2;
pub(crate) const INFO2_GENERATION_GT: u8 = 1 << 3;
pub(crate) const INFO2_CREATE_ONLY: u8 = 1 << 5;
pub(crate) const INFO2_RESPOND_ALL_OPS: u8 = 1 << 7;
// info3 bits.
pub(crate) const INFO3_LAST: u8 = 1;
pub(crate) const INFO3_UPDATE_ONLY: u8 = 1 << 3;
pub(crate) const INFO3_CREATE_OR_REPLACE: u8 = 1 << 4;
pub(crate) const INFO3_REPLACE_ONLY: u8 = 1 << 5;

// Field types.
pub(crate) const FIELD_NAMESPACE: u8 = 0;
pub(crate) const FIELD_SET: u8 = 1;
pub(crate) const FIELD_KEY: u8 = 2;
pub(crate) const FIELD_DIGEST: u8 = 4;
pub(crate) const FIELD_QUERY_ID: u8 = 7;
pub(crate) const FIELD_PID_ARRAY: u8 = 11;
pub(crate) const FIELD_DIGEST_ARRAY: u8 = 12;
pub(crate) const FIELD_MAX_RECORDS: u8 = 13;
pub(crate) const FIELD_INDEX_RANGE: u8 = 22;
pub(crate) const FIELD_UDF_PACKAGE: u8 = 30;
pub(crate) const FIELD_BATCH_INDEX: u8 = 41;
pub(crate) const FIELD_FILTER_EXP: u8 = 43;

/// Why a frame or message could not be parsed. The connection it came from is closed.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The proto header carries a version other than 2.
    #[error("unsupported proto version {0}")]
    Version(u8),
    /// The proto header carries a frame type the fixture does not serve.
    #[error("unsupported frame type {0}")]
    FrameType(u8),
    /// The declared body length is larger than the fixture accepts.
    #[error("frame body of {0} bytes is too large")]
    TooLarge(u64),
    /// The message header size byte is not 22.
    #[error("message header size {0}, expected 22")]
    HeaderSize(u8),
    /// A length inside the message points past its end.
    #[error("truncated message: {0}")]
    Truncated(&'static str),
    /// A field or operation size is smaller than its own header.
    #[error("invalid {0} size {1}")]
    BadSize(&'static str, u32),
    /// Bytes left over after the declared fields and operations.
    #[error("{0} trailing bytes after the last operation")]
    Trailing(usize),
    /// A bin name is not valid UTF-8.
    #[error("bin name is not UTF-8")]
    BinName,
}

/// A parsed proto header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProtoHeader {
    /// Frame type.
    pub(crate) frame_type: u8,
    /// Body length in bytes.
    pub(crate) len: usize,
}

/// Parses the 8-byte proto header, checking version, type and size.
pub(crate) fn parse_proto(bytes: [u8; 8]) -> Result<ProtoHeader, WireError> {
    if bytes[0] != PROTO_VERSION {
        return Err(WireError::Version(bytes[0]));
    }
    let frame_type = bytes[1];
    if frame_type != TYPE_INFO && frame_type != TYPE_MESSAGE && frame_type != TYPE_ADMIN {
        return Err(WireError::FrameType(frame_type));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes[2..].copy_from_slice(&bytes[2..]);
    let len = u64::from_be_bytes(len_bytes);
    if len > MAX_BODY as u64 {
        return Err(WireError::TooLarge(len));
    }
    // `len` is at most MAX_BODY, which fits in usize.
    Ok(ProtoHeader {
        frame_type,
        len: len as usize,
    })
}

/// Writes a proto header for a body of `len` bytes.
pub(crate) fn proto_header(frame_type: u8, len: usize) -> [u8; 8] {
    let mut out = (len as u64).to_be_bytes();
    out[0] = PROTO_VERSION;
    out[1] = frame_type;
    out
}

/// A bounds-checked cursor over a message body.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or(WireError::Truncated(what))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.bytes(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// `count` fields: `u32` size (type byte included), type, data.
    pub(crate) fn fields(&mut self, count: u16) -> Result<Vec<Field>, WireError> {
        let mut fields = Vec::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            let size = self.u32("field size")?;
            if size < 1 {
                return Err(WireError::BadSize("field", size));
            }
            let ftype = self.u8("field type")?;
            let data = self.bytes(size as usize - 1, "field data")?.to_vec();
            fields.push(Field { ftype, data });
        }
        Ok(fields)
    }

    /// `count` operations: `u32` size, op type, particle type, version, name length, name, value.
    pub(crate) fn ops(&mut self, count: u16) -> Result<Vec<Op>, WireError> {
        let mut ops = Vec::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            let size = self.u32("op size")?;
            if size < 4 {
                return Err(WireError::BadSize("op", size));
            }
            let op_type = self.u8("op header")?;
            let particle = self.u8("op header")?;
            let _version = self.u8("op header")?;
            let name_len = self.u8("op header")?;
            let value_len = (size as usize - 4)
                .checked_sub(usize::from(name_len))
                .ok_or(WireError::BadSize("op", size))?;
            let name = std::str::from_utf8(self.bytes(usize::from(name_len), "op name")?)
                .map_err(|_| WireError::BinName)?
                .to_owned();
            let value = self.bytes(value_len, "op value")?.to_vec();
            ops.push(Op {
                op_type,
                particle,
                name,
                value,
            });
        }
        Ok(ops)
    }
}

/// One field of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) ftype: u8,
    pub(crate) data: Vec<u8>,
}

/// One operation of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Op {
    pub(crate) op_type: u8,
    pub(crate) particle: u8,
    pub(crate) name: String,
    pub(crate) value: Vec<u8>,
}

/// A parsed data message (request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) info1: u8,
    pub(crate) info2: u8,
    pub(crate) info3: u8,
    pub(crate) generation: u32,
    pub(crate) expiration: u32,
    pub(crate) fields: Vec<Field>,
    pub(crate) ops: Vec<Op>,
}

impl Message {
    /// Parses a complete message body (everything after the proto header).
    pub(crate) fn parse(body: &[u8]) -> Result<Message, WireError> {
        let mut r = Reader::new(body);
        let header_size = r.u8("header")?;
        if header_size != MSG_HEADER_SIZE {
            return Err(WireError::HeaderSize(header_size));
        }
        let info1 = r.u8("header")?;
        let info2 = r.u8("header")?;
        let info3 = r.u8("header")?;
        let _info4 = r.u8("header")?;
        let _result_code = r.u8("header")?;
        let generation = r.u32("header")?;
        let expiration = r.u32("header")?;
        let _timeout = r.u32("header")?;
        let field_count = r.u16("header")?;
        let op_count = r.u16("header")?;
        let fields = r.fields(field_count)?;
        let ops = r.ops(op_count)?;
        if r.remaining() != 0 {
            return Err(WireError::Trailing(r.remaining()));
        }
        Ok(Message {
            info1,
            info2,
            info3,
            generation,
            expiration,
            fields,
            ops,
        })
    }

    /// The data of the first field of type `ftype`.
    pub(crate) fn field(&self, ftype: u8) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| f.ftype == ftype)
            .map(|f| f.data.as_slice())
    }
}

/// A bin value as it travels on the wire: particle type and raw bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Particle {
    pub(crate) ptype: u8,
    pub(crate) data: Vec<u8>,
}

/// Particle type codes.
pub(crate) const PARTICLE_NULL: u8 = 0;
pub(crate) const PARTICLE_INTEGER: u8 = 1;
pub(crate) const PARTICLE_FLOAT: u8 = 2;
pub(crate) const PARTICLE_STRING: u8 = 3;
pub(crate) const PARTICLE_BLOB: u8 = 4;
pub(crate) const PARTICLE_BOOL: u8 = 17;

impl Particle {
    /// The integer this particle holds, if it is an 8-byte integer.
    pub(crate) fn as_i64(&self) -> Option<i64> {
        if self.ptype != PARTICLE_INTEGER {
            return None;
        }
        let bytes: [u8; 8] = self.data.as_slice().try_into().ok()?;
        Some(i64::from_be_bytes(bytes))
    }

    /// An integer particle.
    pub(crate) fn int(v: i64) -> Particle {
        Particle {
            ptype: PARTICLE_INTEGER,
            data: v.to_be_bytes().to_vec(),
        }
    }
}

/// One message of a response: result code, record metadata, fields and bins.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reply {
    pub(crate) info3: u8,
    pub(crate) result_code: u8,
    pub(crate) generation: u32,
    pub(crate) void_time: u32,
    /// The row a batch reply answers (the request's index of it); 0 outside batches.
    pub(crate) batch_index: u32,
    pub(crate) fields: Vec<(u8, Vec<u8>)>,
    pub(crate) bins: Vec<(String, Option<Particle>)>,
}

impl Reply {
    /// A reply that only carries a result code.
    pub(crate) fn code(result_code: u8) -> Reply {
        Reply {
            result_code,
            ..Reply::default()
        }
    }

    /// Appends this message (header, fields, ops; no proto header) to `out`.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(MSG_HEADER_SIZE);
        out.push(0); // info1
        out.push(0); // info2
        out.push(self.info3);
        out.push(0); // info4
        out.push(self.result_code);
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&self.void_time.to_be_bytes());
        out.extend_from_slice(&self.batch_index.to_be_bytes()); // batch index / timeout
        out.extend_from_slice(&(self.fields.len().min(u16::MAX as usize) as u16).to_be_bytes());
        out.extend_from_slice(&(self.bins.len().min(u16::MAX as usize) as u16).to_be_bytes());
        for (ftype, data) in self.fields.iter().take(u16::MAX as usize) {
            out.extend_from_slice(&((data.len() + 1) as u32).to_be_bytes());
            out.push(*ftype);
            out.extend_from_slice(data);
        }
        for (name, value) in self.bins.iter().take(u16::MAX as usize) {
            let name = &name.as_bytes()[..name.len().min(255)];
            let (ptype, data) = match value {
                Some(p) => (p.ptype, p.data.as_slice()),
                None => (PARTICLE_NULL, &[][..]),
            };
            out.extend_from_slice(&((4 + name.len() + data.len()) as u32).to_be_bytes());
            out.push(1); // op type: read
            out.push(ptype);
            out.push(0); // version
            out.push(name.len() as u8);
            out.extend_from_slice(name);
            out.extend_from_slice(data);
        }
    }

    /// This message as one complete frame.
    pub(crate) fn to_frame(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64);
        self.encode_into(&mut body);
        frame(TYPE_MESSAGE, &body)
    }
}

/// A complete frame of `frame_type` around `body`.
pub(crate) fn frame(frame_type: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&proto_header(frame_type, body.len()));
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_header_round_trips() {
        let h = proto_header(TYPE_MESSAGE, 1234);
        assert_eq!(
            parse_proto(h),
            Ok(ProtoHeader {
                frame_type: TYPE_MESSAGE,
                len: 1234
            })
        );
        assert_eq!(
            parse_proto(proto_header(9, 1)),
            Err(WireError::FrameType(9))
        );
        let mut bad = h;
        bad[0] = 3;
        assert_eq!(parse_proto(bad), Err(WireError::Version(3)));
    }

    #[test]
    fn truncated_and_oversized_messages_are_errors() {
        let mut body = Vec::new();
        Reply::code(0).encode_into(&mut body);
        assert!(Message::parse(&body).is_ok());
        assert!(Message::parse(&body[..10]).is_err());
        // Claim one field that is not there.
        let mut one_field = body.clone();
        one_field[18..20].copy_from_slice(&1u16.to_be_bytes());
        assert!(matches!(
            Message::parse(&one_field),
            Err(WireError::Truncated(_))
        ));
        one_field.extend_from_slice(&0u32.to_be_bytes());
        assert!(matches!(
            Message::parse(&one_field),
            Err(WireError::BadSize("field", 0))
        ));
        let mut huge = body;
        huge[18..20].copy_from_slice(&1u16.to_be_bytes());
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        huge.push(0);
        assert!(Message::parse(&huge).is_err());
    }

    #[test]
    fn reply_encodes_bins() {
        let reply = Reply {
            generation: 3,
            bins: vec![("a".into(), Some(Particle::int(7))), ("b".into(), None)],
            ..Reply::default()
        };
        let frame = reply.to_frame();
        let hdr = parse_proto(frame[..8].try_into().unwrap()).unwrap();
        assert_eq!(hdr.len, frame.len() - 8);
        let msg = Message::parse(&frame[8..]).unwrap();
        assert_eq!(msg.generation, 3);
        assert_eq!(msg.ops.len(), 2);
        assert_eq!(msg.ops[0].value, 7i64.to_be_bytes());
        assert_eq!(msg.ops[1].particle, PARTICLE_NULL);
    }
}
