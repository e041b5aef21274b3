-- schedule_delete.lua: remove a schedule's definition. Its runs stay (history); runs not yet
-- started keep their place and run unless cancelled.
-- KEYS[1] schedule hash   KEYS[2] sched_due zset   KEYS[3] schedules index zset
-- ARGV[1] name
-- Returns 1 if it existed, else 0.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return redis.call('DEL', KEYS[1])
