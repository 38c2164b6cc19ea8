//! Result codes the fixture sends, with the numbers a real server uses.
//!
//! Use them with [`Fault::ResultCode`](super::Fault::ResultCode) to make a request fail the way a
//! server would; the client maps each to its own `ResultCode`.

/// Success.
pub const OK: u8 = 0;
/// Generic server error.
pub const SERVER_ERROR: u8 = 1;
/// The record does not exist (read, delete, touch, update-only or replace-only write).
pub const KEY_NOT_FOUND: u8 = 2;
/// The generation check of a write or delete failed.
pub const GENERATION_ERROR: u8 = 3;
/// The request is malformed or asks for something the fixture does not support.
pub const PARAMETER_ERROR: u8 = 4;
/// A create-only write found an existing record.
pub const KEY_EXISTS: u8 = 5;
/// A bin that a create-only bin write found already there.
pub const BIN_EXISTS_ERROR: u8 = 6;
/// The server timed out the request (server-side timeout).
pub const TIMEOUT: u8 = 9;
/// The server is overloaded (e.g. partition unavailable during migrations).
pub const PARTITION_UNAVAILABLE: u8 = 11;
/// An operation does not fit the type of the bin it targets (e.g. add to a string bin).
pub const BIN_TYPE_ERROR: u8 = 12;
/// The record is too busy (hot key).
pub const KEY_BUSY: u8 = 14;
/// A bin that an update-only bin write did not find.
pub const BIN_NOT_FOUND: u8 = 17;
/// The namespace of the request is not served.
pub const NAMESPACE_NOT_FOUND: u8 = 20;
/// An operation that cannot apply to the record (an expression evaluated to unknown).
pub const OP_NOT_APPLICABLE: u8 = 26;
/// The filter expression of the request did not match the record.
pub const FILTERED_OUT: u8 = 27;
/// Login was attempted on a server without security (the client then goes on without it).
pub const SECURITY_NOT_ENABLED: u8 = 52;
/// The user or its password is wrong (login).
pub const INVALID_CREDENTIAL: u8 = 65;
/// The connection has not authenticated, or its session token is unknown.
pub const NOT_AUTHENTICATED: u8 = 80;
