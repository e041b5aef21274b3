#!lua
-- fail.lua: end an attempt that did not succeed: retry with backoff (or an explicit delay),
-- dead-letter, or -- when the worker stopped it on a cancel request -- cancel the run.
-- Accepted only from the current fence holder while the run is running; a stale holder's
-- failure is written into its own attempt record and changes nothing else. The same report
-- sent twice (a retried call whose reply was lost) gets the first answer again.
-- Tested by: tests/integration/test_scripts.py, tests/integration/test_worker_inprocess.py,
--   tests/integration/test_enqueue_retry.py, tests/integration/test_guardrails.py
-- KEYS[1] leases zset   KEYS[2] retry zset (the run's queue)   KEYS[3] dead zset
-- KEYS[4] done zset     KEYS[5] events
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash and attempts, and its schedule's keys,
--         are built from it; same hash tag)
-- ARGV[2] run id   ARGV[3] fence   ARGV[4] error text
-- ARGV[5] mode: 'error' (backoff) | 'retry' (explicit delay ARGV[6]) | 'fatal' (no retry)
--         | 'cancel' (stopped on a cancel request)
-- ARGV[6] delay ms (mode 'retry')   ARGV[7] jitter in [0,1)
-- ARGV[8] wake channel   ARGV[9] partition index   ARGV[10] queue
-- Returns (status) {state, retry_at_ms, auto_paused}: state 'retrying', 'dead', 'cancelled',
-- 'stale' or 'missing'; auto_paused: the schedule this dead run paused (pause_after_failures,
-- see schedule_dead in _lib.lua) or '' (absent before the dead transitions).
local leases_key, retry_key, dead_key, done_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, run_id, fence, err, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local channel, partition, queue = ARGV[8], ARGV[9], ARGV[10]
local run_key, attempts_key = prefix .. K.run .. run_id, prefix .. K.attempts .. run_id
local now = now_ms()

local bad = damaged_index({leases_key, 'zset', dead_key, 'zset', done_key, 'zset',
  events_key, 'stream'})
if bad then return bad end
-- a record key of the wrong type is no run this worker holds: the reaper dead-letters it
local f = run_fields(run_key, 'state', 'fence', 'attempt', 'worker', 'started', 'retry_at')
if not f or not f[1] then return {'missing', 0, ''} end
if f[2] == fence and f[1] ~= 'running' then
  -- this attempt already ended: if it ended by this very report, answer as the first time
  local raw = redis.call('LINDEX', attempts_key, (tonumber(fence) or 0) - 1)
  local ok, a = pcall(cjson.decode, raw or '')
  if ok and type(a) == 'table' and (a.outcome == 'failed' or a.outcome == 'cancelled')
      and not a.late then
    return {f[1], tonumber(f[6]) or 0, ''}
  end
end
if f[2] ~= fence or f[1] ~= 'running' then
  set_attempt(attempts_key, fence, {late = true, late_outcome = 'failed', late_error = err,
                                    late_at = now}, run_key)
  emit(events_key, run_id, 'late_result_rejected', 'failed:' .. fence)
  return {'stale', 0, ''}
end

-- the attempt entry is the first write: an attempts key of the wrong type refuses it alone
local damaged = push_attempt(attempts_key, f[3], fence, f[4], f[5],
  mode == 'cancel' and 'cancelled' or 'failed', now, err)
redis.call('ZREM', leases_key, run_id)
leave_running(prefix, run_key, run_id, now, channel, partition)
if free_limits(prefix, run_key, run_id) then
  wake_workers(channel, partition, queue, now)
end
if damaged then
  redis.call('HSET', run_key, 'error', err)
  dead_letter(prefix, run_key, dead_key, events_key, run_id, now, err .. '; ' .. damaged)
  return {'dead', 0, schedule_dead(prefix, run_key, run_id, now, err) or ''}
end
if mode == 'cancel' then
  redis.call('HSET', run_key, 'state', 'cancelled', 'finished', now, 'reason', err)
  redis.call('ZADD', done_key, now, run_id)
  emit(events_key, run_id, 'cancelled', err)
  wake_waiters(prefix, run_key, run_id, 'cancelled')
  return {'cancelled', 0, ''}
end
redis.call('HSET', run_key, 'error', err)
local delay = nil
if mode == 'retry' then delay = tonumber(ARGV[6]) end
local state, at = retry_or_dead(prefix, run_key, retry_key, dead_key, run_id, now, mode == 'fatal',
  delay, ARGV[7], err, channel, partition, queue)
emit(events_key, run_id, state, err)
local paused = ''
if state == 'dead' then paused = schedule_dead(prefix, run_key, run_id, now, err) or '' end
return {state, at, paused}
