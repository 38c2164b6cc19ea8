//! The server-side scripts: each lock operation is one round trip and atomic on the server.
//!
//! A [`ScriptCall`] calls them by SHA1 (`EVALSHA`) and, when the server answers `NOSCRIPT` (after a
//! restart or `SCRIPT FLUSH`), loads them again and retries, transparently.
//!
//! # A second run
//! The acquire scripts tell a refusal by the asking token itself (`mine` in their reply). Owner
//! tokens are new for every attempt, so a lock held by the token that asks means this request
//! ran before: a retry of a script whose first reply was lost (the cluster client retries a
//! request whose connection broke after it was sent). Its first run took the lock, so the store
//! reports the attempt in doubt, never refused: a refusal would leave that hold to its TTL with
//! nobody knowing of it, while in doubt the readback layer reads the record, finds the token, and
//! the caller gets the lock. A first run never finds its own token, so this costs one read inside
//! the script (no round trip) and changes nothing else.

use std::sync::LazyLock;

use redis::Script;

mod call;
mod fair;
mod shared;

pub(crate) use call::ScriptCall;

use fair::{ACQUIRE_FAIR_LUA, LEAVE_QUEUE_LUA, RELEASE_FAIR_LUA};
use shared::{ACQUIRE_SHARED_LUA, EXTEND_SHARED_LUA, RELEASE_SHARED_LUA};

/// Functions the scripts share, for the lock modes: a key is a string (an exclusive hold: the
/// token) or a hash (a shared record: `mode` = `shared` or `semaphore:N`, one `h:<token>` field
/// per holder holding its expiry in ms since the epoch, server time, and for read-write locks an
/// optional `writer-waiting` field holding the waiting writer's marker expiry). A shared record's
/// key expires with its longest entry, so an existing hash always has a live holder or marker.
///
/// An exclusive hold's value is the holder's token; when fenced, a tab and its fencing token in
/// decimal (so the hold itself says its token for as long as it lives: the counter may expire
/// first, see `next_fence`); and when fair, a newline and the entry its release tells (empty:
/// nobody waits). The acquire writes the entry first in line after its own move,
/// and whoever changes the head while the lock is held (a waiter joining an empty line, leaving
/// the head, a lapsed head dropped) points the hold at the new one (`set_next`), so the release
/// reads its token and the next entry in one `GET`, and an uncontended one reads no line.
/// `token_of`, `fence_of` and `next_of` split a value; a value without the newline (first-come
/// mode, or an older version's hold) names no entry, is never rewritten, and its release reads
/// the line. `hold_value` makes a value (a fencing token in decimal: `%d` formats Lua's double
/// as a C `long`, 64 bits on the 64-bit servers Redis 7 runs on, so exact below 2^53, and costs
/// the server a fraction of `%.0f`).
///
/// `next_fence` issues a key's next fencing token: one above its last (`INCR`), or, when the key
/// has no counter (never fenced, or its counter expired), the server's clock in microseconds,
/// written with the hold's TTL. A grant does not extend the counter (`INCR` keeps its TTL): it
/// lives for the TTL of the hold that started it, so it never outlives that hold, and the grant
/// after it starts again from the clock. That start is above every token the counter issued: it
/// counted one per grant, far fewer than the microseconds its lifetime lasted, so only a server
/// clock set back by nearly that TTL could bring it below them (docs/FENCING.md). Extending the
/// counter at every grant cost a command per grant. A grant issues its token before it sets the
/// hold, whose value carries it (`hold_value`), so an attempt refused after that has used a
/// number up (tokens still only grow). It returns an error reply instead of a token when the
/// counter holds a non-integer (written by someone else, or digits `INCR` refuses: `007`, past
/// 2^63), or when the `INCR` fails (`READONLY`, `OOM`, ...: that error itself, so it is read as
/// the server's state, not the counter's), and then nothing has been written.
///
/// `drop_lapsed` drops the entries at the head of a waiter line whose deadline passed (at most 64,
/// never `me`; `clock` gives the server time, read only if needed) and returns the new head, its
/// deadline if it was read, and whether any entry went.
///
/// `announce` tells the process an entry belongs to (the store id, or the store id of a strict
/// FIFO entry `<store id>#<n>`) that the entry is next in line, on that process's own channel
/// `<base>:<store id>`: only it wakes, where a channel per key woke every waiting process.
///
/// `changed` tells every process observing the key (an election's observers, through
/// `watch_changes`) that its holder changed: a grant or a release, published on the key's change
/// channel `<prefix>changed:<Redis lock key>` with the token granted or released as the payload
/// (a hint only; readers read the key again), for locks taken with `Acquire::announce` (an
/// election's) only: a `PUBLISH` is a command, and a hot lock nobody observes should not pay one
/// per grant and release.
///
/// `held_by` says whether an exclusive hold's token is the given one (a second run).
///
/// `sweep` drops expired entries and returns the mode, live holders, longest and soonest ms left
/// and the marker's ms left. `writer_on_shared` decides an exclusive request that `SET NX`
/// refused: `nil` when the key was a shared record with no live holder (deleted, so the caller
/// sets it), else `{0, ms}` (refused; a blocking writer, `wait_ms` > 0, leaves its marker) or an
/// error reply `MODECONFLICT <mode>` for a semaphore.
const PRELUDE: &str = r"
local function next_fence(key, ttl)
  local token = redis.pcall('INCR', key)
  if type(token) == 'table' then
    if string.find(token.err, 'not an integer', 1, true) then
      return redis.error_reply('fence counter ' .. key .. ' holds a non-integer; delete it or use another key prefix')
    end
    return token
  end
  if token == 1 then
    local t = redis.call('TIME')
    token = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', key, string.format('%d', token), 'PX', ttl)
  end
  return token
