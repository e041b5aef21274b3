-- reap.lua: recover runs of one partition whose lease expired (the worker died or stalled).
-- The attempt's outcome is recorded as unknown; then the run is retried with backoff
-- (idempotent task), parked as `uncertain` (non-idempotent task: an operator decides),
-- or dead-lettered (attempts exhausted).
-- KEYS[1] leases zset   KEYS[2] dead zset   KEYS[3] uncertain zset   KEYS[4] events
-- ARGV[1] partition prefix 'ns:{tag}:' -- per-run keys (run:, lease:, attempts:, retry:<q>)
--         are built from it and share this partition's hash tag
-- ARGV[2] max runs per call   ARGV[3] jitter seed in [0,1)
-- ARGV[4] wake channel        ARGV[5] partition index (for wake tags)
-- Returns {reaped_count, next_lease_expiry_ms or -1}.
local leases_key, dead_key, uncertain_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, limit, seed = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()

local ids = redis.call('ZRANGE', leases_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
local reaped = 0
for n, id in ipairs(ids) do
  local run_key, lease_key = prefix .. 'run:' .. id, prefix .. 'lease:' .. id
  local ttl = redis.call('PTTL', lease_key)
  if ttl > 0 then
    -- the lease is alive (renewed); repair the index
    redis.call('ZADD', leases_key, now + ttl, id)
  else
    redis.call('ZREM', leases_key, id)
    redis.call('DEL', lease_key)
    local f = redis.call('HMGET', run_key, 'state', 'fence', 'idempotent', 'queue')
    if f[1] == 'running' then
      reaped = reaped + 1
      set_attempt(prefix .. 'attempts:' .. id, f[2],
        {outcome = 'unknown', ['end'] = now, error = 'lease expired'})
      if f[3] == '0' then
        redis.call('HSET', run_key, 'state', 'uncertain', 'finished', now,
          'reason', 'lease expired; task is not idempotent, outcome unknown')
        redis.call('ZADD', uncertain_key, now, id)
        emit(events_key, id, 'uncertain', 'lease expired')
      else
        local jitter = (seed + n * 0.6180339887) % 1
        local state = retry_or_dead(run_key, prefix .. 'retry:' .. f[4], dead_key, id, now,
          false, nil, jitter, 'lease expired', ARGV[4], ARGV[5] .. '|' .. f[4])
        emit(events_key, id, state, 'lease expired')
      end
    end
  end
end

local head = redis.call('ZRANGE', leases_key, 0, 0, 'WITHSCORES')
return {reaped, head[2] and tonumber(head[2]) or -1}
