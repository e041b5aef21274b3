-- claim/admission.lua: whether a candidate the limits let through starts now. A pending cancel
-- request (its worker died before honouring it) cancels it; a starting deadline passed misses
-- it; a schedule's overlap policy may skip it or buffer it. A record in no known state, or
-- marked running without a lease, is dead-lettered with the reason (never dropped); an entry
-- whose record is gone or in another state is stale, and only leaves the index.
-- Tested by: tests/integration/test_scripts.py, tests/property/test_damaged_records.py,
--   tests/integration/test_schedules.py

-- The overlap policy of a scheduled run; returns true when the run may start now.
local function overlap_allows(c, id, sched, overlap)
  if overlap == 'allow' or overlap == '' then return true end  -- nothing to track
  local prefix, now = c.prefix, c.now
  local running = prefix .. K.sched_running .. sched
  -- a schedule key of the wrong type is the evaluator's to quarantine: its run is not held
  if wrong_type(running, 'set') or wrong_type(prefix .. K.sched .. sched, 'hash') then
    return true
  end
  if redis.call('SCARD', running) == 0 then
    redis.call('SADD', running, id)
    return true
  end
  if overlap == 'skip' then
    finish_unstarted(prefix, id, 'skipped', 'overlap: previous run still running', now,
      c.done_key, c.deadlines_key, c.events_key)
    c.skipped = c.skipped + 1
    return false
  end
  -- buffer_one / cancel_other: wait (out of the due set) until the running one has left
  local sched_key = prefix .. K.sched .. sched
  local buffered = redis.call('HGET', sched_key, 'buffered')
  if buffered and buffered ~= '' and buffered ~= id then
    finish_unstarted(prefix, id, 'skipped', 'overlap: a run is already buffered', now,
      c.done_key, c.deadlines_key, c.events_key)
    c.skipped = c.skipped + 1
    return false
  end
  redis.call('HSET', sched_key, 'buffered', id)
  emit(c.events_key, id, 'buffered', overlap)
  if overlap == 'cancel_other' then
    for _, other in ipairs(redis.call('SMEMBERS', running)) do
      redis.call('HSET', prefix .. K.run .. other, 'cancel_requested', now)
      emit(c.events_key, other, 'cancel_requested', 'overlap: cancel_other by ' .. id)
    end
  end
  return false
end

-- A record that cannot be claimed: dead-lettered when damaged, else a stale entry (left to
-- the index writes).
local function not_waiting(c, id, run_key, state)
  local why
  if state == 'running' and not redis.call('ZSCORE', c.leases_key, id) then
    -- waiting in a due set, yet marked running with no lease: nothing would ever finish or
    -- recover it (a state written by hand); claimed running runs always hold a lease
    why = 'run record damaged: state running, but it holds no lease'
  elseif not STATES[state] and redis.call('EXISTS', run_key) == 1 then
    why = 'run record damaged: state ' .. tostring(state or '(missing)') .. ' is not a run state'
  end
  -- any other state: a stale index entry (cancelled, deleted); a damaged rare key stops the
  -- claim before the dead letter is written (rare_keys_damaged sets c.damaged)
  if why and not rare_keys_damaged(c) then
    dead_letter(c.prefix, run_key, c.dead_key, c.events_key, id, c.now, why)
  end
end

-- Reads candidate `id` (one HGETALL, fields below) and decides: returns its fields, whether it
-- starts now, and then the starting deadline entry to clear (if any). A candidate that does not
-- start was finished (cancelled, missed, skipped), buffered, dead-lettered, or is stale.
-- Fields: 1 state, 2 deadline, 3 schedule, 4 overlap, 5 fence, 6 attempt, 7 task, 8 payload,
-- 9 due, 10 timeout, 11 idempotent, 12 key, 13 cancel_requested, 14 limited_by,
-- 15 interval_start, 16 interval_end (a schedule's run: its data interval), 17 tenant,
-- 18 headers (the last two only go to the worker: its middleware's run context), 19 batch (only
-- whether it has one: a success then settles its batch, see claim/lease.lua `bare`).
-- The record is read whole (HGETALL) and picked by name: a waiting run's hash is small, and
-- most of these 19 fields are absent on a plain run; HMGET scanned the whole listpack for
-- each absent one, which cost more than one pass over it (bench/RESULTS.md: claim −4 % of
-- Redis's instructions). A long run's checkpoint (at most 64 KiB) is copied once per claim.
local ADMIT_AT = {state = 1, deadline = 2, schedule = 3, overlap = 4, fence = 5, attempt = 6,
  task = 7, payload = 8, due = 9, timeout = 10, idempotent = 11, key = 12,
  cancel_requested = 13, limited_by = 14, interval_start = 15, interval_end = 16, tenant = 17,
  headers = 18, batch = 19}

-- The fields a plain run has (state, task, payload, due): one with no other field of the
-- list above, waiting for its first claim, starts at once, with nothing else to decide.
local PLAIN_AT = {[1] = true, [7] = true, [8] = true, [9] = true}

-- `f` is made with its 19 slots (false: absent), so picking the fields fills an array in place
-- instead of growing a table field by field (each growth a rehash); slot 20 says whether a
-- field beyond the plain ones was picked. A fourth value, true, says the run is plain (most
-- runs): the lease step then skips what only the others need (claim/lease.lua).
local function admit(c, id, run_key)
  local f, unreadable = {false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false, false, false}, nil
  local all = redis.pcall('HGETALL', run_key)
  if all.err then
    unreadable = 'key ' .. run_key .. ' is not a hash (' .. all.err .. ')'
  else
    for j = 1, #all, 2 do
      local at = ADMIT_AT[all[j]]
      if at then
        f[at] = all[j + 1]
        if not PLAIN_AT[at] then f[20] = true end
      end
    end
    if f[1] == 'scheduled' and not f[20] then return f, true, nil, true end
  end
  if unreadable then
    -- its record key is of the wrong type: dead-lettered as found (it leaves the due set)
    if rare_keys_damaged(c) then return f, false end
    dead_unreadable(c.dead_key, c.events_key, id, c.now, unreadable)
    return {}, false
  end
  local state = f[1]
  if state ~= 'scheduled' and state ~= 'retrying' then
    not_waiting(c, id, run_key, state)
    return f, false
  end
  local deadline, sched = tonumber(f[2]), f[3]
  if (tonumber(f[5]) or 0) > 0 then deadline = nil end  -- a retry is not a late start
  -- a cancel, a starting deadline or an overlap policy may write the rare paths' keys
  if (f[13] or deadline or sched) and rare_keys_damaged(c) then return f, false end
  if f[13] then
    finish_unstarted(c.prefix, id, 'cancelled', 'cancel requested before it could run again',
      c.now, c.done_key, c.deadlines_key, c.events_key)
  elseif deadline and deadline > 0 and c.now > deadline then
    finish_unstarted(c.prefix, id, 'missed', 'not started before its starting deadline', c.now,
      c.done_key, c.deadlines_key, c.events_key)
    c.missed = c.missed + 1
  elseif not sched or sched == '' or overlap_allows(c, id, sched, f[4] or '') then
    return f, true, deadline
  end
  return f, false
end
