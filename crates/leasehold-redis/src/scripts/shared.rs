//! The shared-mode scripts: readers of a read-write lock and semaphore permits, each a field of
//! the key's hash with its own expiry (the exclusive and fair scripts are in the parent module).

/// Shared acquire: a reader of a read-write lock (`ARGV[4]` = 0) or one permit of a semaphore
/// (`ARGV[4]` = N), as a `h:<token>` field of the key's hash with its own expiry.
///
/// `KEYS[1]` lock, `KEYS[2]` waiter queue, `KEYS[3]` waiter deadlines, `KEYS[4]` channel base
/// (see `announce`), `KEYS[5]` change channel (see `changed`);
/// `ARGV[1]` token, `ARGV[2]` TTL ms, `ARGV[3]` mode (`shared` or `semaphore:N`), `ARGV[4]`
/// permits (0 for a reader), `ARGV[5]` waiter id (empty: a try, never queued; in strict FIFO
/// mode the waiting call's own entry, as in `ACQUIRE_FAIR`), `ARGV[6]` waiter
/// timeout ms, `ARGV[7]` `1` to re-queue (other tasks of this process still wait), `ARGV[8]` `1`
/// for fair waiting (the queue of `ACQUIRE_FAIR`, shared with writers), `ARGV[9]` `1` to announce
/// the grant (see `changed`).
/// `KEYS[5]` is sent only for a grant that is announced or traced, and `ARGV[7]` to `ARGV[9]`
/// only up to the last that is not 0 (absent, each reads as `nil`, taken as 0).
///
/// With fair waiting, only the head of the line (or anyone, if nobody waits) may enter; after an
/// entry that leaves room (a permit left, or readers still admitted) the next process in line is
/// told at once, so N permits fill in N hand-offs without waiting for releases.
///
/// Returns `{1, 0, 0}` when granted, `{0, ms, mine}` when refused (`ms`: until room can appear
/// without a release, at least 1; `mine`: 1 when this very token holds already, a second run of
/// the request: see "A second run" in the parent module), or the error reply `MODECONFLICT <mode>` when
/// the key is held as another kind of lock.
pub(super) const ACQUIRE_SHARED_LUA: &str = r"
local me = ARGV[5]
local fair = ARGV[8] == '1'
local head = nil
if fair then
  head = redis.call('LINDEX', KEYS[2], 0)
end
-- The common case: a try on a key nobody holds and nobody waits for.
if me == '' and not head and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'mode', ARGV[3], 'h:' .. ARGV[1], now_ms() + tonumber(ARGV[2]))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  changed(KEYS[5], ARGV[1], ARGV[9])
  return {1, 0, 0}
end
-- The rest.
local permits = tonumber(ARGV[4])
local now = now_ms()
local head_deadline, dropped = nil, false
if fair then
  head, head_deadline, dropped = drop_lapsed(KEYS[2], KEYS[3], head, me, function() return now end)
end
local function refuse(ms)
  if fair and me ~= '' then
    if not redis.call('LPOS', KEYS[2], me) and redis.call('RPUSH', KEYS[2], me) == 1 then
      -- First in an empty line: an exclusive hold (which names nobody) must tell it.
      set_next(KEYS[1], me)
    end
    local keep = tonumber(ARGV[6])
    redis.call('HSET', KEYS[3], me, now + keep)
    redis.call('PEXPIRE', KEYS[2], keep * 2)
    redis.call('PEXPIRE', KEYS[3], keep * 2)
  end
  if dropped then
    -- The head changed under an exclusive hold: its release must tell the new one.
    set_next(KEYS[1], redis.call('LINDEX', KEYS[2], 0))
  end
  if ms < 1 then ms = 1 end
  return {0, ms, 0}
end
local t = redis.call('TYPE', KEYS[1]).ok
local live = 0
if t == 'string' then
  if permits > 0 then
    return redis.error_reply('MODECONFLICT exclusive')
  end
  return refuse(redis.call('PTTL', KEYS[1]))
