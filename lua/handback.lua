#!lua
-- handback.lua: a worker that does not know the run's task gives the run back, before its
-- body ever started, for a worker that knows it (a rolling deploy: old workers meet runs of a
-- task only the new ones have). The attempt is not counted (the claim's increment is undone)
-- and no attempt entry is written: nothing ran. The run returns to its queue's due set, not
-- before now + a delay that doubles with each hand-back of the run (HANDBACKS field), from
-- ARGV[7] up to ARGV[8] ms, so a worker that keeps meeting it does not claim it in a hot loop.
-- A non-idempotent run goes back too: its body never started.
-- Tested by: tests/integration/test_rolling_deploy.py, tests/security/test_acl.py
-- KEYS[1] leases zset   KEYS[2] due zset (the run's queue)   KEYS[3] events
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash, and its schedule's keys, are built
--         from it; same hash tag)
-- ARGV[2] run id   ARGV[3] fence   ARGV[4] wake channel   ARGV[5] partition index
-- ARGV[6] queue   ARGV[7] first delay ms   ARGV[8] longest delay ms   ARGV[9] worker id
-- Returns (status) 'handed_back', 'stale' or 'missing'.
local leases_key, due_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local prefix, run_id, fence = ARGV[1], ARGV[2], ARGV[3]
local run_key = prefix .. K.run .. run_id
local now = now_ms()

local f, status = take_back(prefix, leases_key, run_key, run_id, fence, ARGV[4], ARGV[5],
  ARGV[6], now, 'due', 'schedule', 'attempt', 'handbacks')
if not f then return status end
step_out_of_schedule(prefix, f[4], run_id)  -- it will run elsewhere
local n = (tonumber(f[6]) or 0) + 1
local delay = math.min((tonumber(ARGV[7]) or 0) * 2 ^ math.min(n - 1, 30), tonumber(ARGV[8]) or 0)
local at = math.max(tonumber(f[3]) or now, now + math.floor(delay))
redis.call('HSET', run_key, 'state', 'scheduled', 'handbacks', int_s(n),
  'attempt', int_s(math.max((tonumber(f[5]) or 1) - 1, 0)))
add_due(due_key, at, run_id, ARGV[4], ARGV[5], ARGV[6])
emit(events_key, run_id, 'handed_back', ARGV[9])
return 'handed_back'
