-- _lib.lua: helpers shared by the scripts. common/scripts.py gives each script only the
-- definitions it uses (and those they use), so every definition here is a top-level
-- `local function` (ending with `end` in column 0) or a `local NAME =` value.
-- Keys are written `prefix .. K.<kind> .. id`: the suffixes come from common/keys.py.
-- Time comes only from the server clock, so every process agrees on due times and leases.
-- Tested by: tests/unit/test_script_assembly.py, tests/integration/test_scripts.py

local EVENTS_MAXLEN = 10000

-- Every run state (the same list as common/models.py STATES, checked by a test).
local STATES = {scheduled = true, waiting = true, running = true, retrying = true,
  succeeded = true, dead = true, uncertain = true, cancelled = true, skipped = true,
  missed = true}

-- The states a run ends in (common/models.py TERMINAL); a waiter also stops at 'uncertain'.
local FINAL = {succeeded = true, dead = true, cancelled = true, skipped = true, missed = true}

-- The run fields a namespace of format 3 leaves out at their default (docs/keys.md "The run
-- record"): the queue 'default', and the task's default retry policy (common/tasks.py
-- TaskSpec: 3 retries, so 4 attempts, 1 s back-off doubling up to 300 s), as the strings a
-- producer sends. An absent `created` is the run's `due`. Every reader of these fields reads
-- an absent one as its default.
local RUN_DEFAULTS = {queue = 'default', max_attempts = '4', backoff_base = '1000',
  backoff_max = '300000'}

-- A number read from Redis, or nil when it is missing, not a number, nan or infinite: a field
-- edited by hand must make its run or schedule refused, never a nan score or a script error
-- halfway through a transition (Redis does not undo the writes before an error).
local function num(x)
  local n = tonumber(x)
  if n and n == n and n > -math.huge and n < math.huge then return n end
  return nil
end

-- Nil when `key` is absent or of type `want`, else the reason, naming the key: checked before
-- a script's first write, so a key of the wrong type (written by hand or by another client)
-- refuses the one run or call it belongs to instead of failing the script halfway.
local function wrong_type(key, want)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' or t == want then return nil end
  return 'key ' .. key .. ' is a ' .. t .. ', not a ' .. want
end

-- The index keys of a call (pairs: key, type), checked before its first write: the first one
-- damaged, as an error reply starting 'DAMAGED' (the caller sets that partition aside and
-- goes on with the others), else nil.
local function damaged_index(pairs_)
  for i = 1, #pairs_, 2 do
    local why = wrong_type(pairs_[i], pairs_[i + 1])
    if why then return redis.error_reply('DAMAGED ' .. why) end
  end
  return nil
end

-- Redis keeps a sorted set as a listpack while it has at most 128 entries of at most 64 bytes
-- (zset-max-listpack-entries / -value), and each insert into or removal from a listpack scans
-- it from its head: a batch of n entries written into one costs O(n^2). At the batch sizes a
-- drain writes (the leases of a claim of up to 128 runs, the due runs of an enqueue call, the
-- finished runs of a complete call) that was about a fifth of Redis's instructions per run
-- (bench/RESULTS.md, "Sorted sets that stay skiplists"). So a batch of ZSET_BATCH entries or
-- more goes into a skiplist: an entry longer than 64 bytes, first in the same ZADD, makes
-- Redis create (or convert) the set as a skiplist, and it is removed again at once; Redis
-- never converts a skiplist back, not even as it shrinks, so the set stays one until it is
-- emptied (and deleted). Nobody sees the entry: the script is atomic. A set that is already a
-- skiplist, and a server without OBJECT ENCODING (fakeredis), get the plain ZADD. `entries`
-- is ZADD's flat list: score, member, score, member, ...
local SKIPLIST_SEED = string.rep('~', 65)
local ZSET_BATCH = 16

local function zadd_batch(key, entries)
  if #entries >= 2 * ZSET_BATCH then
    local enc = redis.pcall('OBJECT', 'ENCODING', key)
    if type(enc) ~= 'table' and enc ~= 'skiplist' then  -- no set yet (false), or a listpack
      redis.call('ZADD', key, 0, SKIPLIST_SEED, unpack(entries))
      redis.call('ZREM', key, SKIPLIST_SEED)
      return
    end
  end
  redis.call('ZADD', key, unpack(entries))