end
local function token_of(value)
  return string.match(value, '^[^\t\n]*')
end
local function fence_of(value)
  return string.match(value, '^[^\t\n]*\t(%d+)')
end
local function hold_value(fence, next)
  local value = ARGV[1]
  if fence then value = value .. '\t' .. string.format('%d', fence) end
  if next then value = value .. '\n' .. next end
  return value
end
local function held_by(lock, token)
  local value = redis.pcall('GET', lock)
  return type(value) == 'string' and token_of(value) == token
end
local function next_of(value)
  local sep = string.find(value, '\n', 1, true)
  if sep then return string.sub(value, sep + 1) end
  return nil
end
local function set_next(lock, next)
  local value = redis.pcall('GET', lock)
  if type(value) ~= 'string' then return end
  local sep = string.find(value, '\n', 1, true)
  if (not sep) or string.sub(value, sep + 1) == (next or '') then return end
  redis.call('SET', lock, string.sub(value, 1, sep) .. (next or ''), 'XX', 'KEEPTTL')
end
local function announce(base, next)
  local process = string.match(next, '^(.*)#%d+$') or next
  redis.call('PUBLISH', base .. ':' .. process, next)
end
local function changed(channel, token, announce)
  if announce == '1' then
    redis.call('PUBLISH', channel, token)
  end
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop_lapsed(queue, deadlines, head, me, clock)
  local dropped, head_deadline = false, nil
  for _ = 1, 64 do
    if not head or head == me then break end
    head_deadline = tonumber(redis.call('HGET', deadlines, head) or '0')
    if head_deadline >= clock() then break end
    redis.call('LPOP', queue)
    redis.call('HDEL', deadlines, head)
    dropped = true
    head = redis.call('LINDEX', queue, 0)
    head_deadline = nil
  end
  return head, head_deadline, dropped
end
local function sweep(key, now)
  local fields = redis.call('HGETALL', key)
  local mode, live, longest, soonest, marker = nil, 0, 0, nil, 0
  for i = 1, #fields, 2 do
    local f, v = fields[i], fields[i + 1]
    if f == 'mode' then
      mode = v
    else
      local left = (tonumber(v) or 0) - now
      if left <= 0 then
        redis.call('HDEL', key, f)
      elseif f == 'writer-waiting' then
        marker = left
      else
        live = live + 1
        if left > longest then longest = left end
        if (not soonest) or left < soonest then soonest = left end
      end
    end
  end
  return mode, live, longest, soonest or 0, marker
