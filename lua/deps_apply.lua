#!lua
-- deps_apply.lua: dependencies in other partitions ended: count them in the gates of waiting
-- runs of this partition (release, or cancel with the reason naming the dependency), and
-- settle the gates of the runs cancelled so. Each (dependent, dependency) pair is counted
-- once (an SREM from the dependent's pending set), so a notice applied twice -- the relay
-- and the producer, or a relay that died before removing it -- changes nothing the second
-- time.
-- Tested by: tests/workloads/test_dependencies.py
-- KEYS[1] events stream T:events
-- ARGV[1] partition prefix 'ns:{tag}:' of the dependents
-- ARGV[2..] per notice, 3 values: dependent run id, dependency run id, the dependency's
--           final state ('missing': it does not exist)
-- Returns (counts) how many notices were given.
local prefix = ARGV[1]
local bad = damaged_index({KEYS[1], 'stream'})
if bad then return bad end
local now = now_ms()
local todo = {}
for i = 2, #ARGV, 3 do gate_apply(prefix, ARGV[i], ARGV[i + 1], ARGV[i + 2], now, todo) end
for i = 1, #todo, 2 do
  settle_dependents(prefix, prefix .. K.run .. todo[i], todo[i], todo[i + 1])
end
return math.floor((#ARGV - 1) / 3)