end

-- A run's fields (HMGET), or nil and the reason when its record key is not a hash.
local function run_fields(run_key, ...)
  local f = redis.pcall('HMGET', run_key, ...)
  if f.err then return nil, 'key ' .. run_key .. ' is not a hash (' .. f.err .. ')' end
  return f, nil
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer as a decimal string, for arguments and JSON. A string read from Redis passes
-- through untouched; a number is formatted as an integer. Lua's own number-to-string (used
-- when a number is passed to redis.call or joined with ..) goes through printf's float path
-- (%.14g): profiling the hot scripts found that float formatting took ~12% of Redis's CPU.
local function int_s(x)
  if type(x) == 'string' and x ~= '' then return x end
  return string.format('%d', tonumber(x) or 0)
end

-- Due times (docs/keys.md "Namespace format"): from format 4 a run's due time is kept to the
-- microsecond: its `due` field and its due-set score may carry a fraction of a ms
-- (the instant asked for, never rounded); every other time stays a whole ms.
-- due_text: a due time sent by a client as text ('1765000000123' or '1765000000123.457'), as
-- this partition stores it: as sent where `fine` (its T:caps format is 4 or later), else
-- rounded up to the whole ms, so a process of an older release, which reads whole ms only,
-- never meets a fraction and the run never starts before the instant asked for.
local function due_text(s, fine)
  if fine or not s:find('.', 1, true) then return s end
  return string.format('%d', math.ceil(tonumber(s)))
end

-- A due time (a number, perhaps with a fraction of a ms) as text: a whole ms as an integer
-- (see int_s), a fraction with the 17 digits that give the same double back (rounded to the
-- microsecond, the text could name a double below the instant).
local function ms_s(x)
  if type(x) == 'string' and x ~= '' then return x end
  x = tonumber(x) or 0
  if x % 1 == 0 then return string.format('%d', x) end
  return string.format('%.17g', x)
end

-- A time in ms as a whole ms, rounded up: an attempt's start, claimed ahead of a due time
-- kept to the microsecond, is recorded as the first whole ms at or after it.
local function ceil_s(x)
  if type(x) == 'string' and not x:find('.', 1, true) then return x end
  return string.format('%d', math.ceil(tonumber(x) or 0))
end

-- Append a lifecycle event to the partition's capped stream.
local function emit(events_key, run_id, kind, detail)
  redis.call('XADD', events_key, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
    'run', run_id, 'event', kind, 'detail', detail or '')
end

-- A run whose own record key is of the wrong type cannot be written: its id goes to the dead
-- set, with the reason (naming the key) in the partition's events; the key is left as found.
local function dead_unreadable(dead_key, events_key, run_id, now, reason)
  redis.call('ZADD', dead_key, now, run_id)
  emit(events_key, run_id, 'dead', reason)
end

-- Close the current attempt: one JSON entry per attempt, pushed when it ends, so entry
-- number `fence` (1-based) is that claim's attempt. The running attempt lives in the run hash.
-- Built as one string (no table + cjson.encode per run: complete.lua does this per success).
-- n, fence, start and now: integers, or their decimal strings as read from Redis.
-- Returns nil, or -- the attempts key being of the wrong type, so nothing was written -- the
-- reason naming the key: callers push the attempt before their other writes.
local function push_attempt(attempts_key, n, fence, worker, start, outcome, now, err)
  local s = '{"n":' .. int_s(n) .. ',"fence":' .. int_s(fence)
    .. ',"worker":' .. cjson.encode(worker or '') .. ',"end":' .. int_s(now)
    .. ',"outcome":"' .. outcome .. '"'
  if start and start ~= '' then s = s .. ',"start":' .. int_s(start) end
  if err then s = s .. ',"error":' .. cjson.encode(err) end
  local r = redis.pcall('RPUSH', attempts_key, s .. '}')
  if type(r) == 'table' and r.err then return 'key ' .. attempts_key .. ' is not a list' end
  return nil
end

