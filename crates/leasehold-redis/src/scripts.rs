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
const ACQUIRE_FENCED_LUA: &str = r"
local fence = redis.call('GET', KEYS[2])
if fence and not string.match(fence, '^%d+$') then
  return redis.error_reply('fence counter ' .. KEYS[2] .. ' holds a non-integer; delete it or use another key prefix')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
";
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_FENCED_LUA));

/// Release: delete the lock only if it still holds our token.
/// `KEYS[1]` lock key; `ARGV[1]` token. Returns 1 if deleted, 0 otherwise.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// Extend: reset the TTL only if the lock still holds our token.
/// `KEYS[1]` lock key; `ARGV[1]` token, `ARGV[2]` TTL ms. Returns 1 if extended, 0 otherwise.
const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));

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

/// Fair acquire: the lock goes to the first process in the key's waiter queue.
///
/// `KEYS[1]` lock, `KEYS[2]` fence counter, `KEYS[3]` waiter queue (a list of waiter ids, oldest
/// first), `KEYS[4]` waiter deadlines (a hash: id → ms since the epoch, server time);
/// `ARGV[1]` token, `ARGV[2]` TTL ms, `ARGV[3]` waiter id (empty: a try-lock, never queued),
/// `ARGV[4]` waiter timeout ms, `ARGV[5]` `1` to fence, `ARGV[6]` `1` when other tasks of this
/// process still wait on the key: taking the lock then puts the process back at the end of the
/// line, so its next turn comes after every other process's.
///
/// A waiter that stopped asking (crashed) is dropped once its deadline passes, when it reaches the
/// head. The caller may take the lock if the queue is empty or it is at the head; taking it pops
/// it. Otherwise a blocking caller joins the back of the queue (or refreshes its deadline).
///
/// Returns `{1, fence or false, others}` when acquired (`others`: how many other processes are
/// still in line), else `{0, ms, 0}`: `ms` is how long until the lock can be free without a release (the
/// holder's TTL left, or the head waiter's deadline), at least 1.
///
/// As in `ACQUIRE_FENCED`, the fence counter is checked before anything is written.
const ACQUIRE_FAIR_LUA: &str = r"
local me = ARGV[3]
local head = redis.call('LINDEX', KEYS[3], 0)
local now = nil
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local head_deadline = nil
for _ = 1, 64 do
  if not head or head == me then break end
  head_deadline = tonumber(redis.call('HGET', KEYS[4], head) or '0')
  if head_deadline >= clock() then break end
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], head)
  head = redis.call('LINDEX', KEYS[3], 0)
  head_deadline = nil
end
if (not head) or head == me then
  if ARGV[5] == '1' then
    local fence = redis.call('GET', KEYS[2])
    if fence and not string.match(fence, '^%d+$') then
      return redis.error_reply('fence counter ' .. KEYS[2] .. ' holds a non-integer; delete it or use another key prefix')
    end
  end
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if head == me then
      redis.call('LPOP', KEYS[3])
    end
    if ARGV[6] == '1' and me ~= '' then
      local keep = tonumber(ARGV[4])
      redis.call('RPUSH', KEYS[3], me)
      redis.call('HSET', KEYS[4], me, clock() + keep)
      redis.call('PEXPIRE', KEYS[3], keep * 2)
      redis.call('PEXPIRE', KEYS[4], keep * 2)
    end
    local others = redis.call('LLEN', KEYS[3])
    if ARGV[6] == '1' and me ~= '' then
      others = others - 1
    end
    if ARGV[5] == '1' then
      return {1, redis.call('INCR', KEYS[2]), others}
    end
    return {1, false, others}
  end
end
if me ~= '' then
  if not redis.call('LPOS', KEYS[3], me) then
    redis.call('RPUSH', KEYS[3], me)
  end
  local keep = tonumber(ARGV[4])
  redis.call('HSET', KEYS[4], me, clock() + keep)
  redis.call('PEXPIRE', KEYS[3], keep * 2)
  redis.call('PEXPIRE', KEYS[4], keep * 2)
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  left = head_deadline and (head_deadline - clock()) or 1
end
if left < 1 then left = 1 end
return {0, left, 0}
";
pub(crate) static ACQUIRE_FAIR: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_FAIR_LUA));

