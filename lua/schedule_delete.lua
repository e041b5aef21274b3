#!lua flags=allow-oom
-- schedule_delete.lua: remove a schedule's record (packed and side hash). Its runs stay (history); runs not yet
-- started keep their place and run unless cancelled. Flag allow-oom: it only deletes.
-- Tested by: tests/integration/test_cli_schedules.py
-- KEYS[1] sched_due zset   KEYS[2] schedules index zset   KEYS[3] quarantine zset
-- ARGV[1] partition prefix 'ns:{tag}:' (the schedule's hash is built from it; same hash tag)
-- ARGV[2] name
-- Returns (counts) 1 if it existed, else 0.
local name = ARGV[2]
redis.call('ZREM', KEYS[1], name)
redis.call('ZREM', KEYS[2], name)
redis.call('ZREM', KEYS[3], name)
-- both layouts (docs/keys.md): the packed record and the side hash
local n = redis.call('DEL', ARGV[1] .. K.sched .. name)
local p = redis.pcall('HDEL', ARGV[1] .. K.scheds, name)
if type(p) == 'number' and p > 0 then n = 1 end
return n