end
local function writer_on_shared(key, wait_ms)
  if redis.call('TYPE', key).ok ~= 'hash' then
    local left = redis.call('PTTL', key)
    if left < 1 then left = 1 end
    return {0, left}
  end
  local now = now_ms()
  local mode, live, longest = sweep(key, now)
  if live == 0 then
    redis.call('DEL', key)
    return nil
  end
  if mode ~= 'shared' then
    return redis.error_reply('MODECONFLICT ' .. (mode or 'unknown'))
  end
  if wait_ms > 0 then
    local marker = tonumber(redis.call('HGET', key, 'writer-waiting') or '0')
    if now + wait_ms > marker then
      redis.call('HSET', key, 'writer-waiting', now + wait_ms)
    end
    if redis.call('PTTL', key) < wait_ms then
      redis.call('PEXPIRE', key, wait_ms)
    end
  end
  return {0, longest}
end
";

/// Where a script's common case ends (see [`script_text`]): a Lua comment line of its own.
const REST: &str = "\n-- The rest.\n";

/// A script's full text: the shared functions it calls (`used_by`), then its body.
///
/// A body may start with its common case (an uncontended acquire or release), ended by the
/// [`REST`] line: that part comes right after the functions it calls, and the functions only the
/// rest calls are defined after it. The server runs a script's definitions on every call, each a
/// closure to make and later collect, so an uncontended call that returns early makes only the
/// few it needs.
fn script_text(body: &str, publish: &str) -> String {
    let (common, rest) = body.split_once(REST).unwrap_or(("", body));
    let for_common = used_by(common, &[]);
    let for_rest = used_by(rest, &for_common);
    let define = |used: &[bool]| {
        definitions_of(used).replace("redis.call('PUBLISH'", &format!("redis.call('{publish}'"))
    };
    let mut text = String::new();
    if !common.is_empty() {
        text.push_str(&define(&for_common));
        text.push_str(common);
        text.push_str(REST);
    }
    text.push_str(&define(&for_rest));
    text.push_str(rest);
    text
}

/// Which of the prelude's functions `body` calls, directly or through another of them, leaving
/// out those `defined` already. A script defines only those: the server runs every definition
/// on every call, and the whole prelude made a release cost the server about 1.3 µs more per
/// call than its own four functions do (Redis 7.0, `INFO commandstats`; a whole release call is
/// about 5 µs).
fn used_by(body: &str, defined: &[bool]) -> Vec<bool> {
    let functions = definitions(PRELUDE);
    let mut used = vec![false; functions.len()];
    let mut reached = vec![body];
    while let Some(text) = reached.pop() {
        for (i, (name, definition)) in functions.iter().enumerate() {
            if !used[i] && !defined.get(i).copied().unwrap_or(false) && calls(text, name) {
                used[i] = true;
                reached.push(definition);
            }
        }
    }
    used
}

/// The definitions of the prelude's functions marked `used`, in the prelude's order.
fn definitions_of(used: &[bool]) -> String {
    let mut prelude = String::new();
    for ((_, definition), used) in definitions(PRELUDE).iter().zip(used) {
        if *used {
            prelude.push_str("\nlocal function ");
            prelude.push_str(definition);
        }
    }
    prelude.push('\n');
    prelude
}

/// The top-level functions Lua `text` defines, in order: each one's name, and its definition
/// from the name on (up to the next one).
fn definitions(text: &str) -> Vec<(&str, &str)> {
    text.split("\nlocal function ")
        .skip(1)
        .filter_map(|rest| Some((rest.split_once('(')?.0, rest)))
        .collect()
}

