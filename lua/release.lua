#!lua
-- release.lua: give a running run back on graceful shutdown without burning an attempt.
-- The run returns to its due set at its original due time (so it is picked first). A task
-- declared non-idempotent may have had partial effects: it goes to `uncertain` instead.
-- Tested by: tests/integration/test_workers.py
-- KEYS[1] leases zset   KEYS[2] due zset (the run's queue)   KEYS[3] uncertain zset
-- KEYS[4] events
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash and attempts, and its schedule's keys,
--         are built from it; same hash tag)
-- ARGV[2] run id   ARGV[3] fence   ARGV[4] wake channel   ARGV[5] partition index
-- ARGV[6] queue
-- Returns (status) 'released', 'uncertain', 'stale' or 'missing'.
local leases_key, due_key, uncertain_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, run_id, fence = ARGV[1], ARGV[2], ARGV[3]
local run_key, attempts_key = prefix .. K.run .. run_id, prefix .. K.attempts .. run_id
local now = now_ms()

local f, status = take_back(prefix, leases_key, run_key, run_id, fence, ARGV[4], ARGV[5],
  ARGV[6], now, 'due', 'idempotent', 'schedule', 'attempt', 'worker', 'started')
if not f then return status end
if f[4] == '0' then
  push_attempt(attempts_key, f[6], fence, f[7], f[8], 'unknown', now,
    'interrupted by worker shutdown')
  redis.call('HSET', run_key, 'state', 'uncertain', 'finished', now,
    'reason', 'interrupted by worker shutdown; task is not idempotent')
  redis.call('ZADD', uncertain_key, now, run_id)
  leave_running(prefix, run_key, run_id, now, ARGV[4], ARGV[5])
  emit(events_key, run_id, 'uncertain', 'shutdown')
  wake_waiters(prefix, run_key, run_id, 'uncertain')
  return 'uncertain'
end
step_out_of_schedule(prefix, f[5], run_id)
push_attempt(attempts_key, f[6], fence, f[7], f[8], 'released', now, nil)
redis.call('HSET', run_key, 'state', 'scheduled',
  'attempt', int_s(math.max((tonumber(f[6]) or 1) - 1, 0)))
add_due(due_key, tonumber(f[3]) or now, run_id, ARGV[4], ARGV[5], ARGV[6])
emit(events_key, run_id, 'released', '')
return 'released'
