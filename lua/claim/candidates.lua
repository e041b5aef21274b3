-- claim/candidates.lua: which runs a claim looks at, in order. Candidates are parallel arrays
-- of `c` (no table per run): c.ids[n], c.froms[n] (true: from the due set, false: from the
-- retry set), c.scores[n] (when it became claimable); c.seen[id] marks a run already taken.
-- Priority runs come first, then the tenant lanes (claim/lanes.lua), then the due and retry
-- sets merged in due order. The window is the batch, plus HELD_SCAN when limits are set.
-- Tested by: tests/integration/test_scripts.py, tests/limits/test_admission.py,
--   tests/limits/test_priority.py, tests/integration/test_queue_pause.py

-- What this partition and queue have besides plain runs: limits, priority runs, tenant lanes,
-- a pause, rate-limit holds.
-- Nothing to read when none of their keys exists (c.options, one EXISTS: the hot path).
local function read_options(c)
  local keys = c.keys
  if not c.options then return end
  -- a paused queue (T:paused, duetime queue pause): nothing else is read, nothing claimed
  if redis.call('HGET', keys.paused, c.queue) then c.paused = true; return end
  c.prio = redis.call('EXISTS', keys.prio) == 1
  c.lanes = redis.call('EXISTS', keys.lanes) == 1
  if redis.call('EXISTS', keys.limits) == 1 then
    c.lims = read_limits(keys.limits)
    c.scan = c.limit + HELD_SCAN  -- look past runs a limit holds back, to others that may start
  end
  if read_holds(c) and not c.lims then c.lims = {}; c.scan = c.limit + HELD_SCAN end
end

-- A due or retry score of +inf (edited by hand) would never come due: the run's own time (its
-- `due`, or `retry_at`) is put back, now when that is unreadable, and the events name the key.
-- One ZCOUNT per set finds none on the hot path; the repair's writes (an event) wait for the
-- partition's other indexes to be checked (rare_keys_damaged): a damaged one refuses the call.
local function repair_unending(c)
  for _, pair in ipairs({{c.due_key, 'due'}, {c.retry_key, 'retry_at'}}) do
    local key, field = pair[1], pair[2]
    if redis.call('ZCOUNT', key, '+inf', '+inf') > 0 then
      local bad = rare_keys_damaged(c)
      if bad then return bad end
      for _, id in ipairs(redis.call('ZRANGE', key, '+inf', '+inf', 'BYSCORE', 'LIMIT', 0, 16)) do
        local t = redis.pcall('HGET', c.prefix .. K.run .. id, field)
        redis.call('ZADD', key, num(t) or c.now, id)
        emit(c.events_key, id, 'due_repaired', 'score +inf in ' .. key)
      end
    end
  end
  return nil
end

-- The heads of the due and retry sets: flat {id, score, ...} lists of up to c.scan runs due by
-- the horizon, or nil and the refusal when one of them is not a zset (its first read is its
-- type check: nothing was written yet). A window read full (c.due_full, c.retry_full) may
-- have more due runs behind it: next_due then answers "due now" without reading the head.
local function due_windows(c)
  local d = redis.pcall('ZRANGE', c.due_key, '-inf', c.horizon_s, 'BYSCORE', 'LIMIT', 0, c.scan,
    'WITHSCORES')
  if d.err then return nil, nil, damaged_reply(c.due_key, 'zset') end
  local r = redis.pcall('ZRANGE', c.retry_key, '-inf', c.horizon_s, 'BYSCORE', 'LIMIT', 0,
    c.scan, 'WITHSCORES')
  if r.err then return nil, nil, damaged_reply(c.retry_key, 'zset') end
  c.due_full, c.retry_full = #d >= 2 * c.scan, #r >= 2 * c.scan
  return d, r, nil
end

-- Priority runs (T:prio:<queue>, score -priority x 10^13 + due): highest priority, then
-- earliest due, among those due by the horizon. The index window is twice the scan plus
-- HELD_SCAN entries; an entry whose run no longer waits in the due set is dropped.
local function priority_candidates(c)
  local ids, froms, scores, seen = c.ids, c.froms, c.scores, c.seen
  local stale = {}
  for _, id in ipairs(redis.call('ZRANGE', c.keys.prio, 0, c.scan * 2 + HELD_SCAN - 1)) do
    local due_s = redis.call('ZSCORE', c.due_key, id)  -- its text: a fraction of a ms kept
    local due = tonumber(due_s)
    if not due or redis.call('HGET', c.prefix .. K.run .. id, 'state') ~= 'scheduled' then
      stale[#stale + 1] = id  -- claimed, retried, cancelled, held by its schedule: gone
    elseif due <= c.horizon then
      local n = #ids + 1
      ids[n], froms[n], scores[n], seen[id] = id, true, due_s, true
      if n >= c.scan then break end
    end
  end
  if #stale > 0 then redis.call('ZREM', c.keys.prio, unpack(stale)) end
end

-- How many laned runs the due-order path reads past, per call, to the unlaned runs behind them
-- (retries are in their own set; releases, replays, schedule runs share the due set with the
-- laned runs): past the first window it reads the due set on, a window at a time.
local LANED_PASS = 256

-- The next window of the due set, after `offset` entries, and its laned runs marked in `skip`
-- (a fresh table: the lanes' own `seen` is not written to).
local function due_window_after(c, offset, skip)
  local d = redis.call('ZRANGE', c.due_key, '-inf', c.horizon, 'BYSCORE', 'LIMIT', offset,
    c.scan, 'WITHSCORES')
  if #d > 0 then
    local ds = {}
    for x = 1, #d, 2 do ds[#ds + 1] = d[x] end
    local sc = redis.call('ZMSCORE', c.keys.laned, unpack(ds))
    for x = 1, #ds do if sc[x] then skip[ds[x]] = true end end
  end
  return d
end

-- The due and retry windows merged, earliest first, after the runs taken already; runs in
-- `skip` (taken, or waiting in a lane) are passed by. With lanes, a window whose laned runs
-- were passed by does not end the due order: the next window is read (up to LANED_PASS laned
-- runs passed in all), so an unlaned run behind laned ones (a release, say, due in the same
-- millisecond as a tenant's runs) is not left out of a claim that is not full.
local function due_order_candidates(c, d, r, skip)
  local ids, froms, scores, scan = c.ids, c.froms, c.scores, c.scan
  local check = c.prio or c.lanes
  local i, j, offset, passed = 1, 1, #d / 2, 0
  while #ids < scan do
    if i > #d and c.lanes and #d == 2 * c.scan and passed > 0 and passed < LANED_PASS then
      if skip == c.seen then  -- never written to: a set of its own
        local own = {}
        for id in pairs(skip) do own[id] = true end
        skip = own
      end
      d, i = due_window_after(c, offset, skip), 1
      offset = offset + #d / 2
    end
    if i > #d and j > #r then break end
    local n = #ids + 1
    if j > #r or (i <= #d and tonumber(d[i + 1]) <= tonumber(r[j + 1])) then
      if not (check and skip[d[i]]) then
        ids[n], froms[n], scores[n] = d[i], true, d[i + 1]
      elseif c.lanes then
        passed = passed + 1
      end
      i = i + 2
    else
      ids[n], froms[n], scores[n] = r[j], false, r[j + 1]; j = j + 2
    end
  end
end
