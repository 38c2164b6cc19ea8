//! The fair-waiting scripts: the exclusive acquire that keeps each key's waiter line, its
//! release that tells the next entry in line, and leaving the line (the first-come and shared
//! scripts are in the parent module and `shared`).

/// Fair acquire: the lock goes to the first entry in the key's waiter queue.
///
/// An entry is a process (the store's id: the default, one place per process, round-robin) or,
/// in strict FIFO mode, one waiting call (`<store id>#<n>`, never re-queued: `ARGV[6]` is then
/// always 0); the script treats both alike.
///
/// `KEYS[1]` lock, `KEYS[2]` fence counter, `KEYS[3]` waiter queue (a list of waiter ids, oldest
/// first), `KEYS[4]` waiter deadlines (a hash: id → ms since the epoch, server time), `KEYS[5]`
/// change channel (see `changed`);
/// `ARGV[1]` token, `ARGV[2]` TTL ms, `ARGV[3]` waiter id (empty: a try-lock, never queued),
/// `ARGV[4]` waiter timeout ms, `ARGV[5]` `1` to fence, `ARGV[6]` `1` when other tasks of this
/// process still wait on the key: taking the lock then puts the process back at the end of the
/// line, so its next turn comes after every other process's; `2` (a blocking attempt of the
/// process's last waiter) the same only while others are in line, where its tasks are likely
/// to ask again (the process keeps its place, and gives it up if none does); `ARGV[7]` ms a
/// refused blocking writer keeps new readers out of a read-held key (0: a try); `ARGV[8]` `1`
/// to renew the deadline of a place that goes back to the end of the line (the caller sends it
/// once half the waiter timeout has passed since it last renewed it: a place a process
/// is served from again and again need not be renewed at every turn); `ARGV[9]` `1` to announce
/// the grant (see `changed`). `KEYS[5]` is sent only for a grant that is announced or traced, and
/// `ARGV[6]` to `ARGV[9]` only up to the last that is not 0: absent, each reads as `nil`, taken
/// as 0 (the server makes a string of every key and argument on every call).
///
/// A waiter that stopped asking (crashed) is dropped once its deadline passes, when it reaches the
/// head. The caller may take the lock if the queue is empty or it is at the head. Its own entry
/// at the head is moved by the command that reads it (popped, or rotated to the end for a
/// process going back in line): that is the steady state of a hot key, the entry the last
/// release told, so the turn costs no separate read. Any other head is put back where it was.
/// Otherwise a blocking caller joins the back of the queue (or renews its deadline).
///
/// The hold's value names the next entry in line (see `token_of`), read after the move.
///
/// Returns `{1, fence or false, others}` when acquired (`others`: 1 when another entry is next
/// in line, else 0), else `{0, ms, mine}`: `ms` is how long until the lock can be free without a
/// release (the holder's TTL left, or the head waiter's deadline), at least 1; `mine` is 1 when
/// the lock is held by this very token (see "A second run" in the parent module); such a run joins
/// nothing.
///
/// The fencing token is issued (`next_fence`) before the lock is set, whose value carries it
/// (`hold_value`): a counter `next_fence` cannot increment is an error with nothing set and the
/// line as it was, never a lock taken without a token.
pub(super) const ACQUIRE_FAIR_LUA: &str = r"
local me = ARGV[3]
-- The token a grant carries, issued once per call before its first `SET` (on either path; see
-- `issue`): false when not fencing, or an error reply (see `next_fence`).
local fence = nil
-- The common case: a try on a key nobody holds and nobody waits for, written out (no closures
-- of its own to make). A refused `SET NX` changed nothing but the counter; the rest of the
-- script decides the refusal without sending it again.
local head, tried = nil, false
if me == '' then
  head = redis.call('LINDEX', KEYS[3], 0)
  if not head then
    fence = false
    local value = ARGV[1] .. '\n'
    if ARGV[5] == '1' then
      fence = next_fence(KEYS[2], ARGV[2])
      if type(fence) == 'table' then return fence end
      value = ARGV[1] .. '\t' .. string.format('%d', fence) .. '\n'
    end
    if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
      changed(KEYS[5], ARGV[1], ARGV[9])
      return {1, fence, 0}
    end
    tried = true
  end
end
-- The rest.
local function issue()
  if fence == nil then
    fence = false
    if ARGV[5] == '1' then
      fence = next_fence(KEYS[2], ARGV[2])
    end
  end
  return fence
end
local requeue = ARGV[6] == '1' and me ~= ''
local stay = ARGV[6] == '2' and me ~= ''
local rotate = requeue or stay
local now = nil
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local function keep_place()
  local keep = tonumber(ARGV[4])
  redis.call('HSET', KEYS[4], me, clock() + keep)
  redis.call('PEXPIRE', KEYS[3], keep * 2)
  redis.call('PEXPIRE', KEYS[4], keep * 2)
end
local moved = false
local function move_head()
  if rotate then
    return redis.call('LMOVE', KEYS[3], KEYS[3], 'LEFT', 'RIGHT')
  end
  return redis.call('LPOP', KEYS[3])
end
local function put_back(entry)
  if rotate then
    redis.call('LMOVE', KEYS[3], KEYS[3], 'RIGHT', 'LEFT')
  else
    redis.call('LPUSH', KEYS[3], entry)
  end
end
if me ~= '' then
  head = move_head()
  if head == me then
    moved = true
  elseif head then
    put_back(head)
  end
