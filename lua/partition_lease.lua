#!lua flags=allow-oom
-- partition_lease.lua: a scheduler acquires, renews or releases one partition.
-- Flag allow-oom: renewing rewrites one small key, so ownership stays put while the server
-- is at maxmemory (nothing is materialised meanwhile: materialize.lua is refused).
-- KEYS[1] owner string T:owner (PX TTL)
-- ARGV[1] scheduler id   ARGV[2] ttl ms   ARGV[3] 'hold' (acquire or renew) | 'release'
-- Returns 1 if the caller owns the partition after the call, else 0.
local owner = redis.call('GET', KEYS[1])
if ARGV[3] == 'release' then
  if owner == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
if owner == ARGV[1] or not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
