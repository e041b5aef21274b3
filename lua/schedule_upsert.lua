#!lua
-- schedule_upsert.lua: create or change a schedule's definition (compare-and-set on version).
-- The same definition again changes nothing. A changed one bumps the version (so an
-- evaluation planned on the old one is refused) and takes the new cursor computed by the
-- caller from the newest occurrence that already has a run, so none is lost or doubled.
-- A quarantined schedule (see schedule_quarantine.lua) registered again is taken back, even
-- with the same definition: its evaluation state is reset from the caller's cursor.
-- Tested by: tests/integration/test_schedules.py, tests/integration/test_cli_schedules.py
-- KEYS[1] sched_due zset   KEYS[2] schedules index zset   KEYS[3] quarantine zset
-- ARGV[1] partition prefix 'ns:{tag}:' (the schedule's hash is built from it; same hash tag)
-- ARGV[2] name   ARGV[3] definition hash   ARGV[4] expected version ('0' = must not exist)
-- ARGV[5] new cursor ms ('' = the trigger has no more occurrences)
-- ARGV[6] paused when created ('0'/'1')
-- ARGV[7] scheduler wake channel   ARGV[8] partition index (a cursor earlier than the due set's
--         head is told to the evaluators, which sleep until the earliest)
-- ARGV[9..] definition field, value pairs
-- Returns (status) {status, version}: 'created', 'updated', 'unchanged' or 'conflict'.
local sched_due_key, index_key, quarantine_key = KEYS[1], KEYS[2], KEYS[3]
local prefix, name, def_hash, expected, cursor = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local sched_key = prefix .. K.sched .. name
local bad = damaged_index({sched_due_key, 'zset', index_key, 'zset', quarantine_key, 'zset'})
if bad then return bad end
local now = now_ms()
-- registering a schedule whose key holds another type (damaged by hand; the evaluator
-- quarantined it as found) replaces that key: the definition given is the schedule
if wrong_type(sched_key, 'hash') then
  redis.call('DEL', sched_key)
  redis.call('ZREM', quarantine_key, name)
end

local cur = redis.call('HMGET', sched_key, 'version', 'def_hash', 'paused', 'quarantined')
local version = tonumber(cur[1]) or 0
if tostring(version) ~= expected then return {'conflict', version} end
if version > 0 and cur[2] == def_hash and not cur[4] then return {'unchanged', version} end
if cur[4] then
  redis.call('HDEL', sched_key, 'quarantined', 'quarantined_at')
  redis.call('ZREM', quarantine_key, name)
end

local fields = {}
for i = 9, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', sched_key, unpack(fields))
redis.call('HSET', sched_key, 'version', version + 1, 'def_hash', def_hash, 'updated', now)
local paused = cur[3]
if version == 0 then
  paused = ARGV[6]
  redis.call('HSET', sched_key, 'created', now, 'paused', paused)
  redis.call('ZADD', index_key, now, name)
end
if cursor == '' then
  redis.call('HDEL', sched_key, 'next_ms')
  redis.call('ZREM', sched_due_key, name)
else
  redis.call('HSET', sched_key, 'next_ms', cursor)
  if paused == '1' then
    redis.call('ZREM', sched_due_key, name)
  else
    tell_schedulers(ARGV[7], 's', ARGV[8], sched_due_key, cursor)
    redis.call('ZADD', sched_due_key, tonumber(cursor), name)
  end
end
if version == 0 then return {'created', 1} end
return {'updated', version + 1}
