-- claim/index.lua: the index writes of a claim, one command per index for the whole batch.
-- Every candidate whose record was read (started, finished, dead-lettered or stale) leaves
-- the set it was met in, and the priority and laned indexes; runs a limit holds stay.
-- Tested by: tests/integration/test_scripts.py, tests/limits/test_fairness.py,
--   tests/limits/test_priority.py

-- Candidate number n was read: note the indexes it leaves (its lane at once).
local function leave_indexes(c, n, id)
  if c.froms[n] then
    local from_due = c.from_due
    from_due[#from_due + 1] = id
    if c.prio then c.from_prio[#c.from_prio + 1] = id end
    local lane = c.lane_of[id]
    if lane then
      redis.call('ZREM', lane, id)
      c.from_lane[#c.from_lane + 1] = id
    elseif c.lanes then  -- laned once, but met in due order (its lane was gone): tidy up
      c.from_lane[#c.from_lane + 1] = id
    end
  else
    c.from_retry[#c.from_retry + 1] = id
  end
end

local function write_indexes(c)
  local keys = c.keys
  if #c.from_due > 0 then redis.call('ZREM', c.due_key, unpack(c.from_due)) end
  if #c.from_retry > 0 then redis.call('ZREM', c.retry_key, unpack(c.from_retry)) end
  if #c.from_prio > 0 then redis.call('ZREM', keys.prio, unpack(c.from_prio)) end
  if #c.from_lane > 0 then redis.call('ZREM', keys.laned, unpack(c.from_lane)) end
  if #c.leased > 0 then
    -- a first lease, or one earlier than the set's head, is told to the reapers
    tell_schedulers(c.sched_wake, 'l', c.partition, c.leases_key, c.until_s)
    redis.call('ZADD', c.leases_key, unpack(c.leased))
  end
end
