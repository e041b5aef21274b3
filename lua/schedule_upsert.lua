#!lua
-- schedule_upsert.lua: create or change a schedule's definition (compare-and-set on version).
-- The caller sends only a changed definition (it compares the stored one). A changed one
-- bumps the version (so an evaluation planned on the old one is refused) and takes the new
-- cursor computed by the caller from the newest occurrence that already has a run, so none
-- is lost or doubled. A quarantined schedule (see schedule_quarantine.lua) registered again
-- is taken back, even with the same definition: its evaluation state is reset from the
-- caller's cursor.
-- The record is written packed (docs/keys.md "The schedule record"): one field of T:scheds.
-- A schedule written before that layout (its side hash T:sched:<name> holds every field,
-- `version` among them) is converted here: its cursor state moves into the packed record
-- and its definition fields leave the side hash (which keeps paused, buffered, fail_streak,
-- the counters; Redis removes it when nothing is left). With ARGV[9] '1' the caller found
-- the definition unchanged: the conversion keeps the version and `updated`.
-- Tested by: tests/integration/test_schedules.py, tests/integration/test_cli_schedules.py,
--   tests/integration/test_schedule_upgrade.py
-- KEYS[1] sched_due zset   KEYS[2] schedules index zset (the old layout's; left as it empties)
-- KEYS[3] quarantine zset
-- ARGV[1] partition prefix 'ns:{tag}:' (the schedule's keys are built from it; same hash tag)
-- ARGV[2] name   ARGV[3] the definition's entries (common/schedules.py pack_definition)
-- ARGV[4] expected version ('0' = must not exist)
-- ARGV[5] new cursor ms ('' = the trigger has no more occurrences)
-- ARGV[6] paused when created ('0'/'1')
-- ARGV[7] scheduler wake channel   ARGV[8] partition index (a cursor earlier than the due set's
--         head is told to the evaluators, which sleep until the earliest)
-- ARGV[9] '1': the definition is the stored one (a conversion), '0': changed or new
-- Returns (status) {status, version}: 'created', 'updated', 'unchanged' or 'conflict'.
local sched_due_key, index_key, quarantine_key = KEYS[1], KEYS[2], KEYS[3]
local prefix, name, packed_def, expected, cursor = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local sched_key = prefix .. K.sched .. name
local bad = damaged_index({sched_due_key, 'zset', index_key, 'zset', quarantine_key, 'zset',
  prefix .. K.scheds, 'hash'})
if bad then return bad end
local now = now_ms()
-- registering a schedule whose key holds another type (damaged by hand; the evaluator
-- quarantined it as found) replaces that key: the definition given is the schedule
if wrong_type(sched_key, 'hash') then
  redis.call('DEL', sched_key)
  redis.call('ZREM', quarantine_key, name)
end

-- the current state, from either layout; a packed record that cannot be decoded is replaced
local rec, packed = sched_load(prefix, name)
local state = {}  -- what the new record keeps of the old one
local version
if packed == true then
  version = tonumber(rec.v) or 0
  state = {c = rec.c, u = rec.u, l = rec.l, m = rec.m, r = rec.r, cv = rec.cv, ed = rec.ed}
else
  local o = redis.call('HMGET', sched_key, 'version', 'created', 'updated', 'last_ms',
    'materialized_count', 'runs_made', 'cal_v', 'ended')
  version = tonumber(o[1]) or 0
  if version > 0 then  -- the old layout: converted below
    state = {c = o[2], u = o[3], l = o[4], m = o[5], r = o[6], cv = o[7], ed = o[8]}
  end
end
if tostring(version) ~= expected then return {'conflict', version} end
local side = redis.call('HMGET', sched_key, 'paused', 'quarantined')
if side[2] then
  redis.call('HDEL', sched_key, 'quarantined', 'quarantined_at')
  redis.call('ZREM', quarantine_key, name)
end
if packed ~= true and version > 0 then
  -- the old layout's definition and cursor fields leave the side hash
  redis.call('HDEL', sched_key, 'name', 't.kind', 't.expr', 't.tz', 't.dst_gap', 't.dst_fold',
    't.seed', 't.interval_us', 't.anchor', 't.instant', 'task', 'queue', 'payload', 'catchup',
    'max_catchup', 'lateness_ms', 'overlap', 'jitter_ms', 'owner', 'max_attempts',
    'backoff_base', 'backoff_max', 'timeout', 'idempotent', 'miss_tolerance_ms', 'stagger_ms',
    'tenant', 'calendar', 'on_excluded', 'pause_after_failures', 'start_ms', 'end_ms',
    'max_runs', 'version', 'def_hash', 'next_ms', 'last_ms', 'created', 'updated', 'evaluated',
    'materialized_count', 'runs_made', 'cal_v', 'ended')
  redis.call('ZREM', index_key, name)
end

local new = sched_parse(packed_def)
local keep = ARGV[9] == '1' and version > 0 and not side[2]
-- a changed definition clears a bound reached under the old one (`ended`)
if not keep then state.ed = nil end
for k, v in pairs(state) do
  if v and v ~= '' then new[k] = v end
end
new.v = keep and version or version + 1
if not keep then new.u = now end
new.c = new.c or now
local paused = side[1]
if version == 0 then
  paused = ARGV[6]
  if paused == '1' then redis.call('HSET', sched_key, 'paused', '1') end
end
new.n = cursor ~= '' and cursor or nil  -- nil: no more occurrences
-- a payload longer than SCHED_INLINE bytes waits in the side hash (listings leave it in
-- Redis); `pl` says so, with its length
if new.p and #new.p > SCHED_INLINE then
  redis.call('HSET', sched_key, 'payload', new.p)
  new.pl, new.p = #new.p, nil
elseif packed == true and rec.pl then
  redis.call('HDEL', sched_key, 'payload')
end
sched_save(prefix, name, new)
-- every schedule is in its due index: paused or without a next occurrence at +inf
if cursor == '' or paused == '1' then
  redis.call('ZADD', sched_due_key, 'inf', name)
else
  tell_schedulers(ARGV[7], 's', ARGV[8], sched_due_key, cursor)
  redis.call('ZADD', sched_due_key, tonumber(cursor), name)
end
if version == 0 then return {'created', 1} end
if keep then return {'unchanged', version} end
return {'updated', version + 1}
