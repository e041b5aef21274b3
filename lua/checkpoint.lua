#!lua
-- checkpoint.lua: store a running attempt's checkpoint on its run record, for the next
-- attempt (a retry, a recovery after a lost lease, a continuation) to start from. Only the
-- holder the run hash names may write (state running, same worker and fence, a lease in
-- T:leases): an attempt whose lease expired and whose run was claimed again (fence + 1) is
-- refused like a late result, so a stale attempt can never overwrite a newer checkpoint. A
-- refusal is recorded in the events (`checkpoint_rejected`, naming the refused fence) and
-- writes nothing else. A checkpoint is its own script, not part of heartbeat.lua: the task
-- waits for its answer (a heartbeat is periodic and batched per partition), and it grows
-- memory by up to the cap, so unlike the heartbeat it carries no allow-oom (refused whole at
-- maxmemory, as an enqueue is).
-- Tested by: tests/workloads/test_checkpoints.py, tests/workloads/test_continue.py
-- KEYS[1] leases zset  T:leases   KEYS[2] events stream  T:events
-- ARGV[1] partition prefix 'ns:{tag}:' (the run hash is built from it; same hash tag)
-- ARGV[2] run id   ARGV[3] owner token '<worker>:<fence>'   ARGV[4] fence
-- ARGV[5] the state (msgpack, checked against the cap by the worker)
-- ARGV[6] the cap in bytes: a longer state is refused ('too_large'), whoever sent it
-- Fields written: checkpoint (the state), checkpoint_size (bytes), checkpoint_at (server ms),
-- checkpoint_fence (the attempt's fence).
-- Returns (status) 'stored', 'stale' (not the holder: nothing written), 'missing' (no run
-- record, or one of the wrong type) or 'too_large'.
local leases_key, events_key, prefix = KEYS[1], KEYS[2], ARGV[1]
local run_id, token, fence, state = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local bad = damaged_index({leases_key, 'zset', events_key, 'stream'})
if bad then return bad end
if #state > (tonumber(ARGV[6]) or 0) then return 'too_large' end
local run_key = prefix .. K.run .. run_id
local f = run_fields(run_key, 'state', 'worker', 'fence')
if not f or not f[1] then return 'missing' end
if f[1] ~= 'running' or not f[2] or not f[3] or f[2] .. ':' .. f[3] ~= token
    or not redis.call('ZSCORE', leases_key, run_id) then
  emit(events_key, run_id, 'checkpoint_rejected', 'fence ' .. fence .. ' (the run is at fence '
    .. (f[3] or '0') .. ', ' .. f[1] .. ')')
  return 'stale'
end
redis.call('HSET', run_key, 'checkpoint', state, 'checkpoint_size', int_s(#state),
  'checkpoint_at', int_s(now_ms()), 'checkpoint_fence', fence)
return 'stored'
