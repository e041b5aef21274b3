#!lua
-- cancel.lua: cancel one run on an operator's request.
-- A run that has not started (scheduled, retrying, or held back by its schedule's overlap
-- policy) becomes `cancelled` at once and leaves its due/retry set. A running run gets the
-- field `cancel_requested`: its worker sees it at the next heartbeat (heartbeat.lua returns
-- 2), stops the task and reports through fail.lua mode 'cancel'. Finished runs are left as
-- they are; an `uncertain` run needs an operator's verdict (resolve.lua), not a cancel.
-- Tested by: tests/integration/test_scripts.py, tests/integration/test_cli_runs.py
-- KEYS[1] due zset    T:due:<queue>     KEYS[2] retry zset  T:retry:<queue>
-- KEYS[3] done zset   T:done            KEYS[4] deadlines   T:deadlines
-- KEYS[5] events      T:events
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash, and its schedule's hash whose name is
--         read from the run, are built from it; same hash tag)
-- ARGV[2] run id
-- ARGV[3] the run's queue as the caller read it (a run's queue never changes; checked here)
-- ARGV[4] reason (recorded on the run)
-- Returns (status) {result, detail}: 'cancelled'; 'requested' (running; detail = worker);
-- 'finished' or 'uncertain' (detail = state); 'missing'; 'queue' (detail = the real queue).
local due_key, retry_key, done_key, deadlines_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, run_id, queue, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local run_key = prefix .. K.run .. run_id

local f = redis.call('HMGET', run_key, 'state', 'queue', 'worker', 'schedule')
local state = f[1]
if not state then return {'missing', ''} end
local run_queue = f[2] or RUN_DEFAULTS.queue  -- absent: the default (format 3)
if run_queue ~= queue then return {'queue', run_queue} end
local now = now_ms()

if state == 'running' then
  if redis.call('HEXISTS', run_key, 'cancel_requested') == 0 then
    redis.call('HSET', run_key, 'cancel_requested', now, 'cancel_reason', reason)
    emit(events_key, run_id, 'cancel_requested', reason)
  end
  return {'requested', f[3] or ''}
end
if state == 'uncertain' then return {'uncertain', state} end
if state ~= 'scheduled' and state ~= 'retrying' and state ~= 'waiting' then
  return {'finished', state}
end

redis.call('ZREM', due_key, run_id)
redis.call('ZREM', retry_key, run_id)
if f[4] and f[4] ~= '' then
  local sched_key = prefix .. K.sched .. f[4]
  if redis.call('HGET', sched_key, 'buffered') == run_id then
    redis.call('HDEL', sched_key, 'buffered')
  end
end
redis.call('HDEL', run_key, 'retry_at')
if state == 'waiting' then
  redis.call('DEL', prefix .. K.deps .. run_id)
  redis.call('ZREM', prefix .. K.waiting, run_id)
end
finish_unstarted(prefix, run_id, 'cancelled', reason, now, done_key, deadlines_key, events_key)
return {'cancelled', state}