end
local head_deadline, dropped
head, head_deadline, dropped = drop_lapsed(KEYS[3], KEYS[4], head, me, clock)
local joined = false
local in_line = false
local left = nil
if (not head) or head == me then
  if type(issue()) == 'table' then
    if moved then put_back(me) end
    -- Lapsed heads dropped stay dropped: a hold must name the new one (as below).
    if dropped then set_next(KEYS[1], redis.call('LINDEX', KEYS[3], 0)) end
    return fence
  end
  if head and not moved then
    move_head()
    moved = true
  end
  local next = false
  if moved then
    next = redis.call('LINDEX', KEYS[3], 0)
    if stay and next == me then
      -- Nobody else in line: no place is kept.
      redis.call('LPOP', KEYS[3])
      next = false
      stay = false
      rotate = false
    end
  elseif requeue then
    -- The line was empty: the process goes in line for its tasks still waiting.
    redis.call('RPUSH', KEYS[3], me)
    joined = true
    next = me
  end
  local value = hold_value(fence, next or '')
  local taken = (not tried) and redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
  if not taken then
    local refused = writer_on_shared(KEYS[1], tonumber(ARGV[7] or '0'))
    if type(refused) == 'table' and refused.err then
      if moved then put_back(me) end
      return refused
    end
    if refused then
      left = refused[2]
    else
      taken = redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
    end
  end
  if taken then
    changed(KEYS[5], ARGV[1], ARGV[9])
    -- A served waiting call's deadline goes with it (strict FIFO entries, `<id>#<n>`, are new
    -- for every wait); a process's is overwritten when it joins again, and expires with the
    -- line, so its removal is not worth a command per hand-over.
    if moved and not rotate and string.find(me, '#', 1, true) then
      redis.call('HDEL', KEYS[4], me)
    end
    if joined or (rotate and moved and ARGV[8] == '1') then
      keep_place()
    end
    local others = 0
    if next and next ~= me then others = 1 end
    return {1, fence, others}
  end
  if moved then
    put_back(me)
    moved = false
    in_line = true
  end
end
-- Refused by our own token: a second run (see the module docs), whose first run took the lock
-- and left the line as it should be; it joins nothing.
local mine = held_by(KEYS[1], ARGV[1])
if me ~= '' and not mine then
  local first = joined
  if not (joined or in_line or redis.call('LPOS', KEYS[3], me)) then
    first = redis.call('RPUSH', KEYS[3], me) == 1
  end
  if first then
    -- First in an empty line: the hold (which names nobody) must tell it.
    set_next(KEYS[1], me)
  end
  keep_place()
end
if dropped then
  -- The head changed under a hold: its release must tell the new one.
  set_next(KEYS[1], redis.call('LINDEX', KEYS[3], 0))
end
-- How long until the lock can be free without a release: the refusal's own answer (the
-- holder's TTL left), else the key's, else the head waiter's deadline.
if not left then
  left = redis.call('PTTL', KEYS[1])
  if left < 0 then
    left = head_deadline and (head_deadline - clock()) or 1
  end
end
if left < 1 then left = 1 end
if mine then
  return {0, left, 1}
end
return {0, left, 0}
";

/// Fair release: delete the lock only if it holds our token, and tell the next entry in line:
/// the one the hold's value names (see `token_of`; none named: nobody waits), or for a bare
/// token the line's head. An uncontended release reads no line.
/// `KEYS[1]` lock, `KEYS[2]` waiter queue, `KEYS[3]` channel base (see `announce`), `KEYS[4]`
/// change channel (see `changed`); `ARGV[1]` token, `ARGV[2]` `1` to announce the release
/// (`KEYS[4]` and `ARGV[2]` are sent only then, or for a traced call).
/// Returns 1 if deleted, 0 otherwise.
pub(super) const RELEASE_FAIR_LUA: &str = r"
local value = redis.pcall('GET', KEYS[1])
-- The common case: our hold, naming nobody next (nobody waits): our token, then its fence or
-- nothing, and the value's only newline ends it (plain finds, no pattern to run).
local mark = #ARGV[1] + 1
local after = type(value) == 'string' and string.find(value, ARGV[1], 1, true) == 1
  and string.byte(value, mark)
if (after == 9 or after == 10) and string.find(value, '\n', mark, true) == #value then
  redis.call('DEL', KEYS[1])
  changed(KEYS[4], ARGV[1], ARGV[2])
  return 1
end
-- The rest.
if type(value) == 'string' and token_of(value) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  changed(KEYS[4], ARGV[1], ARGV[2])
  local next = next_of(value)
  if not next then
    next = redis.call('LINDEX', KEYS[2], 0)
  end
  if next and next ~= '' then
    announce(KEYS[3], next)
  end
  return 1
end
return 0
";

/// Leave a key's waiter queue (the process, or in strict mode the waiting call, stopped waiting
/// without the lock); if it was first in line, tell the next one now when the lock is free, or
/// point the hold's release at it (`set_next`).
/// `KEYS[1]` waiter queue, `KEYS[2]` lock, `KEYS[3]` channel base (see `announce`), `KEYS[4]`
/// waiter deadlines; `ARGV[1]` waiter id.
pub(super) const LEAVE_QUEUE_LUA: &str = r"
local head = redis.call('LINDEX', KEYS[1], 0)
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('LREM', KEYS[1], 0, ARGV[1]) > 0 and head == ARGV[1] then
  local next = redis.call('LINDEX', KEYS[1], 0)
  if redis.call('EXISTS', KEYS[2]) == 0 then
    if next then
      announce(KEYS[3], next)
    end
  else
    set_next(KEYS[2], next)
  end
end
return 0
";
