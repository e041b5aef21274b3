#!lua
-- deps_link.lua: register a waiting run of another partition with one of its dependencies,
-- on the dependency's partition: atomically, either the dependency has ended (its state is
-- returned, for the caller to apply with deps_apply.lua) or it will notify the dependent
-- when it ends (T:dependents:<dep>; the notice goes through T:depnotes and the relay).
-- Idempotent: the producer and the relay may both do it.
-- Tested by: tests/workloads/test_dependencies.py
-- KEYS[1] events stream T:events (declared so the call is routed to the partition's slot)
-- ARGV[1] partition prefix 'ns:{tag}:' of the dependency
-- ARGV[2] dependency run id   ARGV[3] the dependent, '<partition>|<run id>'
-- Returns (status) {'linked', ''}, {'ended', state} or {'missing', ''}.
local prefix, dep, entry = ARGV[1], ARGV[2], ARGV[3]
local run_key, dkey = prefix .. K.run .. dep, prefix .. K.dependents .. dep
local bad = damaged_index({KEYS[1], 'stream', dkey, 'set'})
if bad then return bad end
local f = run_fields(run_key, 'state')
if not f or not f[1] then return {'missing', ''} end
if FINAL[f[1]] then return {'ended', f[1]} end
redis.call('SADD', dkey, entry)
redis.call('HSET', run_key, 'deps_out', '1')
return {'linked', ''}
