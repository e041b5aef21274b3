#!lua
-- replay.lua: a new run that does the work of a finished run again, linked both ways
-- (new `replay_of` = old id, old `replayed_by` = new id). Task, queue, payload, task options,
-- owner, schedule and idempotency key are copied: a replay is the same business operation, so
-- effects recorded under that key are not done twice. The new run is due now.
-- The old run is handled: it leaves the dead-letter / uncertain index for the done index
-- (kept for the retention, then swept). An uncertain old run is thereby resolved as failed
-- (state dead, resolved_as replay). A run is replayed once; asking again returns that replay.
-- Tested by: tests/integration/test_cli_runs.py
-- KEYS[1] due zset T:due:<queue>   KEYS[2] dead zset   KEYS[3] uncertain zset
-- KEYS[4] done zset                 KEYS[5] events
-- ARGV[1] partition prefix 'ns:{tag}:' (both run hashes are built from it; same hash tag)
-- ARGV[2] old run id   ARGV[3] new run id (same partition as the old one)
-- ARGV[4] '1' = also replay a succeeded run    ARGV[5] the run's queue as the caller read it
-- ARGV[6] wake channel    ARGV[7] partition index    ARGV[8] note
-- Returns (status) {status, detail}: 'created' (new id), 'already' (the existing replay's id),
-- 'active' (state: still scheduled/running/retrying), 'succeeded' (needs force),
-- 'missing', 'queue' (the real queue).
local due_key, dead_key, uncertain_key, done_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, old_id, new_id, force, queue = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local old_key, new_key = prefix .. K.run .. old_id, prefix .. K.run .. new_id

local COPY = {'task', 'queue', 'payload', 'max_attempts', 'backoff_base', 'backoff_max',
  'timeout', 'idempotent', 'owner', 'schedule', 'tenant'}
local f = redis.call('HMGET', old_key, 'state', 'queue', 'replayed_by', 'key', unpack(COPY))
local state = f[1]
if not state then return {'missing', ''} end
local run_queue = f[2] or RUN_DEFAULTS.queue  -- absent: the default (format 3)
if run_queue ~= queue then return {'queue', run_queue} end
if f[3] and f[3] ~= '' then return {'already', f[3]} end
if state == 'scheduled' or state == 'running' or state == 'retrying' or state == 'waiting' then
  return {'active', state}
end
if state == 'succeeded' and force ~= '1' then return {'succeeded', state} end
if redis.call('EXISTS', new_key) == 1 then return {'already', new_id} end

local now = now_ms()
local key = f[4]
if not key or key == '' then key = old_id end
local fields = {'state', 'scheduled', 'created', now, 'due', now, 'replay_of', old_id,
  'key', key}
for i, name in ipairs(COPY) do
  local v = f[4 + i]
  if v and v ~= '' then
    fields[#fields + 1] = name
    fields[#fields + 1] = v
  end
end
redis.call('HSET', new_key, unpack(fields))
add_due(due_key, now, new_id, ARGV[6], ARGV[7], queue)
emit(events_key, new_id, 'scheduled', 'replay of ' .. old_id)

redis.call('HSET', old_key, 'replayed_by', new_id, 'replayed_at', now)
if state == 'uncertain' then
  redis.call('HSET', old_key, 'state', 'dead', 'resolved_as', 'replay', 'resolved_at', now,
    'reason', 'outcome unknown; resolved by a replay')
  settle_dependents(prefix, old_key, old_id, 'dead')  -- it ended: its dependents and batch
end
if ARGV[8] ~= '' then redis.call('HSET', old_key, 'replay_note', ARGV[8]) end
redis.call('ZREM', dead_key, old_id)
redis.call('ZREM', uncertain_key, old_id)
redis.call('ZADD', done_key, now, old_id)
emit(events_key, old_id, 'replayed', new_id)
return {'created', new_id}
