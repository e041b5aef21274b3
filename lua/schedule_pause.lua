#!lua
-- schedule_pause.lua: pause (with a note) or resume a schedule.
-- Paused, it leaves the evaluator's due set; its cursor stays where it was, so on resume the
-- occurrences missed meanwhile follow the schedule's catch-up policy. Resuming resets the
-- consecutive-failure count of pause_after_failures (and clears an automatic pause's mark).
-- Pause state lives in the side hash T:sched:<name> in either layout (docs/keys.md); a paused
-- schedule stays in the due set at +inf (every schedule is in it).
-- Tested by: tests/integration/test_schedules.py, tests/integration/test_cli_schedules.py,
--   tests/integration/test_guardrails.py
-- KEYS[1] sched_due zset
-- ARGV[1] partition prefix 'ns:{tag}:' (the schedule's hash is built from it; same hash tag)
-- ARGV[2] name   ARGV[3] '1' pause | '0' resume   ARGV[4] note (pause)
-- ARGV[5] scheduler wake channel   ARGV[6] partition index (a resumed schedule is told to the
--         evaluators when it is due before the due set's head)
-- Returns (status) 'ok' or 'missing'.
local sched_due_key, prefix, name, pause = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local sched_key = prefix .. K.sched .. name
local rec, packed = sched_load(prefix, name)
if not packed and not redis.call('HGET', sched_key, 'version') then return 'missing' end
local now = now_ms()
if pause == '1' then
  redis.call('HSET', sched_key, 'paused', '1', 'pause_note', ARGV[4], 'paused_at', now)
  redis.call('ZADD', sched_due_key, 'inf', name)
else
  redis.call('HSET', sched_key, 'paused', '0', 'resumed_at', now)
  -- guardrails: resuming starts the consecutive-failure count again
  redis.call('HDEL', sched_key, 'pause_note', 'fail_streak', 'auto_paused')
  local cursor
  if packed == true then cursor = rec.n and int_s(rec.n)
  elseif not packed then cursor = redis.call('HGET', sched_key, 'next_ms') end
  if cursor then
    tell_schedulers(ARGV[5], 's', ARGV[6], sched_due_key, cursor)
    redis.call('ZADD', sched_due_key, tonumber(cursor), name)
  end
end
return 'ok'
