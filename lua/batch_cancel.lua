#!lua
-- batch_cancel.lua: cancel a batch: its callbacks still waiting are cancelled first (a
-- cancelled batch runs none of them), then every member not finished: one not started
-- (waiting, scheduled, retrying) is cancelled at once, one running is asked to stop (its
-- worker sees the request at its next heartbeat, as for cancel.lua). Each member's end is
-- counted in the batch as usual (cancelled = failed).
-- Tested by: tests/workloads/test_batches.py
-- KEYS[1] events stream T:events   KEYS[2] done zset T:done   KEYS[3] deadlines T:deadlines
-- ARGV[1] partition prefix 'ns:{tag}:'   ARGV[2] batch id   ARGV[3] reason
-- Returns (counts) {members cancelled, members asked to stop, callbacks cancelled}, or an
-- error NO_BATCH.
local prefix, batch_id, reason = ARGV[1], ARGV[2], ARGV[3]
local bkey, pending_key = prefix .. K.batch .. batch_id, prefix .. K.bpending .. batch_id
local bad = damaged_index({KEYS[1], 'stream', KEYS[2], 'zset', KEYS[3], 'zset', bkey, 'hash',
  pending_key, 'set'})
if bad then return bad end
if redis.call('EXISTS', bkey) == 0 then return redis.error_reply('NO_BATCH no batch ' .. batch_id) end
local now = now_ms()
redis.call('HSET', bkey, 'cancelled', now, 'cancel_reason', reason)
local todo, callbacks = {}, 0
for _, cb in ipairs(redis.call('HMGET', bkey, 'on_complete', 'on_success', 'on_failure')) do
  if cb and redis.pcall('HGET', prefix .. K.run .. cb, 'state') == 'waiting' then
    cancel_waiting(prefix, cb, reason, now, todo)
    callbacks = callbacks + 1
  end
end
local cancelled, requested = 0, 0
for _, id in ipairs(redis.call('SMEMBERS', pending_key)) do
  local run_key = prefix .. K.run .. id
  local f = redis.pcall('HMGET', run_key, 'state', 'queue')
  if not f.err and f[1] then
    local st, queue = f[1], f[2] or RUN_DEFAULTS.queue
    if st == 'running' then
      if redis.call('HEXISTS', run_key, 'cancel_requested') == 0 then
        redis.call('HSET', run_key, 'cancel_requested', now, 'cancel_reason', reason)
        emit(KEYS[1], id, 'cancel_requested', reason)
      end
      requested = requested + 1
    elseif (st == 'waiting' or st == 'scheduled' or st == 'retrying')
        and not wrong_type(prefix .. K.due .. queue, 'zset')
        and not wrong_type(prefix .. K.retry .. queue, 'zset') then
      redis.call('ZREM', prefix .. K.due .. queue, id)
      redis.call('ZREM', prefix .. K.retry .. queue, id)
      redis.call('HDEL', run_key, 'retry_at')
      redis.call('DEL', prefix .. K.deps .. id)
      redis.call('ZREM', prefix .. K.waiting, id)
      finish_unstarted(prefix, id, 'cancelled', reason, now, KEYS[2], KEYS[3], KEYS[1])
      cancelled = cancelled + 1
    end
  end
end
for i = 1, #todo, 2 do
  settle_dependents(prefix, prefix .. K.run .. todo[i], todo[i], todo[i + 1])
end
return {cancelled, requested, callbacks}
