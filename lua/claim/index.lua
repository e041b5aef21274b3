-- claim/index.lua: the index writes of a claim, one command per index for the whole batch.
-- Every candidate whose record was read (started, finished, dead-lettered or stale) leaves
-- the set it was met in (c.from_due, c.from_retry, noted by claim.lua as it reads them) and,
-- from the due set, the priority and laned indexes and its lane; runs a limit holds stay.
-- Tested by: tests/integration/test_scripts.py, tests/limits/test_fairness.py,
--   tests/limits/test_priority.py

local function write_indexes(c)
  local keys, from_due = c.keys, c.from_due
  if #from_due > 0 then
    redis.call('ZREM', c.due_key, unpack(from_due))
    if c.prio then redis.call('ZREM', keys.prio, unpack(from_due)) end
    if c.lanes then
      -- a laned run met on another path (the priority index, say) leaves its lane too, or the
      -- lane's next claim would spend a slot on its stale entry and return short: its lane is
      -- named by its tenant ('' for none)
      local others = {}
      for _, id in ipairs(from_due) do
        if not c.lane_of[id] then others[#others + 1] = id end
      end
      if #others > 0 then
        local sc = redis.call('ZMSCORE', keys.laned, unpack(others))
        for x, id in ipairs(others) do
          if sc[x] then
            local tenant = redis.call('HGET', c.prefix .. K.run .. id, 'tenant') or ''
            c.lane_of[id] = c.prefix .. K.lane .. c.queue .. '|' .. tenant
          end
        end
      end
      -- laned, or laned once but met in due order (its lane was gone): tidy up
      redis.call('ZREM', keys.laned, unpack(from_due))
      local by_lane, lanes = {}, {}
      for _, id in ipairs(from_due) do
        local lane = c.lane_of[id]
        if lane then
          if not by_lane[lane] then by_lane[lane] = {}; lanes[#lanes + 1] = lane end
          local l = by_lane[lane]
          l[#l + 1] = id
        end
      end
      for _, lane in ipairs(lanes) do redis.call('ZREM', lane, unpack(by_lane[lane])) end
    end
  end
  if #c.from_retry > 0 then redis.call('ZREM', c.retry_key, unpack(c.from_retry)) end
  if #c.leased > 0 then
    -- a first lease, or one earlier than the set's head, is told to the reapers
    tell_schedulers(c.sched_wake, 'l', c.partition, c.leases_key, c.until_s)
    zadd_batch(c.leases_key, c.leased)
  end
end
