#!lua flags=allow-oom
-- purge.lua: delete dead-lettered runs of one partition: their records and attempt histories.
-- Only runs still dead are deleted; an index entry without a dead record is just dropped.
-- Flag allow-oom: it only deletes, so it may run when the server is at maxmemory.
-- Tested by: tests/integration/test_cli_runs.py, tests/web/test_oncall.py
-- KEYS[1] dead zset T:dead   KEYS[2] events
-- ARGV[1] partition prefix 'ns:{tag}:' -- run ids are read from the dead index, so their
--         run hashes and attempt lists are built from it (same hash tag)
-- ARGV[2] max runs per call   ARGV[3] only runs dead-lettered at or before this ms ('' = all)
-- ARGV[4..] (optional) these run ids instead of the index's oldest: each is deleted only if it
--         is still in the dead index and its record is dead (ARGV[2], ARGV[3] then unused)
-- Returns (counts) {purged, examined}; call again while examined equals the limit (for chosen
--         ids, examined counts those found in the dead index).
local dead_key, events_key = KEYS[1], KEYS[2]
local prefix, limit = ARGV[1], tonumber(ARGV[2])
local upto = ARGV[3]
if upto == '' then upto = '+inf' end

local ids
if #ARGV > 3 then
  ids = {}
  for i = 4, #ARGV do
    if redis.call('ZSCORE', dead_key, ARGV[i]) then ids[#ids + 1] = ARGV[i] end
  end
else
  ids = redis.call('ZRANGE', dead_key, '-inf', upto, 'BYSCORE', 'LIMIT', 0, limit)
end
local purged = 0
for _, id in ipairs(ids) do
  local run_key = prefix .. K.run .. id
  local state = redis.call('HGET', run_key, 'state')
  if state == 'dead' then
    redis.call('DEL', run_key, prefix .. K.attempts .. id)
    purged = purged + 1
  end
end
if #ids > 0 then
  redis.call('ZREM', dead_key, unpack(ids))
  emit(events_key, '', 'purged', tostring(purged))
end
return {purged, #ids}
