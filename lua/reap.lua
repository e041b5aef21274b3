-- reap.lua: recovery pass over one partition.
-- 1. Runs whose lease expired (the worker died or stalled): the attempt's outcome is
--    recorded as unknown; the run is retried (idempotent task: at once after a first expiry,
--    with backoff after repeated ones), parked as
--    `uncertain` (non-idempotent task: an operator decides) or dead-lettered (no attempts left).
-- 2. Runs never started before their starting deadline become `missed`, also when no
--    worker is running to claim them.
-- 3. Retention: finished runs (the done set) older than the retention are deleted.
-- KEYS[1] leases zset   KEYS[2] dead zset   KEYS[3] uncertain zset   KEYS[4] done zset
-- KEYS[5] deadlines zset                    KEYS[6] events
-- ARGV[1] partition prefix 'ns:{tag}:' -- per-run keys (run:, lease:, attempts:, due:<q>,
--         retry:<q>) and schedule keys are built from it; all share this partition's hash tag
-- ARGV[2] max runs per call   ARGV[3] jitter seed in [0,1)
-- ARGV[4] wake channel        ARGV[5] partition index    ARGV[6] retention ms (0 = keep)
-- Returns {expired_leases_handled, missed, deleted, next wake-up ms or -1}: the wake-up is
-- the earliest lease expiry or starting deadline left.
local leases_key, dead_key, uncertain_key = KEYS[1], KEYS[2], KEYS[3]
local done_key, deadlines_key, events_key = KEYS[4], KEYS[5], KEYS[6]
local prefix, limit, seed = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local channel, partition = ARGV[4], ARGV[5]
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
    local f = redis.call('HMGET', run_key, 'state', 'fence', 'idempotent', 'queue', 'attempt',
      'worker', 'started', 'cancel_requested')
    if f[1] == 'running' then
      reaped = reaped + 1
      push_attempt(prefix .. 'attempts:' .. id, f[5], f[2], f[6], f[7], 'unknown', now,
        'lease expired')
      leave_running(prefix, run_key, id, now, channel, partition)
      if f[8] then
        -- its worker died before honouring a cancel request: the cancel wins over a retry
        redis.call('HSET', run_key, 'state', 'cancelled', 'finished', now,
          'reason', 'cancel requested; the lease expired before the worker stopped it')
        redis.call('ZADD', done_key, now, id)
        emit(events_key, id, 'cancelled', 'lease expired')
      elseif f[3] == '0' then
        redis.call('HSET', run_key, 'state', 'uncertain', 'finished', now,
          'reason', 'lease expired; task is not idempotent, outcome unknown')
        redis.call('ZADD', uncertain_key, now, id)
        emit(events_key, id, 'uncertain', 'lease expired')
      else
        -- the expired lease already made the run wait a lease length: the first expiry is
        -- retried at once, repeated ones (a crash loop) back off as failures do
        local jitter = (seed + n * 0.6180339887) % 1
        local delay = 0
        local attempt = tonumber(f[5]) or 1
        if attempt > 1 then
          local b = redis.call('HMGET', run_key, 'backoff_base', 'backoff_max')
          delay = backoff_ms(b[1], b[2], attempt - 1, jitter)
        end
        local state = retry_or_dead(run_key, prefix .. 'retry:' .. f[4], dead_key, id, now,
          false, delay, jitter, 'lease expired', channel, partition .. '|' .. f[4])
        emit(events_key, id, state, 'lease expired')
      end
    end
  end
end

local missed = 0
for _, id in ipairs(redis.call('ZRANGE', deadlines_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)) do
  local run_key = prefix .. 'run:' .. id
  local f = redis.call('HMGET', run_key, 'state', 'queue', 'schedule', 'fence')
  redis.call('ZREM', deadlines_key, id)
  if (f[1] == 'scheduled' or f[1] == 'retrying') and (tonumber(f[4]) or 0) == 0 then
    missed = missed + 1
    redis.call('ZREM', prefix .. 'due:' .. f[2], id)
    if f[3] and f[3] ~= '' then
      local sched_key = prefix .. 'sched:' .. f[3]
      if redis.call('HGET', sched_key, 'buffered') == id then redis.call('HDEL', sched_key, 'buffered') end
    end
    finish_unstarted(prefix, id, 'missed', 'not started before its starting deadline', now,
      done_key, deadlines_key, events_key)
  end
end

local deleted = 0
local retention = tonumber(ARGV[6]) or 0
if retention > 0 then
  local old = redis.call('ZRANGE', done_key, '-inf', now - retention, 'BYSCORE', 'LIMIT', 0, limit)
  for _, id in ipairs(old) do
    redis.call('DEL', prefix .. 'run:' .. id, prefix .. 'attempts:' .. id)
  end
  if #old > 0 then redis.call('ZREM', done_key, unpack(old)) end
  deleted = #old
end

local wake = -1
for _, key in ipairs({leases_key, deadlines_key}) do
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] and (wake == -1 or tonumber(head[2]) < wake) then wake = tonumber(head[2]) end
end
return {reaped, missed, deleted, wake}