/// Whether Lua `text` calls the function `name` (`name(` not part of a longer name).
fn calls(text: &str, name: &str) -> bool {
    let call = format!("{name}(");
    text.match_indices(&call).any(|(at, _)| {
        !text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Exclusive acquire (first-come mode): set the lock only if absent, with a TTL in
/// milliseconds, and with `ARGV[3]` = `1` in the same atomic step issue the next fencing token
/// (`next_fence`: one above the key's last token; when none is left, the server's clock in
/// microseconds, which no earlier token of the key can exceed).
/// `KEYS[1]` lock key, `KEYS[2]` fence key, `KEYS[3]` change channel (see `changed`); `ARGV[1]`
/// token, `ARGV[2]` TTL ms, `ARGV[3]` `1` to fence, `ARGV[4]` ms a refused blocking writer keeps
/// new readers out (0: a try), `ARGV[5]` `1` to announce the grant (see `changed`); `KEYS[3]` is
/// sent only for a grant that is announced or traced, and `ARGV[4]` and `ARGV[5]` only up to the
/// last that is not 0 (absent, each reads as `nil`, taken as 0).
/// Returns `{1, fence or false, 0}`, or `{0, ms, mine}` when held (`ms`: the holder's TTL left;
/// `mine`: 1 when the holder is this very token, see "A second run" in the module docs).
///
/// The token is issued before the lock is set, and the hold's value carries it (`hold_value`): a
/// counter `next_fence` cannot increment is an error with nothing applied, never a lock taken
/// without a token.
const ACQUIRE_LUA: &str = r"
local fence = false
if ARGV[3] == '1' then
  fence = next_fence(KEYS[2], ARGV[2])
  if type(fence) == 'table' then return fence end
end
-- The hold's value (as `hold_value` makes it, written out: no closure to make).
local value = ARGV[1]
if fence then value = ARGV[1] .. '\t' .. string.format('%d', fence) end
local function granted()
  changed(KEYS[3], ARGV[1], ARGV[5])
  return {1, fence, 0}
end
-- The common case: the key is free.
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  return granted()
end
-- The rest.
local refused = writer_on_shared(KEYS[1], tonumber(ARGV[4] or '0'))
if refused then
  if refused.err then return refused end
  local mine = 0
  if held_by(KEYS[1], ARGV[1]) then mine = 1 end
  return {0, refused[2], mine}
end
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return granted()
";

/// Release: delete the lock only if it still holds our token (a fair hold's value read as well,
/// see `token_of`, so stores of either mode on one key release their own holds).
/// `KEYS[1]` lock key, `KEYS[2]` change channel (see `changed`); `ARGV[1]` token, `ARGV[2]` `1`
/// to announce the release (`KEYS[2]` and `ARGV[2]` are sent only then, or for a traced call).
/// Returns 1 if deleted, 0 otherwise.
const RELEASE_LUA: &str = r"
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'string' and token_of(value) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  changed(KEYS[2], ARGV[1], ARGV[2])
  return 1
end
return 0
";

/// Extend: reset the TTL only if the lock still holds our token.
/// `KEYS[1]` lock key; `ARGV[1]` token, `ARGV[2]` TTL ms. Returns 1 if extended, 0 otherwise.
const EXTEND_LUA: &str = r"
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'string' and token_of(value) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Inspect, read-only and atomic. `KEYS[1]` lock key.
/// Returns nil if free; `{'x', token, pttl, fence or false}` for an exclusive hold (its fence as
/// its value carries it: the counter may have expired while the hold lives); for a shared record
/// `{'s', mode, marker ms, token1, ms1, token2, ms2, ...}` (live holders only).
const INSPECT_LUA: &str = r"
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'string' then
  local value = redis.call('GET', KEYS[1])
  return {'x', token_of(value), redis.call('PTTL', KEYS[1]), fence_of(value) or false}
end
if t ~= 'hash' then
  return false
end
local now = now_ms()
local out = {'s', '', 0}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  local left = (tonumber(v) or 0) - now
  if f == 'mode' then
    out[2] = v
  elseif f == 'writer-waiting' then
    if left > 0 then out[3] = left end
  elseif string.sub(f, 1, 2) == 'h:' and left > 0 then
    table.insert(out, string.sub(f, 3))
    table.insert(out, left)
  end
end
return out
";

/// A script that also writes the key's lock history (leasehold's lock trace) in the same atomic
/// step: `body` runs unchanged (its `KEYS` and `ARGV` keep their indexes), then, unless it
/// answered an error, `ok` (a Lua expression on `result`) chooses the entry to push.
///
/// Trailing arguments: the last `KEYS` is the history list (`<prefix>trace:<lock key>`); the last
/// four `ARGV` are the entry if `ok`, the entry otherwise (empty: write nothing), the number of
/// entries kept, and the list's TTL in ms. `LPUSH` + `LTRIM` + `PEXPIRE`: newest first, bounded,
/// expiring after its last write.
fn traced(body: &str, ok: &str, publish: &str) -> Script {
    let body = script_text(body, publish);
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

/// Every script, for one kind of deployment: the same text, with release and change
/// announcements sent by `PUBLISH` on one server (heard by `SUBSCRIBE`) and by `SPUBLISH` on a
/// Redis Cluster (sharded pub/sub: the message stays on the slot's shard, and the channel shares
/// the lock's hash tag).
pub(crate) struct Scripts {
    /// The `acquire` script (see the Lua text above).
    pub(crate) acquire: Script,
    /// The `release` script (see the Lua text above).
    pub(crate) release: Script,
    /// The `extend` script (see the Lua text above).
    pub(crate) extend: Script,
    /// The `inspect` script (see the Lua text above).
    pub(crate) inspect: Script,
    /// The `acquire_fair` script (see the Lua text above).
    pub(crate) acquire_fair: Script,
    /// The `release_fair` script (see the Lua text above).
    pub(crate) release_fair: Script,
    /// The `leave_queue` script (see the Lua text above).
    pub(crate) leave_queue: Script,
    /// [`acquire`](Self::acquire) with the lock trace.
    pub(crate) acquire_traced: Script,
    /// [`acquire_fair`](Self::acquire_fair) with the lock trace.
    pub(crate) acquire_fair_traced: Script,
    /// [`acquire_shared`](Self::acquire_shared) with the lock trace.
    pub(crate) acquire_shared_traced: Script,
    /// [`release`](Self::release) with the lock trace.
    pub(crate) release_traced: Script,
    /// [`release_fair`](Self::release_fair) with the lock trace.
    pub(crate) release_fair_traced: Script,
    /// [`release_shared`](Self::release_shared) with the lock trace.
    pub(crate) release_shared_traced: Script,
    /// [`extend`](Self::extend) with the lock trace.
    pub(crate) extend_traced: Script,
    /// [`extend_shared`](Self::extend_shared) with the lock trace.
    pub(crate) extend_shared_traced: Script,
    /// Appends one entry on its own (what happens without a store operation, such as a release the
    /// unlock window skipped): the traced wrapper around a body that does nothing.
    pub(crate) append_trace: Script,
    /// The `acquire_shared` script (see the Lua text above).
    pub(crate) acquire_shared: Script,
    /// The `release_shared` script (see the Lua text above).
    pub(crate) release_shared: Script,
    /// The `extend_shared` script (see the Lua text above).
    pub(crate) extend_shared: Script,
}

impl Scripts {
    fn new(publish: &str) -> Scripts {
        Scripts {
            acquire: Script::new(&script_text(ACQUIRE_LUA, publish)),
            release: Script::new(&script_text(RELEASE_LUA, publish)),
            extend: Script::new(&script_text(EXTEND_LUA, publish)),
            inspect: Script::new(&script_text(INSPECT_LUA, publish)),
            acquire_fair: Script::new(&script_text(ACQUIRE_FAIR_LUA, publish)),
            release_fair: Script::new(&script_text(RELEASE_FAIR_LUA, publish)),
            leave_queue: Script::new(&script_text(LEAVE_QUEUE_LUA, publish)),
            acquire_traced: traced(ACQUIRE_LUA, "result[1] == 1", publish),
            acquire_fair_traced: traced(ACQUIRE_FAIR_LUA, "result[1] == 1", publish),
            acquire_shared_traced: traced(ACQUIRE_SHARED_LUA, "result[1] == 1", publish),
            release_traced: traced(RELEASE_LUA, "result == 1", publish),
            release_fair_traced: traced(RELEASE_FAIR_LUA, "result == 1", publish),
            release_shared_traced: traced(RELEASE_SHARED_LUA, "result == 1", publish),
            extend_traced: traced(EXTEND_LUA, "result == 1", publish),
            extend_shared_traced: traced(EXTEND_SHARED_LUA, "result == 1", publish),
            append_trace: traced("return 1", "true", publish),
            acquire_shared: Script::new(&script_text(ACQUIRE_SHARED_LUA, publish)),
            release_shared: Script::new(&script_text(RELEASE_SHARED_LUA, publish)),
            extend_shared: Script::new(&script_text(EXTEND_SHARED_LUA, publish)),
        }
    }
}

static NODE_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("PUBLISH"));
static CLUSTER_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("SPUBLISH"));

/// The scripts for a Redis Cluster (`cluster`) or for one server (and Sentinel's master).
pub(crate) fn scripts(cluster: bool) -> &'static Scripts {
    if cluster {
        &CLUSTER_SCRIPTS
    } else {
        &NODE_SCRIPTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The functions `text` defines (each `local function` starting a line), in order.
    fn defined(text: &str) -> Vec<&str> {
        definitions(text)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// The names of the prelude's functions marked `used`.
    fn names(used: &[bool]) -> Vec<&'static str> {
        defined(PRELUDE)
            .into_iter()
            .zip(used)
            .filter_map(|(name, used)| used.then_some(name))
            .collect()
    }

    #[test]
    fn a_script_defines_the_functions_it_calls_and_those_they_call_only() {
        // The release calls four; `announce` and `changed` call none of the others.
        assert_eq!(
            defined(&script_text(RELEASE_FAIR_LUA, "PUBLISH")),
            ["changed", "token_of", "next_of", "announce"]
        );
        // A function comes with those it calls: `held_by` calls `token_of`.
        assert_eq!(
            names(&used_by("return held_by(KEYS[1], ARGV[1])", &[])),
            ["token_of", "held_by"]
        );
        assert!(names(&used_by("return 1", &[])).is_empty());
        // One defined already is not defined again, nor followed to those it calls.
        let token_of = used_by("return token_of(ARGV[1])", &[]);
        assert_eq!(
            names(&used_by("return held_by(KEYS[1], ARGV[1])", &token_of)),
            ["held_by"]
        );
    }

    #[test]
    fn the_common_case_comes_before_the_functions_only_the_rest_calls() {
        // An uncontended fair acquire returns having made two closures: the fence's and the
        // announcement's; the other functions come after it.
        let text = script_text(ACQUIRE_FAIR_LUA, "PUBLISH");
        let (common, rest) = text.split_once(REST).expect("the rest's line");
        assert_eq!(defined(common), ["next_fence", "changed"]);
        assert!(common.contains("return {1, fence, 0}"));
        assert_eq!(
            defined(rest),
            [
                "token_of",
                "hold_value",
                "held_by",
                "set_next",
                "now_ms",
                "drop_lapsed",
                "sweep",
                "writer_on_shared",
                "issue",
                "clock",
                "keep_place",
                "move_head",
                "put_back"
            ]
        );
        // The release's common case needs only `changed`.
        let text = script_text(RELEASE_FAIR_LUA, "SPUBLISH");
        let (common, rest) = text.split_once(REST).expect("the rest's line");
        assert_eq!(defined(common), ["changed"]);
        assert!(common.contains("redis.call('SPUBLISH'"));
        assert_eq!(defined(rest), ["token_of", "next_of", "announce"]);
        assert!(rest.contains("redis.call('SPUBLISH'"));
        // The shared acquire's: the clock's and the announcement's.
        let text = script_text(ACQUIRE_SHARED_LUA, "PUBLISH");
        let (common, _) = text.split_once(REST).expect("the rest's line");
        assert_eq!(defined(common), ["changed", "now_ms"]);
        // The first-come acquire's: the fence's, the announcement's and the grant's.
        let text = script_text(ACQUIRE_LUA, "PUBLISH");
        let (common, rest) = text.split_once(REST).expect("the rest's line");
        assert_eq!(defined(common), ["next_fence", "changed", "granted"]);
        assert_eq!(
            defined(rest),
            ["token_of", "held_by", "now_ms", "sweep", "writer_on_shared"]
        );
        // A script without a common case is the functions it calls, then its body.
        assert_eq!(
            script_text(EXTEND_LUA, "PUBLISH"),
            format!("{}{EXTEND_LUA}", definitions_of(&used_by(EXTEND_LUA, &[])))
        );
    }

    #[test]
    fn a_call_is_told_from_a_longer_name_ending_the_same() {
        assert!(calls("x = next_of(v)", "next_of"));
        assert!(calls("next_of(v)", "next_of"));
        assert!(!calls("x = my_next_of(v)", "next_of"));
        assert!(!calls("local next_of = 1", "next_of"));
    }
}