elseif t == 'hash' then
  local mode, n, longest, soonest, marker = sweep(KEYS[1], now)
  if redis.call('HEXISTS', KEYS[1], 'h:' .. ARGV[1]) == 1 then
    return {0, soonest, 1}
  end
  live = n
  if n == 0 and marker == 0 then
    redis.call('DEL', KEYS[1])
  elseif mode ~= ARGV[3] then
    return redis.error_reply('MODECONFLICT ' .. (mode or 'unknown'))
  elseif permits == 0 and marker > 0 then
    return refuse(marker)
  elseif permits > 0 and n >= permits then
    return refuse(soonest)
  end
elseif t ~= 'none' then
  return redis.error_reply('lock key ' .. KEYS[1] .. ' holds a ' .. t .. '; delete it or use another key prefix')
end
if head and head ~= me then
  return refuse(head_deadline and (head_deadline - now) or 1)
end
redis.call('HSET', KEYS[1], 'mode', ARGV[3], 'h:' .. ARGV[1], now + tonumber(ARGV[2]))
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
live = live + 1
changed(KEYS[5], ARGV[1], ARGV[9])
if fair and me ~= '' then
  if head == me then
    redis.call('LPOP', KEYS[2])
    redis.call('HDEL', KEYS[3], me)
  end
  if ARGV[7] == '1' then
    local keep = tonumber(ARGV[6])
    redis.call('RPUSH', KEYS[2], me)
    redis.call('HSET', KEYS[3], me, now + keep)
    redis.call('PEXPIRE', KEYS[2], keep * 2)
    redis.call('PEXPIRE', KEYS[3], keep * 2)
  end
end
if fair and (permits == 0 or live < permits) then
  local next = redis.call('LINDEX', KEYS[2], 0)
  if next and next ~= me then
    announce(KEYS[4], next)
  end
end
return {1, 0, 0}
";

/// Shared release: remove our holder field if it is live; the record goes with its last entry
/// (a waiting writer's marker keeps it until the writer comes). Tells the next process in line.
/// `KEYS[1]` lock, `KEYS[2]` waiter queue, `KEYS[3]` channel base (see `announce`), `KEYS[4]`
/// change channel (see `changed`); `ARGV[1]` token, `ARGV[2]` `1` to announce the release
/// (`KEYS[4]` and `ARGV[2]` are sent only then, or for a traced call).
/// Returns 1 if our hold was live and is gone, 0 otherwise.
pub(super) const RELEASE_SHARED_LUA: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return 0
end
local now = now_ms()
local field = 'h:' .. ARGV[1]
local at = tonumber(redis.call('HGET', KEYS[1], field) or '0')
if at == 0 then
  return 0
end
redis.call('HDEL', KEYS[1], field)
if at <= now then
  return 0
end
local mode, live, longest, soonest, marker = sweep(KEYS[1], now)
if live == 0 and marker == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], math.max(longest, marker))
end
changed(KEYS[4], ARGV[1], ARGV[2])
local next = redis.call('LINDEX', KEYS[2], 0)
if next then
  announce(KEYS[3], next)
end
return 1
";

/// Shared extend: move our holder field's expiry if it is live, and the record's TTL with it.
/// `KEYS[1]` lock; `ARGV[1]` token, `ARGV[2]` TTL ms. Returns 1 if extended, 0 otherwise.
pub(super) const EXTEND_SHARED_LUA: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return 0
end
local now = now_ms()
local field = 'h:' .. ARGV[1]
if tonumber(redis.call('HGET', KEYS[1], field) or '0') <= now then
  return 0
end
redis.call('HSET', KEYS[1], field, now + tonumber(ARGV[2]))
local mode, live, longest, soonest, marker = sweep(KEYS[1], now)
redis.call('PEXPIRE', KEYS[1], math.max(longest, marker))
return 1
";