-- Merge fields into attempt entry number `fence` (1-based), if it was pushed already. The
-- attempt that succeeded a run is inline (complete.lua pushes no entry for it: the run
-- hash's attempt, fence, worker, started and finished are its entry); given `run_key`, that
-- inline entry is pushed first when it is the one to merge into (a late report about it).
local function set_attempt(attempts_key, fence, fields, run_key)
  local idx = (tonumber(fence) or 0) - 1
  if idx < 0 then return end
  local raw = redis.pcall('LINDEX', attempts_key, idx)
  if run_key and raw == false and redis.pcall('LLEN', attempts_key) == idx then
    local h = redis.pcall('HMGET', run_key, 'state', 'fence', 'attempt', 'worker', 'started',
      'finished')
    if h.err or h[1] ~= 'succeeded' or h[2] ~= fence then return end
    if push_attempt(attempts_key, h[3], fence, h[4], h[5], 'succeeded', h[6], nil) then return end
    raw = redis.call('LINDEX', attempts_key, idx)
  end
  if type(raw) ~= 'string' then return end  -- none, or a damaged key: nothing to merge into
  local ok, a = pcall(cjson.decode, raw)
  if not ok or type(a) ~= 'table' then return end
  for k, v in pairs(fields) do a[k] = v end
  redis.call('LSET', attempts_key, idx, cjson.encode(a))
end

-- Exponential backoff with "equal jitter": half fixed, half random (jitter in [0,1)), capped.
-- base, cap, attempt: numbers (the caller checked them).
local function backoff_ms(base, cap, attempt, jitter)
  local d = base * (2 ^ (attempt - 1))
  if d > cap then d = cap end
  if d < 0 then d = 0 end
  return math.floor(d / 2 + (d / 2) * (num(jitter) or 0))
end

-- Tell idle workers (the wake channel) that queue `queue` of `partition` has a run due at
-- `due` ms: the message '<partition>|<queue>|<due>', built here and nowhere else (its Python
-- twin, build and parse, is common/wake.py; a test checks they agree).
local function wake_workers(channel, partition, queue, due)
  redis.call('PUBLISH', channel, partition .. '|' .. queue .. '|' .. int_s(due))
end

-- Add a member to a due/retry zset; tell idle workers when it became the set's earliest.
-- `score` is a number or its text (a due time's, its fraction of a ms kept: redis.call sends a
-- number with the 17 digits that give the same double back).
local function add_due(zkey, score, run_id, channel, partition, queue)
  local head = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
  redis.call('ZADD', zkey, score, run_id)
  score = tonumber(score)
  if head[2] == nil or score < tonumber(head[2]) then
    wake_workers(channel, partition, queue, score)
  end
end

-- Tell the schedulers (their wake channel) that something in `key` -- a zset they sleep on:
-- schedules due (kind s), leases (l), starting deadlines (d) -- comes due at `ms`, if that is
-- earlier than its head: call it before adding `ms` to the set.
local function tell_schedulers(channel, kind, partition, key, ms)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] == nil or tonumber(ms) < tonumber(head[2]) then
    redis.call('PUBLISH', channel, kind .. '|' .. partition .. '|' .. int_s(ms))
  end
end

-- Wake each client blocked on a run (app.wait, await_result) with one list element. A run
-- nobody waits on costs one field read (none where the caller read `waited` already: pass it;
-- nil means "read it").
local function notify_waiters(prefix, run_key, run_id, state, waited)
  if waited == nil then waited = redis.call('HGET', run_key, 'waited') end
  local n = tonumber(waited) or 0
  if n <= 0 then return end
  local key = prefix .. K.notify .. run_id
  for _ = 1, n do redis.call('RPUSH', key, state) end
  redis.call('PEXPIRE', key, 60000)
  redis.call('HDEL', run_key, 'waited')
end

-- Dependencies and batches (docs/workloads.md): one mechanism. A run that waits is in state
-- `waiting`, in no due set, until its gate opens: its own set T:deps:<id> of pending
-- dependency ids (depends_on; field deps_mode 'succeed' or 'finish'), or its batch's counter
-- (a batch callback: field batch_role). When a run ends, `settle_dependents` (called from
-- wake_waiters, which every final transition calls) takes it out of every gate it is in, in
-- the same script call: SREM, so a report counted twice counts once.

-- The partition index of a prefix 'ns:{p<index>.<n>}:' (tags: common/keys.py _tag_for).
local function prefix_partition(prefix)
  return string.match(prefix, '{p(%d+)%.%d+}:$')
end

