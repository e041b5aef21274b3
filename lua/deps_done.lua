#!lua
-- deps_done.lua: the relay (scheduler/relay.py) applied these dependency notices and link
-- requests of this partition on the partitions they name: remove them from T:depnotes and
-- T:deplinks, every one of a relay pass in one call. The relay read each list from its head
-- (LRANGE 0 n-1) and the scripts only append to it (RPUSH), so when the head still holds
-- exactly what was given, in order, one LTRIM removes it (checked for 3 entries or more: one
-- or two are removed by value as cheaply, an LREM finding each at the head); otherwise (another relay, or the
-- producer for its link request, removed some meanwhile, or the relay left out one it could
-- not apply) each is removed by value, once (LREM count 1): one gone already is skipped, an
-- entry appended since is kept. A list given nothing is not touched. A list of the wrong type
-- refuses the call at its first command, before anything is removed.
-- Tested by: tests/workloads/test_dependencies.py
-- KEYS[1] notices list T:depnotes   KEYS[2] link requests list T:deplinks
-- ARGV[1] how many notices follow   ARGV[2..] the notices, then the link requests, as read
-- Returns (counts) how many entries were removed.
local notes = tonumber(ARGV[1])
local removed = 0
local function remove_read(key, first, last)
  local count = last - first + 1
  if count <= 0 then return end
  local head = count > 2 and redis.call('LRANGE', key, 0, count - 1) or {}
  local same = #head == count
  local i = 1
  while same and i <= count do
    same = head[i] == ARGV[first + i - 1]
    i = i + 1
  end
  if same then
    redis.call('LTRIM', key, count, -1)
    removed = removed + count
    return
  end
  for j = first, last do removed = removed + redis.call('LREM', key, 1, ARGV[j]) end
end
remove_read(KEYS[1], 2, notes + 1)
remove_read(KEYS[2], notes + 2, #ARGV)
return removed
