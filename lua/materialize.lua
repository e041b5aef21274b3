#!lua
-- materialize.lua: turn planned occurrences of one schedule into runs, exactly once.
-- Run ids are derived from (schedule, occurrence), so an occurrence that already has a run
-- is never created twice, whoever evaluates it. With an expected version and cursor (the
-- evaluator), the call is a compare-and-set: a changed definition, a paused schedule or a
-- cursor another scheduler already moved makes it a no-op. Without them (backfill,
-- trigger-now) only the runs are created, without a starting deadline, and the cursor is
-- left alone. `last_ms` keeps the newest occurrence that has a run. Guardrails: an
-- occurrence after `end_ms`, or past `max_runs` runs, gets no run and ends the schedule.
-- The namespace's payload cap (T:caps 'max_payload', as enqueue.lua checks it) holds for the
-- runs of schedules too: a schedule whose payload is longer creates no run and the call is
-- refused before anything is written, with a PAYLOAD_TOO_LARGE error naming the schedule, its
-- size and the cap (the evaluator quarantines the schedule with it; backfill and trigger-now
-- raise it).
-- Tested by: tests/integration/test_schedules.py, tests/integration/test_cluster.py,
--   tests/integration/test_calendars.py, tests/integration/test_guardrails.py,
--   tests/integration/test_payload_cap.py
-- KEYS[1] sched_due zset  T:sched_due      KEYS[2] due zset  T:due:<queue>
-- KEYS[3] deadlines zset  T:deadlines      KEYS[4] events
-- KEYS[5] done zset  T:done (the skipped runs of occurrences a calendar excluded)
-- ARGV[1] partition prefix 'ns:{tag}:' (the schedule's hash and the runs' hashes are built
--         from it; same hash tag)
-- ARGV[2] schedule name    ARGV[3] expected version ('' = no compare-and-set)
-- ARGV[4] expected cursor ms    ARGV[5] new cursor ms ('' = no more occurrences)
-- ARGV[6] occurrences skipped by the catch-up policy (added to skipped_count)
-- ARGV[7] wake channel     ARGV[8] partition index     ARGV[9] queue
-- ARGV[10] scheduler wake channel (a starting deadline earlier than the deadlines' head is told
--         to the reapers)
-- ARGV[11] n, the number of runs; ARGV[12..11+5n] per run, 5 values: run id, occurrence ms,
--         due ms, coalesced count, first ms
-- then n values: each run's data interval start ms ('' = no interval; '0' = none before;
--         its end is its occurrence)
-- then the calendar applied ('' = none; 'NAME vN' is written to the schedule's cal_v), and
-- pairs (run id, occurrence ms) of occurrences the calendar excluded: each is recorded once
-- as a `skipped` run with the reason 'excluded by calendar NAME vN' (materialize/calendar.lua)
-- @include materialize/calendar.lua
-- The schedule's record is read in either layout (docs/keys.md "The schedule record"): the
-- packed one (T:scheds) is written back in one HSET; one written before it keeps its fields.
-- Returns (status) {status, created}: status 'ok', 'conflict', 'paused' or 'missing'.
local sched_due_key, due_key, deadlines_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, name, expected = ARGV[1], ARGV[2], ARGV[3]
local sched_key = prefix .. K.sched .. name
-- checked before the first write: a key of the wrong type refuses the call (the evaluator
-- quarantines the schedule with this reason), never a run left in no index
local bad = damaged_index({sched_due_key, 'zset', due_key, 'zset', deadlines_key, 'zset',
  events_key, 'stream', sched_key, 'hash', KEYS[5], 'zset', prefix .. K.caps, 'hash',
  prefix .. K.scheds, 'hash'})
if bad then return bad end

-- the schedule's record: packed (T:scheds) or, written before that layout, its side hash
local rec, packed = sched_load(prefix, name)
if packed == 'damaged' then
  return redis.error_reply('DAMAGED schedule ' .. name .. ': its packed record in ' .. prefix
    .. K.scheds .. ' cannot be decoded; register it again')
end
local function val(k)  -- a packed value, its default when left out
  local x = rec[k]
  if x == nil then x = SCHED_DEFAULTS[k] end
  return x
end
local s, g, last
if packed then
  local side = redis.call('HMGET', sched_key, 'paused', 'payload')
  s = {val('v'), val('n'), side[1], val('t'), val('q'), rec.p or (rec.pl and side[2]) or nil,
    val('ma'), val('bb'), val('bm'), val('to'), val('id'), val('ow'), val('o'), val('lt'),
    val('tn')}
  g = {val('en'), val('mr'), val('r')}
  last = num(rec.l) or 0
else
  s = redis.call('HMGET', sched_key, 'version', 'next_ms', 'paused', 'task', 'queue',
    'payload', 'max_attempts', 'backoff_base', 'backoff_max', 'timeout', 'idempotent', 'owner',
    'overlap', 'lateness_ms', 'tenant')
end
if not s[1] then return {'missing', 0} end
if expected ~= '' then
  if s[1] ~= expected or s[2] ~= ARGV[4] then return {'conflict', 0} end
  if s[3] == '1' then return {'paused', 0} end
end

local cap = #ARGV >= 11 and tonumber(redis.call('HGET', prefix .. K.caps, 'max_payload'))
if cap and s[6] and #s[6] > cap then
  return redis.error_reply('PAYLOAD_TOO_LARGE schedule ' .. name .. ': payload of ' .. #s[6]
    .. ' bytes is over the namespace cap of ' .. int_s(cap) .. ' bytes (max_payload in '
    .. '<ns>:meta); no run was created: register it again with a smaller payload, or raise '
    .. 'the cap')
end

local now = now_ms()
local lateness = num(s[14]) or 0  -- 1e400 or nan (edited by hand) is no deadline
local created = 0
if not packed then
  last = num(redis.call('HGET', sched_key, 'last_ms')) or 0
  g = redis.call('HMGET', sched_key, 'end_ms', 'max_runs', 'runs_made')
end
local partition, queue = ARGV[8], ARGV[9]
local n_runs = tonumber(ARGV[11]) or 0
local extras = 12 + 5 * n_runs  -- the interval starts, then the calendar's part
-- guardrails: `end_ms` bounds the occurrences; `max_runs` stops the schedule once the
-- evaluator has made that many runs (`runs_made`, counted here, where each run is created
-- once). Absent or '' (cleared by an upsert): no bound. Runs made by backfill or trigger-now
-- (no expected version) are not counted.
local end_ms, max_runs, runs_made = num(g[1]), num(g[2]), num(g[3]) or 0
local made_before, bounded = runs_made, false
local function beyond_bounds(occ)
  if end_ms and occ > end_ms then bounded = 'end'
  elseif expected ~= '' and max_runs and runs_made >= max_runs then bounded = 'max_runs'
  else return false end
  return true
end
for i = 12, 11 + 5 * n_runs, 5 do
  local run_id, occ, due = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local run_key = prefix .. K.run .. run_id
  local beyond = beyond_bounds(occ)  -- guardrails: no run, and not counted as the newest
  if not beyond and redis.call('EXISTS', run_key) == 0 then
    local fields = {'id', run_id, 'state', 'scheduled', 'created', now, 'due', due,
      'occurrence', occ, 'attempt', 0, 'fence', 0, 'schedule', name,
      'task', s[4], 'queue', s[5], 'payload', s[6], 'max_attempts', s[7],
      'backoff_base', s[8], 'backoff_max', s[9], 'timeout', s[10], 'idempotent', s[11],
      'owner', s[12], 'overlap', s[13]}
    if s[15] and s[15] ~= '' then  -- the schedule's tenant, for limits and fair share
      fields[#fields + 1] = 'tenant'; fields[#fields + 1] = s[15]
    end
    if tonumber(ARGV[i + 3]) > 1 then
      fields[#fields + 1] = 'coalesced'; fields[#fields + 1] = ARGV[i + 3]
      fields[#fields + 1] = 'coalesced_from'; fields[#fields + 1] = ARGV[i + 4]
    end
    add_interval(fields, ARGV[extras + (i - 12) / 5], occ)
    if lateness > 0 and expected ~= '' then
      fields[#fields + 1] = 'deadline'; fields[#fields + 1] = due + lateness
      tell_schedulers(ARGV[10], 'd', partition, deadlines_key, due + lateness)
      redis.call('ZADD', deadlines_key, due + lateness, run_id)
    end
    redis.call('HSET', run_key, unpack(fields))
    add_due(due_key, due, run_id, ARGV[7], partition, queue)
    emit(events_key, run_id, 'scheduled', name)
    created = created + 1
    if expected ~= '' then runs_made = runs_made + 1 end
  end
  if occ > last and not beyond then last = occ end
end
local cal = ARGV[extras + n_runs]
if cal and cal ~= '' then
  record_excluded(prefix, name, sched_key, cal, extras + n_runs + 1, now, KEYS[5], events_key)
end
local cursor = ARGV[5]
if expected ~= '' and cursor ~= '' then  -- guardrails: a bound reached ends the schedule
  if end_ms and (num(cursor) or 0) > end_ms then bounded = 'end' end
  if max_runs and runs_made >= max_runs then bounded = 'max_runs' end
  if bounded then cursor = '' end
end
if expected ~= '' then
  local skipped = tonumber(ARGV[6]) or 0
  if skipped > 0 then redis.call('HINCRBY', sched_key, 'skipped_count', skipped) end
  -- every schedule stays in its due index: one that has no next occurrence at +inf
  redis.call('ZADD', sched_due_key, cursor == '' and 'inf' or tonumber(cursor), name)
end

if packed then  -- the state goes back into the record, one write
  if last > 0 then rec.l = last end
  if runs_made ~= made_before then rec.r = runs_made end
  if created > 0 then rec.m = (tonumber(rec.m) or 0) + created end
  if expected ~= '' then
    if cal and cal ~= '' then rec.cv = cal end
    if bounded then rec.ed = bounded end
    rec.n = cursor ~= '' and cursor or nil  -- '' (no more occurrences) removes it
  end
  sched_save(prefix, name, rec)
  return {'ok', created}
end
-- a record written before the packed layout: its fields, as that version wrote them
if last > 0 then redis.call('HSET', sched_key, 'last_ms', last) end
if expected ~= '' and cal and cal ~= '' then redis.call('HSET', sched_key, 'cal_v', cal) end
if runs_made ~= made_before then redis.call('HSET', sched_key, 'runs_made', runs_made) end
if expected ~= '' then
  if bounded then redis.call('HSET', sched_key, 'ended', bounded) end
  if cursor == '' then
    redis.call('HDEL', sched_key, 'next_ms')
  else
    redis.call('HSET', sched_key, 'next_ms', cursor)
  end
  redis.call('HSET', sched_key, 'evaluated', now)
end
if created > 0 then redis.call('HINCRBY', sched_key, 'materialized_count', created) end
return {'ok', created}