-- The namespace's wake channel, from a partition prefix.
local function prefix_channel(prefix)
  return string.match(prefix, '^(.*):{[^}]*}:$') .. ':' .. G.wake
end

-- Tell the schedulers' relay (kind r on their wake channel) that this partition's T:depnotes
-- or T:deplinks has an entry for it: the reaper reads those lists when told, and all of them
-- only at its safety read, so an idle namespace costs no list reads per tick.
local function tell_relay(prefix)
  local ns = string.match(prefix, '^(.*):{[^}]*}:$')
  redis.call('PUBLISH', ns .. ':' .. G.sched_wake, 'r|' .. prefix_partition(prefix) .. '|' .. now_ms())
end

-- A waiting run's gate opened: it becomes due (at its own due time, or now), indexed as
-- enqueue.lua indexes a new run (due set, priority index, tenant lane). A due index of the
-- wrong type dead-letters this run alone, naming the key. Returns true when it was released.
-- `fresh`: created by this very call and due at once (a batch member, a run whose
-- dependencies all succeeded already): not listed as waiting, no 'released' event, and its
-- queue's index keys were type-checked by the caller before its first write (hold.lua).
local function release_waiting(prefix, run_id, now, fresh)
  local run_key = prefix .. K.run .. run_id
  local f = redis.pcall('HMGET', run_key, 'state', 'queue', 'due', 'priority', 'tenant')
  if f.err or f[1] ~= 'waiting' then return false end
  local queue = f[2] or RUN_DEFAULTS.queue
  local due = math.max(num(f[3]) or now, now)
  local due_s = ms_s(due)  -- to the microsecond where it was kept so (format 4)
  local due_key = prefix .. K.due .. queue
  local lanes_key = prefix .. K.lanes .. queue
  local why = not fresh and (wrong_type(due_key, 'zset')
    or wrong_type(prefix .. K.prio .. queue, 'zset') or wrong_type(lanes_key, 'zset')
    or wrong_type(prefix .. K.laned .. queue, 'zset'))
  if not fresh then
    redis.call('DEL', prefix .. K.deps .. run_id)
    redis.call('ZREM', prefix .. K.waiting, run_id)
  end
  if why then
    redis.call('HSET', run_key, 'state', 'dead', 'finished', now, 'reason', why)
    redis.call('ZADD', prefix .. K.dead, now, run_id)
    emit(prefix .. K.events, run_id, 'dead', why)
    return false
  end
  if fresh then
    redis.call('HSET', run_key, 'state', 'scheduled')
  else
    redis.call('HSET', run_key, 'state', 'scheduled', 'due', due_s, 'released', now)
  end
  if f[4] then redis.call('ZADD', prefix .. K.prio .. queue, -tonumber(f[4]) * 1e13 + due, run_id) end
  if f[5] or redis.call('EXISTS', lanes_key) == 1 then
    local tenant = f[5] or ''
    redis.call('ZADD', prefix .. K.lane .. queue .. '|' .. tenant, due_s, run_id)
    redis.call('ZADD', prefix .. K.laned .. queue, due_s, run_id)
    redis.call('ZADD', lanes_key, 'NX', 0, tenant)
  end
  add_due(due_key, due_s, run_id, prefix_channel(prefix), prefix_partition(prefix), queue)
  if not fresh then emit(prefix .. K.events, run_id, 'released', '') end
  return true
end

