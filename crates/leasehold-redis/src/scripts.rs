//! The server-side scripts: each lock operation is one round trip and atomic on the server.
//!
//! `redis::Script` calls them by SHA1 (`EVALSHA`) and, when the server answers `NOSCRIPT` (after a
//! restart or `SCRIPT FLUSH`), loads them again and retries, transparently.

use std::sync::LazyLock;

use redis::Script;

/// Acquire with a fencing token: set the lock only if absent, with a TTL in milliseconds, and in
/// the same atomic step increment the key's fence counter (a key without TTL, so it only grows).
/// `KEYS[1]` lock key, `KEYS[2]` fence key; `ARGV[1]` token, `ARGV[2]` TTL ms.
/// Returns the new fencing token, or nil if the lock is held.
///
/// Redis does not roll back a script that fails halfway, so the counter is checked before the
/// lock is set: a fence key that is not an integer (written by someone else) is an error with
/// nothing applied, never a lock taken without a token.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local fence = redis.call('GET', KEYS[2])
if fence and not string.match(fence, '^%d+$') then
  return redis.error_reply('fence counter ' .. KEYS[2] .. ' holds a non-integer; delete it or use another key prefix')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
",
    )
});

/// Release: delete the lock only if it still holds our token.
/// `KEYS[1]` lock key; `ARGV[1]` token. Returns 1 if deleted, 0 otherwise.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// Extend: reset the TTL only if the lock still holds our token.
/// `KEYS[1]` lock key; `ARGV[1]` token, `ARGV[2]` TTL ms. Returns 1 if extended, 0 otherwise.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});

/// Inspect: token, remaining TTL in ms and fencing token, read atomically.
/// `KEYS[1]` lock key, `KEYS[2]` fence key. Returns nil if free, else `{token, pttl, fence}`.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local token = redis.call('GET', KEYS[1])
if not token then
  return false
end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
",
    )
});