/// Fair release: delete the lock only if it holds our token, and tell the next process in line.
/// `KEYS[1]` lock, `KEYS[2]` waiter queue, `KEYS[3]` channel; `ARGV[1]` token.
/// Returns 1 if deleted, 0 otherwise.
const RELEASE_FAIR_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local next = redis.call('LINDEX', KEYS[2], 0)
  if next then
    redis.call('PUBLISH', KEYS[3], next)
  end
  return 1
end
return 0
";
pub(crate) static RELEASE_FAIR: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_FAIR_LUA));

/// Leave a key's waiter queue (the process stopped waiting without the lock); if it was first in
/// line and the lock is free, tell the next one.
/// `KEYS[1]` waiter queue, `KEYS[2]` lock, `KEYS[3]` channel; `ARGV[1]` waiter id.
pub(crate) static LEAVE_QUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local head = redis.call('LINDEX', KEYS[1], 0)
if redis.call('LREM', KEYS[1], 0, ARGV[1]) > 0 and head == ARGV[1]
    and redis.call('EXISTS', KEYS[2]) == 0 then
  local next = redis.call('LINDEX', KEYS[1], 0)
  if next then
    redis.call('PUBLISH', KEYS[3], next)
  end
end
return 0
",
    )
});

/// A script that also writes the key's lock history (leasehold's lock trace) in the same atomic
/// step: `body` runs unchanged (its `KEYS` and `ARGV` keep their indexes), then, unless it
/// answered an error, `ok` (a Lua expression on `result`) chooses the entry to push.
///
/// Trailing arguments: the last `KEYS` is the history list (`<prefix>trace:<lock key>`); the last
/// four `ARGV` are the entry if `ok`, the entry otherwise (empty: write nothing), the number of
/// entries kept, and the list's TTL in ms. `LPUSH` + `LTRIM` + `PEXPIRE`: newest first, bounded,
/// expiring after its last write.
fn traced(body: &str, ok: &str) -> Script {
    Script::new(&format!(
        r"
local function body()
{body}
end
local result = body()
if type(result) == 'table' and result.err then
  return result
end
local n = #ARGV
local entry = ARGV[n - 3]
if not ({ok}) then
  entry = ARGV[n - 2]
end
if entry ~= '' then
  local trace = KEYS[#KEYS]
  redis.call('LPUSH', trace, entry)
  redis.call('LTRIM', trace, 0, tonumber(ARGV[n - 1]) - 1)
  redis.call('PEXPIRE', trace, ARGV[n])
end
return result
"
    ))
}

/// Plain acquire (no fencing, no queue): `SET NX PX`, as a script so the trace can join it.
/// `KEYS[1]` lock key; `ARGV[1]` token, `ARGV[2]` TTL ms. Returns 1 if taken, 0 otherwise.
const ACQUIRE_PLAIN_LUA: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
";

/// [`ACQUIRE_PLAIN_LUA`] with the lock trace.
pub(crate) static ACQUIRE_PLAIN_TRACED: LazyLock<Script> =
    LazyLock::new(|| traced(ACQUIRE_PLAIN_LUA, "result == 1"));
/// [`ACQUIRE_FENCED`] with the lock trace.
pub(crate) static ACQUIRE_FENCED_TRACED: LazyLock<Script> =
    LazyLock::new(|| traced(ACQUIRE_FENCED_LUA, "result"));
/// [`ACQUIRE_FAIR`] with the lock trace.
pub(crate) static ACQUIRE_FAIR_TRACED: LazyLock<Script> =
    LazyLock::new(|| traced(ACQUIRE_FAIR_LUA, "result[1] == 1"));
/// [`RELEASE`] with the lock trace.
pub(crate) static RELEASE_TRACED: LazyLock<Script> =
    LazyLock::new(|| traced(RELEASE_LUA, "result == 1"));
/// [`RELEASE_FAIR`] with the lock trace.
pub(crate) static RELEASE_FAIR_TRACED: LazyLock<Script> =
    LazyLock::new(|| traced(RELEASE_FAIR_LUA, "result == 1"));
/// [`EXTEND`] with the lock trace.
pub(crate) static EXTEND_TRACED: LazyLock<Script> =
    LazyLock::new(|| traced(EXTEND_LUA, "result == 1"));
/// Appends one entry on its own (what happens without a store operation, such as a release the
/// unlock window skipped): the traced wrapper around a body that does nothing.
pub(crate) static APPEND_TRACE: LazyLock<Script> = LazyLock::new(|| traced("return 1", "true"));
