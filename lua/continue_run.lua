#!lua
-- continue_run.lua: a task raised Continue: this slice of the work is done, the same run (same
-- id) runs again after a delay, from the checkpoint given (or the one it has), without
-- spending an attempt (for iterate-until-done jobs). The holder of the current fence only (a
-- stale attempt is refused like a late result, writing nothing). The attempt entry is written
-- ('continued', not counted: the claim's attempt increment is undone, so max_attempts is the
-- budget of failures, not of slices), `continuations` grows by one, the lease and any
-- concurrency slots are freed, and the run goes back to its queue's due set at now + delay,
-- `scheduled` again. Its `due` field (its scheduled time) is kept. A schedule's run leaves the
-- schedule's running set without promoting a buffered run, as a release does.
-- Tested by: tests/workloads/test_continue.py, tests/workloads/test_checkpoints.py
-- KEYS[1] leases zset   KEYS[2] due zset (the run's queue)
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash and attempts, and its schedule's keys,
--         are built from it; same hash tag)
-- ARGV[2] run id   ARGV[3] fence   ARGV[4] delay ms   ARGV[5] '1' = ARGV[6] is the new
--         checkpoint, '0' = keep the run's checkpoint   ARGV[6] the state (msgpack)
-- ARGV[7] checkpoint cap in bytes   ARGV[8] wake channel   ARGV[9] partition index
-- ARGV[10] queue
-- Returns (status) 'continued', 'stale', 'missing' or 'too_large' (nothing written).
local leases_key, due_key = KEYS[1], KEYS[2]
local prefix, run_id, fence = ARGV[1], ARGV[2], ARGV[3]
local bad = damaged_index({leases_key, 'zset', due_key, 'zset'})
if bad then return bad end
local has_state, state = ARGV[5] == '1', ARGV[6]
if has_state and #state > (tonumber(ARGV[7]) or 0) then return 'too_large' end
local run_key, attempts_key = prefix .. K.run .. run_id, prefix .. K.attempts .. run_id
local now = now_ms()

local f = run_fields(run_key, 'state', 'fence', 'schedule', 'attempt', 'worker', 'started',
  'continuations')
if not f or not f[1] then return 'missing' end
if f[2] ~= fence or f[1] ~= 'running' then return 'stale' end

redis.call('ZREM', leases_key, run_id)
if free_limits(prefix, run_key, run_id) then
  wake_workers(ARGV[8], ARGV[9], ARGV[10], now)
end
if f[3] and f[3] ~= '' then redis.call('SREM', prefix .. K.sched_running .. f[3], run_id) end
push_attempt(attempts_key, f[4], fence, f[5], f[6], 'continued', now, nil)
local n = int_s((tonumber(f[7]) or 0) + 1)
local attempt = int_s(math.max((tonumber(f[4]) or 1) - 1, 0))
if has_state then
  redis.call('HSET', run_key, 'state', 'scheduled', 'attempt', attempt, 'continuations', n,
    'continued_at', int_s(now), 'checkpoint', state, 'checkpoint_size', int_s(#state),
    'checkpoint_at', int_s(now), 'checkpoint_fence', fence)
else
  redis.call('HSET', run_key, 'state', 'scheduled', 'attempt', attempt, 'continuations', n,
    'continued_at', int_s(now))
end
add_due(due_key, now + (tonumber(ARGV[4]) or 0), run_id, ARGV[8], ARGV[9], ARGV[10])
return 'continued'
