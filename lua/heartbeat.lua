#!lua flags=allow-oom
-- heartbeat.lua: extend the leases a worker holds in one partition. A lease is the run's
-- score in the leases zset (its expiry); it is extended only for the holder the run hash
-- names (state running, same worker and fence), so a run reaped or claimed again meanwhile
-- is reported lost. An expired lease the reaper has not acted on yet is extended too: the
-- holder is still the owner until the reaper decides otherwise.
-- Flag allow-oom: at maxmemory (noeviction) Redis refuses scripts that may grow memory, the
-- reaper's included; a heartbeat only rewrites a score and a field, and must never be refused
-- while the reaper could expire the lease it extends. The progress it may carry stays small
-- (the worker cuts a note to 200 characters; a progress longer than PROGRESS_MAX bytes, from
-- any client, is not written) and overwrites the previous one in place.
-- Progress rides on the heartbeat: a run's progress (`current_run().progress`), when it
-- changed since the last beat, is written to its record (`progress` JSON, `progress_at`
-- server ms) under the same holder check as the lease, so a stale attempt's progress is never
-- written.
-- Tested by: tests/integration/test_scripts.py, tests/integration/test_worker_stalls.py,
--   tests/workloads/test_progress.py
-- KEYS[1] leases zset  T:leases
-- ARGV[1] partition prefix 'ns:{tag}:' (run hashes are built from it; same hash tag)
-- ARGV[2] lease ms
-- ARGV[3..] per run, three values: run id, owner token '<worker>:<fence>', progress (JSON
--           '{"done":..,"total":..,"note":..}', or '' when unchanged since the last beat)
-- Returns (each) one integer per run: 1 = lease held, 0 = lost (the worker must stop that run),
-- 2 = held, but cancellation was requested (the worker stops the run and reports 'cancel').
local PROGRESS_MAX = 2048
local leases_key, prefix = KEYS[1], ARGV[1]
local bad = damaged_index({leases_key, 'zset'})
if bad then return bad end
local now = now_ms()
local now_s, until_s = int_s(now), int_s(now + tonumber(ARGV[2]))  -- formatted once per call
local out = {}
for i = 3, #ARGV, 3 do
  local run_id, token, progress = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local run_key = prefix .. K.run .. run_id
  -- a record key of the wrong type: that lease is lost (the reaper dead-letters the run);
  -- the worker's other leases are renewed
  local f = run_fields(run_key, 'state', 'worker', 'fence', 'cancel_requested') or {}
  local ok = 0
  if f[1] == 'running' and f[2] and f[3] and f[2] .. ':' .. f[3] == token then
    redis.call('ZADD', leases_key, until_s, run_id)
    if progress and progress ~= '' and #progress <= PROGRESS_MAX then
      redis.call('HSET', run_key, 'heartbeat', now_s, 'progress', progress, 'progress_at', now_s)
    else
      redis.call('HSET', run_key, 'heartbeat', now_s)
    end
    ok = 1
    if f[4] then ok = 2 end
  end
  out[#out + 1] = ok
end
return out
