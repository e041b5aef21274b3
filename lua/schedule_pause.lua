-- schedule_pause.lua: pause (with a note) or resume a schedule.
-- Paused, it leaves the evaluator's due set; its cursor stays where it was, so on resume the
-- occurrences missed meanwhile follow the schedule's catch-up policy.
-- KEYS[1] schedule hash   KEYS[2] sched_due zset
-- ARGV[1] name   ARGV[2] '1' pause | '0' resume   ARGV[3] note (pause)
-- Returns 'ok' or 'missing'.
local sched_key, sched_due_key = KEYS[1], KEYS[2]
local name, pause = ARGV[1], ARGV[2]
if redis.call('EXISTS', sched_key) == 0 then return 'missing' end
local now = now_ms()
if pause == '1' then
  redis.call('HSET', sched_key, 'paused', '1', 'pause_note', ARGV[3], 'paused_at', now)
  redis.call('ZREM', sched_due_key, name)
else
  redis.call('HSET', sched_key, 'paused', '0', 'resumed_at', now)
  redis.call('HDEL', sched_key, 'pause_note')
  local cursor = redis.call('HGET', sched_key, 'next_ms')
  if cursor then redis.call('ZADD', sched_due_key, tonumber(cursor), name) end
end
return 'ok'
