-- complete.lua: record a successful attempt.
-- Accepted from the current fence holder. A late success from a holder whose lease expired
-- still finishes the run if nobody claimed it since (same fence; state retrying/uncertain),
-- instead of letting a retry run the work again. Anything else is recorded as a late result.
-- KEYS[1] run hash       KEYS[2] lease string  KEYS[3] leases zset   KEYS[4] attempts list
-- KEYS[5] done zset      KEYS[6] retry zset (the run's queue)        KEYS[7] uncertain zset
-- KEYS[8] events
-- ARGV[1] run id   ARGV[2] fence   ARGV[3] retention ms of the finished record (0 = keep)
-- ARGV[4] partition prefix (schedule keys are built from it)   ARGV[5] wake channel
-- ARGV[6] partition index
-- Returns 'ok', 'late_ok' (late success accepted), 'stale' (rejected) or 'missing'.
local run_key, lease_key, leases_key, attempts_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local done_key, retry_key, uncertain_key, events_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local run_id, fence, retention = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()

local f = redis.call('HMGET', run_key, 'state', 'fence')
local state = f[1]
if not state then return 'missing' end

if f[2] ~= fence or not (state == 'running' or state == 'retrying' or state == 'uncertain') then
  set_attempt(attempts_key, fence, {late = true, late_outcome = 'succeeded', late_at = now})
  emit(events_key, run_id, 'late_result_rejected', 'succeeded:' .. fence)
  return 'stale'
end

redis.call('DEL', lease_key)
redis.call('ZREM', leases_key, run_id)
redis.call('ZREM', retry_key, run_id)
redis.call('ZREM', uncertain_key, run_id)
redis.call('HSET', run_key, 'state', 'succeeded', 'finished', now)
redis.call('HDEL', run_key, 'retry_at', 'reason')
local fields = {outcome = 'succeeded', ['end'] = now}
if state ~= 'running' then fields.late = true end
set_attempt(attempts_key, fence, fields)
redis.call('ZADD', done_key, now, run_id)
if state == 'running' then leave_running(ARGV[4], run_key, run_id, now, ARGV[5], ARGV[6]) end
if retention > 0 then
  redis.call('PEXPIRE', run_key, retention)
  redis.call('PEXPIRE', attempts_key, retention)
end
emit(events_key, run_id, 'succeeded', state ~= 'running' and 'late' or '')
if state == 'running' then return 'ok' end
return 'late_ok'
