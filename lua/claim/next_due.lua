-- claim/next_due.lua: the reply's next time worth claiming this partition and queue.
-- Tested by: tests/limits/test_rate.py, tests/limits/test_concurrency.py

-- The earliest due or retry time left (-1: none), or, when runs a limit holds are still at
-- the head, when a limit may free (at most 1 s away), so the worker sleeps instead of
-- spinning. A call that filled its batch says "due now" instead: others may be claimable
-- behind them.
local function next_due(c)
  local nd = redis.call('ZRANGE', c.due_key, 0, 0, 'WITHSCORES')
  local nr = redis.call('ZRANGE', c.retry_key, 0, 0, 'WITHSCORES')
  local nxt = -1
  if nd[2] then nxt = tonumber(nd[2]) end
  if nr[2] and (nxt == -1 or tonumber(nr[2]) < nxt) then nxt = tonumber(nr[2]) end
  if c.free_at and c.taken < c.limit and nxt ~= -1 and nxt <= c.horizon then
    nxt = math.max(math.min(c.free_at, c.now + 1000), c.now + 1)
  end
  return nxt
end
