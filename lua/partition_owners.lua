#!lua flags=allow-oom
-- partition_owners.lua: a scheduler's turn at the table of which scheduler evaluates which
-- partition: it says it is alive, renews the partitions it holds up to its fair share
-- (ceil(P / live schedulers)), gives back the rest, and takes free ones -- never held, or
-- held by a scheduler whose lease expired -- up to that share. One call, one key, whatever P.
-- On a plain server the table is <ns>:owners and covers every partition (the layout every
-- version wrote). On a cluster each node's partitions have a table of their own, kept in the
-- slot of the node's first partition (T:node_owners, <ns>:{tag}:owners), so a dead primary stops only the
-- ownership of its own partitions: the call then names the partitions it covers (ARGV[5..]),
-- and the partitions an older scheduler still holds in <ns>:owners (a rolling upgrade), which
-- this one leaves to it.
-- Safety never rests on this table (materialize.lua compares-and-sets each schedule); it only
-- splits the work. Flag allow-oom: it rewrites a few small fields, so ownership stays put while
-- the server is at maxmemory (nothing is materialised meanwhile).
-- Tested by: tests/integration/test_schedules.py, tests/integration/test_failover.py,
--            tests/integration/test_shard_outage.py
-- KEYS[1] owners hash <ns>:owners or <ns>:{tag}:owners -- fields p:<partition> =
--         '<scheduler id>|<expiry ms>' and s:<scheduler id> = last seen (ms)
-- ARGV[1] scheduler id   ARGV[2] lease ms   ARGV[3] partitions P   ARGV[4] 'hold' | 'release'
-- ARGV[5] (optional) n: the table covers the n partitions ARGV[6..5+n] (absent: 0..P-1)
-- ARGV[6+n..] (optional) partitions held by an older scheduler in <ns>:owners: not taken
-- Returns (counts) {server now ms, next ms, owned partitions...}: next is when to come back sooner
-- than the usual renewal (-1: no need): when another live scheduler would lapse (it may have
-- died, and its share would then grow this one's), or when another's lease on a partition
-- this one should take over runs out.
local key, me, ttl, P, mode = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local now = now_ms()
local parts, covered, foreign = {}, {}, {}
local n = tonumber(ARGV[5] or '')
if n then
  for i = 1, n do
    local p = tonumber(ARGV[5 + i])
    parts[#parts + 1], covered[p] = p, true
  end
  for i = 6 + n, #ARGV do foreign[tonumber(ARGV[i])] = true end
else
  for p = 0, P - 1 do parts[#parts + 1], covered[p] = p, true end
end
local h = redis.call('HGETALL', key)
local seen, owner, expiry = {}, {}, {}
for i = 1, #h, 2 do
  local f, v = h[i], h[i + 1]
  local kind, id = string.sub(f, 1, 2), string.sub(f, 3)
  if kind == 's:' then
    seen[id] = tonumber(v) or 0
  elseif kind == 'p:' then
    local sid, exp = string.match(v, '^(.*)|(%d+)$')
    local p = tonumber(id)
    if p and sid then owner[p], expiry[p] = sid, tonumber(exp) end
  end
end

local drop = {}
if mode == 'release' then
  for p, sid in pairs(owner) do
    if sid == me then drop[#drop + 1] = 'p:' .. p end
  end
  drop[#drop + 1] = 's:' .. me
  redis.call('HDEL', key, unpack(drop))
  return {now, -1}
end

seen[me] = now
local live, nxt = 0, -1
for sid, t in pairs(seen) do
  if now - t <= ttl then
    live = live + 1
    if sid ~= me and (nxt == -1 or t + ttl + 1 < nxt) then nxt = t + ttl + 1 end
  else
    drop[#drop + 1] = 's:' .. sid
  end
end
local share = math.ceil(#parts / live)
local until_s = me .. '|' .. string.format('%d', now + ttl)
local set, out, held = {'s:' .. me, string.format('%d', now)}, {now, -1}, 0
-- a partition this table no longer covers (its slot moved to another node): this
-- scheduler's entry, or anyone's that lapsed, goes
for p, sid in pairs(owner) do
  if not covered[p] and (sid == me or expiry[p] <= now) then drop[#drop + 1] = 'p:' .. p end
end
-- renew what this scheduler holds, up to its share; give back the rest (one joined) and what
-- an older scheduler holds
for _, p in ipairs(parts) do
  if owner[p] == me then
    if held < share and not foreign[p] then
      held = held + 1
      set[#set + 1] = 'p:' .. p
      set[#set + 1] = until_s
      out[#out + 1] = p
    else
      drop[#drop + 1] = 'p:' .. p
    end
  end
end
-- take free partitions up to the share
for _, p in ipairs(parts) do
  if held >= share then break end
  if foreign[p] then
    -- an older scheduler's: left to it
  elseif owner[p] ~= me and (not owner[p] or expiry[p] <= now) then
    held = held + 1
    set[#set + 1] = 'p:' .. p
    set[#set + 1] = until_s
    out[#out + 1] = p
  elseif owner[p] and owner[p] ~= me and (nxt == -1 or expiry[p] < nxt) then
    nxt = expiry[p]
  end
end
out[2] = nxt
redis.call('HSET', key, unpack(set))
if #drop > 0 then redis.call('HDEL', key, unpack(drop)) end
return out
