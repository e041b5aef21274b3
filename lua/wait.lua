#!lua
-- wait.lua: a client is about to block until a run ends (app.wait, await_result). If the run
-- is already in a state a waiter stops at (final, or uncertain: an operator decides), that
-- state is returned; otherwise the waiter is counted on the run (`waited`) and the script that
-- moves the run there pushes one element per waiter onto its notify list, which the client
-- BLPOPs (with a bounded timeout and a re-check, so a lost element costs one timeout).
-- Tested by: tests/client/test_async_and_wait.py, tests/integration/test_cli_runs.py
-- KEYS[1] notify list  T:notify:<run> (declared: the client blocks on it next)
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash is built from it; same hash tag)
-- ARGV[2] run id
-- Returns (status) the state, 'waiting' or 'missing'.
local prefix, run_id = ARGV[1], ARGV[2]
local run_key = prefix .. K.run .. run_id
local state = redis.call('HGET', run_key, 'state')
if not state then return 'missing' end
if FINAL[state] or state == 'uncertain' then return state end
redis.call('HINCRBY', run_key, 'waited', 1)
return 'waiting'
