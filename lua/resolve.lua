#!lua
-- resolve.lua: an operator's verdict on an `uncertain` run (its last attempt's outcome is
-- unknown: a non-idempotent task whose worker vanished or was stopped).
-- 'succeeded': the work did happen -> state succeeded, done index.
-- 'failed': it did not, and must not be retried by itself -> dead-letter (dead index), where
-- its owner sees it. (The third verdict, run it again, is replay.lua.)
-- The attempt history is left as observed (outcome unknown); the verdict is on the run.
-- Tested by: tests/integration/test_cli_runs.py, tests/integration/test_scripts.py
-- KEYS[1] uncertain zset   KEYS[2] dead zset   KEYS[3] done zset   KEYS[4] events
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash is built from it; same hash tag)
-- ARGV[2] run id   ARGV[3] 'succeeded' | 'failed'   ARGV[4] note
-- Returns (status) {status, state}: 'ok' (new state), 'not_uncertain' (current state), 'missing'.
local uncertain_key, dead_key, done_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, run_id, verdict, note = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local run_key = prefix .. K.run .. run_id

local state = redis.call('HGET', run_key, 'state')
if not state then return {'missing', ''} end
if state ~= 'uncertain' then return {'not_uncertain', state} end
local now = now_ms()
redis.call('ZREM', uncertain_key, run_id)
redis.call('HSET', run_key, 'resolved_as', verdict, 'resolved_at', now, 'finished', now)
if note ~= '' then redis.call('HSET', run_key, 'resolution_note', note) end
if verdict == 'succeeded' then
  redis.call('HSET', run_key, 'state', 'succeeded')
  redis.call('ZADD', done_key, now, run_id)
else
  redis.call('HSET', run_key, 'state', 'dead', 'reason', 'outcome unknown; resolved as failed')
  redis.call('ZADD', dead_key, now, run_id)
end
emit(events_key, run_id, 'resolved', verdict)
wake_waiters(prefix, run_key, run_id, redis.call('HGET', run_key, 'state'))
return {'ok', redis.call('HGET', run_key, 'state')}
