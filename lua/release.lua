-- release.lua: give a running run back on graceful shutdown without burning an attempt.
-- The run returns to its due set at its original due time (so it is picked first). A task
-- declared non-idempotent may have had partial effects: it goes to `uncertain` instead.
-- KEYS[1] run hash     KEYS[2] lease string   KEYS[3] leases zset   KEYS[4] attempts list
-- KEYS[5] due zset (the run's queue)          KEYS[6] uncertain zset   KEYS[7] events
-- ARGV[1] run id   ARGV[2] fence   ARGV[3] partition prefix   ARGV[4] wake channel
-- ARGV[5] partition index          ARGV[6] queue
-- Returns 'released', 'uncertain', 'stale' or 'missing'.
local run_key, lease_key, leases_key, attempts_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local due_key, uncertain_key, events_key = KEYS[5], KEYS[6], KEYS[7]
local run_id, fence, prefix = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()

local f = redis.call('HMGET', run_key, 'state', 'fence', 'due', 'idempotent', 'schedule',
  'attempt', 'worker', 'started')
if not f[1] then return 'missing' end
if f[2] ~= fence or f[1] ~= 'running' then return 'stale' end

redis.call('DEL', lease_key)
redis.call('ZREM', leases_key, run_id)
if f[4] == '0' then
  push_attempt(attempts_key, f[6], fence, f[7], f[8], 'unknown', now,
    'interrupted by worker shutdown')
  redis.call('HSET', run_key, 'state', 'uncertain', 'finished', now,
    'reason', 'interrupted by worker shutdown; task is not idempotent')
  redis.call('ZADD', uncertain_key, now, run_id)
  leave_running(prefix, run_key, run_id, now, ARGV[4], ARGV[5])
  emit(events_key, run_id, 'uncertain', 'shutdown')
  return 'uncertain'
end
-- it will run again: it leaves the schedule's running set without promoting a buffered run
if f[5] and f[5] ~= '' then redis.call('SREM', prefix .. 'sched_running:' .. f[5], run_id) end
push_attempt(attempts_key, f[6], fence, f[7], f[8], 'released', now, nil)
redis.call('HINCRBY', run_key, 'attempt', -1)
redis.call('HSET', run_key, 'state', 'scheduled')
add_due(due_key, tonumber(f[3]), run_id, ARGV[4], ARGV[5] .. '|' .. ARGV[6])
emit(events_key, run_id, 'released', '')
return 'released'
