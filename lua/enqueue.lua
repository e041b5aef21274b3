-- enqueue.lua: create a run once and make it due (state: scheduled).
-- KEYS[1] run hash       T:run:<id>
-- KEYS[2] due zset       T:due:<queue>
-- KEYS[3] events stream  T:events
-- ARGV[1] run id
-- ARGV[2] due time, ms since epoch, or '' to use server time + ARGV[3]
-- ARGV[3] delay ms (used when ARGV[2] is '')
-- ARGV[4] wake channel   ARGV[5] wake tag '<partition>|<queue>'
-- ARGV[6..] field, value pairs of the run record (task, queue, payload, policies...)
-- Returns {1, due_ms} when created, {0, due_ms} when the id already existed (idempotency key).
local run_key, due_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local run_id = ARGV[1]

if redis.call('EXISTS', run_key) == 1 then
  return {0, tonumber(redis.call('HGET', run_key, 'due')) or 0}
end

local now = now_ms()
local due = tonumber(ARGV[2])
if due == nil then due = now + tonumber(ARGV[3]) end

local fields = {'id', run_id, 'state', 'scheduled', 'created', now, 'due', due,
                'attempt', 0, 'fence', 0}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', run_key, unpack(fields))
add_due(due_key, due, run_id, ARGV[4], ARGV[5])
emit(events_key, run_id, 'scheduled', tostring(due))
return {1, due}
