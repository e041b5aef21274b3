-- fail.lua: record a failed attempt; retry with backoff (or an explicit delay) or dead-letter.
-- Accepted only from the current fence holder while the run is running; a stale holder's
-- failure is written into its own attempt record and changes nothing else.
-- KEYS[1] run hash     KEYS[2] lease string   KEYS[3] leases zset   KEYS[4] attempts list
-- KEYS[5] retry zset (the run's queue)        KEYS[6] dead zset     KEYS[7] events
-- ARGV[1] run id   ARGV[2] fence   ARGV[3] error text
-- ARGV[4] mode: 'error' (backoff) | 'retry' (explicit delay ARGV[5]) | 'fatal' (no retry)
-- ARGV[5] delay ms (mode 'retry')   ARGV[6] jitter in [0,1)
-- ARGV[7] wake channel              ARGV[8] wake tag '<partition>|<queue>'
-- Returns {state, retry_at_ms}: state is 'retrying', 'dead', 'stale' or 'missing'.
local run_key, lease_key, leases_key, attempts_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retry_key, dead_key, events_key = KEYS[5], KEYS[6], KEYS[7]
local run_id, fence, err, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()

local f = redis.call('HMGET', run_key, 'state', 'fence')
if not f[1] then return {'missing', 0} end
if f[2] ~= fence or f[1] ~= 'running' then
  set_attempt(attempts_key, fence, {late = true, late_outcome = 'failed', late_error = err,
                                    late_at = now})
  emit(events_key, run_id, 'late_result_rejected', 'failed:' .. fence)
  return {'stale', 0}
end

redis.call('DEL', lease_key)
redis.call('ZREM', leases_key, run_id)
set_attempt(attempts_key, fence, {outcome = 'failed', ['end'] = now, error = err})
redis.call('HSET', run_key, 'error', err)
local delay = nil
if mode == 'retry' then delay = tonumber(ARGV[5]) end
local state, at = retry_or_dead(run_key, retry_key, dead_key, run_id, now, mode == 'fatal',
  delay, ARGV[6], err, ARGV[7], ARGV[8])
emit(events_key, run_id, state, err)
return {state, at}
