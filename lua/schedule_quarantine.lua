#!lua
-- schedule_quarantine.lua: set aside a schedule whose stored record cannot be evaluated (a
-- field damaged by hand, a trigger this version cannot read), so the others keep firing.
-- It leaves the evaluator's due set and enters the partition's quarantine index, with the
-- reason on its hash; registering the schedule again (schedule_upsert.lua) brings it back.
-- Compare-and-set on the version the evaluator read: a schedule changed meanwhile is left
-- alone (the change may be the fix).
-- The reason goes to the side hash T:sched:<name> in either layout.
-- Tested by: tests/integration/test_schedules.py, tests/property/test_damaged_records.py
-- KEYS[1] sched_due zset   KEYS[2] quarantine zset   KEYS[3] events
-- ARGV[1] partition prefix 'ns:{tag}:' (the schedule's hash is built from it; same hash tag)
-- ARGV[2] name   ARGV[3] version read ('' = any)   ARGV[4] reason
-- Returns (status) 'quarantined', 'changed' or 'missing'.
local sched_due_key, quarantine_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local prefix, name, version, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local sched_key = prefix .. K.sched .. name
local bad = damaged_index({sched_due_key, 'zset', quarantine_key, 'zset', events_key, 'stream',
  prefix .. K.scheds, 'hash'})
if bad then return bad end
local why = wrong_type(sched_key, 'hash')
if why then
  -- the key itself is damaged: it is set aside as found, the reason in the events
  local now = now_ms()
  redis.call('ZREM', sched_due_key, name)
  redis.call('ZADD', quarantine_key, now, name)
  emit(events_key, '', 'schedule_quarantined', name .. ': ' .. why)
  return 'quarantined'
end
-- the version, from either layout (docs/keys.md); a packed record that cannot be decoded
-- is set aside whatever version was read
local rec, packed = sched_load(prefix, name)
local cur
if packed == true then cur = int_s(rec.v)
elseif packed == 'damaged' then cur = version
else cur = redis.call('HGET', sched_key, 'version') end
if not cur then
  redis.call('ZREM', sched_due_key, name)
  return 'missing'
end
if version ~= '' and cur ~= version then return 'changed' end
local now = now_ms()
redis.call('HSET', sched_key, 'quarantined', reason, 'quarantined_at', now)
redis.call('ZADD', sched_due_key, 'inf', name)  -- listed with every schedule, never due
redis.call('ZADD', quarantine_key, now, name)
emit(events_key, '', 'schedule_quarantined', name .. ': ' .. reason)
return 'quarantined'