-- A waiting run whose gate can no longer open (a dependency failed; its batch succeeded, for
-- an on_failure callback) is cancelled with the reason; its id goes on `todo`, so its own
-- dependents are settled in turn (no recursion: a chain cancels link by link).
local function cancel_waiting(prefix, run_id, reason, now, todo)
  local run_key = prefix .. K.run .. run_id
  local st = redis.pcall('HGET', run_key, 'state')
  if st ~= 'waiting' then return end
  redis.call('HSET', run_key, 'state', 'cancelled', 'finished', now, 'reason', reason)
  redis.call('ZADD', prefix .. K.done, now, run_id)
  redis.call('DEL', prefix .. K.deps .. run_id)
  redis.call('ZREM', prefix .. K.waiting, run_id)
  emit(prefix .. K.events, run_id, 'cancelled', reason)
  notify_waiters(prefix, run_key, run_id, 'cancelled')
  todo[#todo + 1] = run_id
  todo[#todo + 1] = 'cancelled'
end

-- Dependency `dep_id` of waiting run `run_id` (this partition) ended in `dep_state`
-- ('missing': it does not exist). Counted once (SREM); a failure cancels the run unless it
-- waits for every dependency to finish (deps_mode 'finish'); the last one releases it.
local function gate_apply(prefix, run_id, dep_id, dep_state, now, todo)
  local f = redis.pcall('HMGET', prefix .. K.run .. run_id, 'state', 'deps_mode')
  if f.err or f[1] ~= 'waiting' then return end
  local pending = prefix .. K.deps .. run_id
  if wrong_type(pending, 'set') then return end
  if redis.call('SREM', pending, dep_id) == 0 then return end
  if dep_state ~= 'succeeded' and f[2] ~= 'finish' then
    local how = dep_state == 'missing' and ' does not exist' or (' ended ' .. dep_state)
    cancel_waiting(prefix, run_id, 'dependency ' .. dep_id .. how, now, todo)
  elseif redis.call('SCARD', pending) == 0 then
    release_waiting(prefix, run_id, now)
  end
end

-- A batch's gate: every member of batch `batch_id` is in T:bpending:<batch> until it ends;
-- the SREM that takes it out is the one place it is counted, and the transitions of the
-- batch (first failure, last member) happen in that same call, so each callback is released
-- or cancelled once, whichever worker reports, however often.
local function batch_counted(prefix, batch_id, member, ok, now, todo)
  local bkey, pending = prefix .. K.batch .. batch_id, prefix .. K.bpending .. batch_id
  if wrong_type(bkey, 'hash') or wrong_type(pending, 'set') then return end
  if redis.call('SREM', pending, member) == 0 then return end
  -- ok nil: not a member but the '~open' mark of a batch being created, now sealed
  local n = ok ~= nil and redis.call('HINCRBY', bkey, ok and 'succeeded' or 'failed', 1)
  local cb = redis.call('HMGET', bkey, 'on_complete', 'on_success', 'on_failure', 'failed')
  if ok == false and n == 1 then
    if cb[3] then release_waiting(prefix, cb[3], now) end
    if cb[2] then
      cancel_waiting(prefix, cb[2], 'batch ' .. batch_id .. ': member ' .. member
        .. ' did not succeed', now, todo)
    end
  end
  if redis.call('SCARD', pending) > 0 then return end
  local failed = tonumber(cb[4]) or 0
  redis.call('HSET', bkey, 'state', failed > 0 and 'failed' or 'succeeded', 'finished', now)
  redis.call('ZADD', prefix .. K.batches, now, batch_id)
  if cb[1] then release_waiting(prefix, cb[1], now) end
  if failed == 0 then
    if cb[2] then release_waiting(prefix, cb[2], now) end
    if cb[3] then
      cancel_waiting(prefix, cb[3], 'batch ' .. batch_id .. ' succeeded', now, todo)
    end
  end
end

-- A run ended in final `state`: settle every gate it is in. `links`: its fields batch and
-- deps_out as the caller read them ({batch or false, deps_out or false}), nil to read them.
-- A dependent in another partition gets a notice in this partition's T:depnotes, which the
-- relay (scheduler/reaper.py) applies there with deps_apply.lua, idempotently.
local function settle_dependents(prefix, run_key, run_id, state, links)
  if links == nil then
    local f = redis.pcall('HMGET', run_key, 'batch', 'deps_out')
    if f.err then return end
    links = {f[1] or false, f[2] or false}
  end
  if not links[1] and not links[2] then return end
  local now = now_ms()
  local here = prefix_partition(prefix)
  local todo, i, told = {run_id, state}, 1, false
  while i < #todo do
    local id, st = todo[i], todo[i + 1]
    i = i + 2
    local batch, out = links[1], links[2]
    if i > 3 then
      local f = redis.pcall('HMGET', prefix .. K.run .. id, 'batch', 'deps_out')
      if f.err then f = {} end
      batch, out = f[1], f[2]
    end
    if out then
      local dkey = prefix .. K.dependents .. id
      if not wrong_type(dkey, 'set') and not wrong_type(prefix .. K.depnotes, 'list') then
        for _, e in ipairs(redis.call('SMEMBERS', dkey)) do
          local p, dependent = string.match(e, '^(%d+)|(.+)$')
          if p == here then
            gate_apply(prefix, dependent, id, st, now, todo)
          elseif p then
            redis.call('RPUSH', prefix .. K.depnotes, p .. '|' .. dependent .. '|' .. id .. '|' .. st)
            if not told then tell_relay(prefix); told = true end
          end
        end
      end
    end
    if batch and batch ~= '' then batch_counted(prefix, batch, id, st == 'succeeded', now, todo) end
  end
end

-- A run reached a state its waiters stop at (final, or uncertain): its dependents and batch
-- are settled (final states only), and each client blocked on it is woken. `waited` and
-- `links`: fields the caller read already (nil: read them here).
local function wake_waiters(prefix, run_key, run_id, state, waited, links)
  if FINAL[state] then settle_dependents(prefix, run_key, run_id, state, links) end
  notify_waiters(prefix, run_key, run_id, state, waited)
end

-- A run that cannot go on because its record is damaged (a field edited by hand, a state
-- nobody wrote): dead-lettered with the reason, so an operator sees it; never dropped.
local function dead_letter(prefix, run_key, dead_key, events_key, run_id, now, reason)
  redis.call('HSET', run_key, 'state', 'dead', 'finished', now, 'reason', reason)
  redis.call('ZADD', dead_key, now, run_id)
  emit(events_key, run_id, 'dead', reason)
  wake_waiters(prefix, run_key, run_id, 'dead')
end

-- A failed or abandoned attempt: retry (with backoff, or `delay` ms, counted from `from`,
-- default now) or dead-letter when attempts ran out. A run whose attempt counters or retry
-- policy are unreadable is dead-lettered saying so. Returns the new state and the retry time.
local function retry_or_dead(prefix, run_key, retry_key, dead_key, run_id, now, force_dead,
                             delay, jitter, reason, channel, partition, queue, from)
  local f = redis.call('HMGET', run_key, 'attempt', 'max_attempts', 'backoff_base', 'backoff_max')
  local attempt, max_attempts = num(f[1]), num(f[2] or RUN_DEFAULTS.max_attempts)
  local base = num(f[3] or RUN_DEFAULTS.backoff_base)
  local cap = num(f[4] or RUN_DEFAULTS.backoff_max)
  if not (attempt and max_attempts and base and cap) then
    force_dead = true
    reason = reason .. '; run record ' .. run_key
      .. ' damaged: attempt/max_attempts/backoff_base/backoff_max unreadable'
  end
  if not force_dead then
    local why = wrong_type(retry_key, 'zset')
    if why then force_dead, reason = true, reason .. '; ' .. why end
  end
  if delay ~= nil then delay = num(delay) or 0 end
  if force_dead or attempt >= max_attempts then
    redis.call('HSET', run_key, 'state', 'dead', 'finished', now, 'reason', reason)
    redis.call('ZADD', dead_key, now, run_id)
    wake_waiters(prefix, run_key, run_id, 'dead')
    return 'dead', 0
  end
  if delay == nil then delay = backoff_ms(base, cap, attempt, jitter) end
  local at = (from or now) + delay
  redis.call('HSET', run_key, 'state', 'retrying', 'retry_at', int_s(math.max(at, now)),
    'reason', reason)
  add_due(retry_key, at, run_id, channel, partition, queue)
  return 'retrying', at
end

-- A run of a schedule stops running (any outcome): forget it, and make the schedule's
-- buffered successor (overlap buffer_one / cancel_other) due now, if it has one. Runs of
-- schedules with overlap 'allow' are not tracked (claim.lua does not add them).
-- Schedule keys are built from the partition prefix: they share the run's hash tag.
local function leave_running(prefix, run_key, run_id, now, channel, partition)
  local f = redis.call('HMGET', run_key, 'schedule', 'overlap')
  local sched, overlap = f[1], f[2]
  if not sched or sched == '' or not overlap or overlap == 'allow' then return end
  local running = prefix .. K.sched_running .. sched
  local sched_key = prefix .. K.sched .. sched
  -- a schedule key of the wrong type is the evaluator's to quarantine; the run goes on ending
  if wrong_type(running, 'set') or wrong_type(sched_key, 'hash') then return end
  redis.call('SREM', running, run_id)
  if redis.call('SCARD', running) > 0 then return end
  local buffered = redis.call('HGET', sched_key, 'buffered')
  if buffered and buffered ~= '' then
    redis.call('HDEL', sched_key, 'buffered')
    -- due now, but never before its own due time (it may have been claimed ahead of it)
    local b = redis.pcall('HMGET', prefix .. K.run .. buffered, 'state', 'queue', 'due')
    local q = not b.err and b[1] and (b[2] or RUN_DEFAULTS.queue)
    if q and not wrong_type(prefix .. K.due .. q, 'zset') then
      add_due(prefix .. K.due .. q, math.max(now, num(b[3]) or 0), buffered, channel,
        partition, q)
    end
  end
end

-- A run that will never start (skipped, missed, cancelled before it ran) is finished.
local function finish_unstarted(prefix, run_id, state, reason, now, done_key, deadlines_key,
                                 events_key)
  local run_key = prefix .. K.run .. run_id
  redis.call('HSET', run_key, 'state', state, 'finished', now, 'reason', reason)
  redis.call('ZADD', done_key, now, run_id)
  redis.call('ZREM', deadlines_key, run_id)
  local sched = redis.call('HGET', run_key, 'schedule')
  if sched and sched ~= '' then
    redis.call('HINCRBY', prefix .. K.sched .. sched, state .. '_count', 1)
  end
  emit(events_key, run_id, state, reason)
  wake_waiters(prefix, run_key, run_id, state)
end

-- An attempt ends (any outcome): free the concurrency slots its claim took (the run's `held`
-- field: the limit scopes, space separated; see claim.lua). Returns true when one of those
-- limits was full, so the caller wakes the workers it may have been holding back. One field
-- read for a run that held none.
local function free_limits(prefix, run_key, run_id, held)
  if held == nil then held = redis.call('HGET', run_key, 'held') end
  if not held or held == '' then return false end
  local was_full = false
  for scope in string.gmatch(held, '%S+') do
    local key = prefix .. K.limrun .. scope
    if redis.pcall('ZREM', key, run_id) == 1 then  -- a damaged slot set frees nothing
      local max = tonumber(redis.call('HGET', prefix .. K.limits, scope .. ':c'))
      if max and redis.call('ZCARD', key) + 1 >= max then was_full = true end
    end
  end
  redis.call('HDEL', run_key, 'held')
  return was_full
end

-- A running attempt is given back by its holder without ending the run (release.lua,
-- handback.lua, rate_limited.lua): reads the run's state, fence and the caller's fields (one
-- HMGET: f[1] state, f[2] fence, then the fields in the order given), and when `fence` still
-- holds it drops the lease and frees its limit slots, waking the workers a full limit held
-- back. Returns the fields, or nil and the status to reply ('missing', 'stale').
local function take_back(prefix, leases_key, run_key, run_id, fence, channel, partition, queue,
                         now, ...)
  local f = redis.call('HMGET', run_key, 'state', 'fence', ...)
  if not f[1] then return nil, 'missing' end
  if f[2] ~= fence or f[1] ~= 'running' then return nil, 'stale' end
  redis.call('ZREM', leases_key, run_id)
  if free_limits(prefix, run_key, run_id) then wake_workers(channel, partition, queue, now) end
  return f
end

-- It will run again: the run leaves its schedule's running set (field value `sched`) without
-- promoting a buffered run (leave_running does that when a run ends).
local function step_out_of_schedule(prefix, sched, run_id)
  if sched and sched ~= '' then redis.call('SREM', prefix .. K.sched_running .. sched, run_id) end
end

-- A schedule's packed record (docs/keys.md "The schedule record") as a table: its
-- `<key><length>:<value>` entries under short keys (common/schedules.py RECORD_KEYS), every
-- value a string; nil when `raw` is not one.
local function sched_parse(raw)
  local rec, pos, n = {}, 1, #raw
  while pos <= n do
    local a, b, k, len = string.find(raw, '^([a-z]+)(%d+):', pos)
    len = tonumber(len)
    if not a or b + len > n then return nil end
    rec[k] = string.sub(raw, b + 1, b + len)
    pos = b + len + 1
  end
  return rec
end

-- The schedule `name`'s packed record, the field of the partition's T:scheds hash. Returns
-- (record table, true), (nil, false) when it has none (absent, or a schedule written before
-- the packed layout: its side hash T:sched:<name> holds every field then) or (nil,
-- 'damaged') when it cannot be read.
local function sched_load(prefix, name)
  local raw = redis.call('HGET', prefix .. K.scheds, name)
  if not raw then return nil, false end
  local rec = sched_parse(raw)
  if rec then return rec, true end
  return nil, 'damaged'
end

-- The defaults a packed record leaves out, for the values materialize.lua copies into a run
-- (common/schedules.py RECORD_DEFAULTS; fixed for good).
local SCHED_DEFAULTS = {q = 'default', ow = '', o = 'allow', lt = '0', ma = '4', bb = '1000',
  bm = '300000', to = '0', id = '1'}

-- The longest payload a packed record holds itself: a longer one is the side hash's
-- `payload` field (the record then has `pl`, its length), so listings can leave it in Redis.
local SCHED_INLINE = 256

-- Write a packed record back: its entries by key (common/schedules.py encode_record alike);
-- a number is written as an integer.
local function sched_save(prefix, name, rec)
  local keys, out = {}, {}
  for k in pairs(rec) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = rec[k]
    if type(v) == 'number' then v = int_s(v) end
    out[#out + 1] = k .. #v .. ':' .. v
  end
  redis.call('HSET', prefix .. K.scheds, name, table.concat(out))
end

-- Guardrails (pause_after_failures): a run of a schedule ended dead. Its schedule's hash lives
-- in the run's partition (scheduled run ids are '<schedule>@<ms>', common/keys.py), so the
-- consecutive-failure count (`fail_streak`) is kept in the same atomic step as the dead
-- transition: no notice to lose, no count to race. A replay (`replay_of`) and a run made by
-- `schedule trigger` ('@m' ids) are an operator's, not occurrences: they do not count. After
-- `pause_after_failures` consecutive dead occurrences the schedule is paused (as
-- schedule_pause.lua does) with a note naming the count and the last error, and an event.
-- Returns the schedule's name when this call paused it, else nil (the caller counts it in
-- duetime_schedules_auto_paused_total).
local function schedule_dead(prefix, run_key, run_id, now, err)
  local r = redis.pcall('HMGET', run_key, 'schedule', 'replay_of')
  if r.err or not r[1] or r[1] == '' or (r[2] and r[2] ~= '') then return nil end
  if string.find(run_id, '@m', 1, true) then return nil end
  local sched, name = prefix .. K.sched .. r[1], r[1]
  if wrong_type(sched, 'hash') then return nil end
  local rec, packed = sched_load(prefix, name)
  if packed == 'damaged' or (not packed and not redis.call('HGET', sched, 'version')) then
    return nil  -- no such schedule (or the evaluator's to quarantine)
  end
  local streak = redis.pcall('HINCRBY', sched, 'fail_streak', 1)
  if type(streak) ~= 'number' then  -- a count edited by hand: counting starts again
    streak = 1
    redis.call('HSET', sched, 'fail_streak', 1)
  end
  local s = redis.call('HMGET', sched, 'pause_after_failures', 'paused')
  local limit = num(packed and rec.paf or s[1])
  if not limit or limit < 1 or streak < limit or s[2] == '1' then return nil end
  local note = 'paused after ' .. int_s(streak) .. ' consecutive dead runs; last error: '
    .. string.sub(err or '', 1, 300)
  redis.call('HSET', sched, 'paused', '1', 'pause_note', note, 'paused_at', now,
    'auto_paused', int_s(streak))
  redis.call('ZADD', prefix .. K.sched_due, 'inf', name)  -- every schedule stays in its index
  emit(prefix .. K.events, run_id, 'schedule_auto_paused', name .. ': ' .. note)
  return name
end

-- A run of a schedule succeeded: its consecutive-failure count starts again (a replay's
-- outcome does not count either way). The callers read `schedule` and `replay_of` already.
local function schedule_succeeded(prefix, sched_name, replay_of)
  if not sched_name or sched_name == '' or (replay_of and replay_of ~= '') then return end
  -- one command per success (complete.lua's hot path); a schedule key of the wrong type
  -- answers an error here, ignored: the evaluator quarantines that schedule
  redis.pcall('HDEL', prefix .. K.sched .. sched_name, 'fail_streak')
end
