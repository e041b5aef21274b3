-- claim/lanes.lua: tenant lanes (docs/fairness.md "Within a partition"). When the queue has
-- lanes here, runs are taken round-robin from T:lane:<queue>|<tenant>, least recently served
-- tenant first, each a share of the batch by its weight, interleaved; the due-order path then
-- passes laned runs by (retries, releases, replays and schedule runs are not laned and keep
-- their due order). c.lane_of[id] is the lane a candidate was taken from.
-- When the batch is not full after the candidates were read, the lanes are read again past
-- their shares (lanes_past_shares): a run a limit holds never hides the runs of its lane behind
-- it (another task of the tenant, say), within the claim's bound of HELD_SCAN held runs
-- (docs/fairness.md); nor does a share spent on runs taken first (a priority run is also the
-- head of its lane) or left unused (a lane with fewer runs than its share). Read only then: a
-- claim that fills its batch pays nothing for it.
-- A lane key of the wrong type (edited by hand) affects only itself: the claim that meets it
-- renames it aside to '<lane>#damaged' (kept for the operator), takes the tenant out of the
-- lane index, and un-lanes that tenant's waiting runs (out of T:laned:<queue>, at most
-- LANE_REPAIR_SCAN of its entries read), so they keep their due order on the due-order path
-- instead of waiting for a lane that cannot serve them; a 'lane_damaged' event names the key.
-- Nothing is dead-lettered; the other lanes, and the partition's other queues, go on.
-- Tested by: tests/limits/test_fairness.py, tests/limits/test_admission.py,
--   tests/limits/test_tenants.py, tests/integration/test_damaged_lane.py

-- How many tenants of the lane index one claim serves (the next ones wait for later claims).
local LANES_PER_CLAIM = 32
local LANE_REPAIR_SCAN = 100000  -- laned entries read when a damaged lane is set aside

local function set_lane_aside(c, lane, tenant)
  local why = wrong_type(lane, 'zset') or ('key ' .. lane .. ' cannot be read as a zset')
  local aside = lane .. '#damaged'
  redis.call('RENAME', lane, aside)
  local laned = redis.call('ZRANGE', c.keys.laned, 0, LANE_REPAIR_SCAN - 1)
  local drop = {}
  for _, id in ipairs(laned) do
    local t = redis.pcall('HGET', c.prefix .. K.run .. id, 'tenant')
    if type(t) ~= 'table' and (t or '') == tenant then drop[#drop + 1] = id end
  end
  for x = 1, #drop, 5000 do
    redis.call('ZREM', c.keys.laned, unpack(drop, x, math.min(x + 4999, #drop)))
  end
  emit(c.events_key, '', 'lane_damaged', why .. ': set aside as ' .. aside .. '; ' .. #drop
    .. ' waiting runs of its tenant keep their due order')
end

-- Adds the lanes' candidates; returns the set of runs the due-order path passes by (`d`: the
-- due window, flat id/score pairs).
local function lane_candidates(c, d)
  local keys, lims, horizon, now_s = c.keys, c.lims, c.horizon, c.now_s
  local ids, froms, scores, seen, lane_of = c.ids, c.froms, c.scores, c.seen, c.lane_of
  local tenants = redis.call('ZRANGE', keys.lanes, 0, LANES_PER_CLAIM - 1)
  -- each tenant's share of this batch, by weight (T:limits 'tenant:<name>:w', default 1)
  local weights, total = {}, 0
  for x, t in ipairs(tenants) do
    weights[x] = (lims and tonumber(lims['tenant:' .. t .. ':w'])) or 1
    total = total + weights[x]
  end
  local want = math.max(c.limit - #ids, 1)
  local served, picked, most = {}, {}, 0
  for x, t in ipairs(tenants) do
    local lane = c.prefix .. K.lane .. c.queue .. '|' .. t
    local quantum = math.max(1, math.ceil(want * weights[x] / total))
    local got = redis.pcall('ZRANGE', lane, '-inf', horizon, 'BYSCORE', 'LIMIT', 0, quantum,
      'WITHSCORES')
    if got.err then  -- not a zset: set aside, its runs un-laned (see the top)
      set_lane_aside(c, lane, t)
      got = {}
    end
    if #got == 0 then
      if redis.call('EXISTS', lane) == 0 then redis.call('ZREM', keys.lanes, t) end
    else
      served[#served + 1] = now_s
      served[#served + 1] = t
      picked[#picked + 1] = {lane, got, quantum}
      if #got > most then most = #got end
    end
  end
  c.picked = picked
  -- interleaved (first of each lane, then second, ...), so a batch smaller than the shares
  -- still splits fairly; a lane entry whose run left the due set (cancelled, say) is met
  -- like any stale index entry, and removed from its lane then
  for x = 1, most, 2 do
    for _, lg in ipairs(picked) do
      local id = lg[2][x]
      if id and not seen[id] and #ids < c.scan then
        local n = #ids + 1
        ids[n], froms[n], scores[n], seen[id], lane_of[id] = id, true, lg[2][x + 1], true, lg[1]
      end
    end
  end
  if #served > 0 then redis.call('ZADD', keys.lanes, unpack(served)) end
  -- laned runs wait for their lane: the due-order path passes them by
  local skip = seen
  if #d > 0 then
    local ds = {}
    for x = 1, #d, 2 do ds[#ds + 1] = d[x] end
    local sc = redis.call('ZMSCORE', keys.laned, unpack(ds))
    skip = {}
    for id in pairs(seen) do skip[id] = true end
    for x = 1, #ds do if sc[x] then skip[ds[x]] = true end end
  end
  return skip
end

-- Once per call, when the batch is not full after its candidates: the runs of each lane past
-- the share it was read for (a lane whose share was all there), interleaved, at most `room`
-- in all and HELD_SCAN per lane. Returns true when it added candidates.
local function lanes_past_shares(c, room)
  if c.past_read or not c.picked or room <= 0 then return false end
  c.past_read = true
  local ids, froms, scores, seen, lane_of = c.ids, c.froms, c.scores, c.seen, c.lane_of
  local more, most = {}, 0
  for _, lg in ipairs(c.picked) do
    local lane, got, quantum = lg[1], lg[2], lg[3]
    if #got == 2 * quantum then
      local next = redis.call('ZRANGE', lane, '-inf', c.horizon, 'BYSCORE', 'LIMIT', quantum,
        math.min(room, HELD_SCAN), 'WITHSCORES')
      if #next > 0 then
        more[#more + 1] = {lane, next}
        if #next > most then most = #next end
      end
    end
  end
  local added = 0
  for x = 1, most, 2 do
    for _, lg in ipairs(more) do
      local id = lg[2][x]
      if id and not seen[id] and added < room then
        local n = #ids + 1
        ids[n], froms[n], scores[n], seen[id], lane_of[id] = id, true, lg[2][x + 1], true, lg[1]
        added = added + 1
      end
    end
  end
  return added > 0
end
