-- claim/next_due.lua: the reply's next time worth claiming this partition and queue.
-- Tested by: tests/limits/test_rate.py, tests/limits/test_concurrency.py,
--   tests/integration/test_scripts.py

-- The earliest time in the set `key` (-1: none), read after this call's writes; or, when the
-- call read its window full (more due runs may wait behind it, a backlog being drained), "due
-- now" without reading its head: the worker claims again at once, and that call reads the
-- truth. A head read costs a call and a score formatted (bench/RESULTS.md).
local function head_of(c, key, full)
  if full then return c.now end
  local h = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if h[2] then return math.ceil(tonumber(h[2])) end  -- a whole ms (a due time may not be)
  return -1
end

-- The earliest due or retry time left (-1: none), or, when runs a limit holds are still at
-- the head, when a limit may free (at most 1 s away), so the worker sleeps instead of
-- spinning.
local function next_due(c)
  local nxt = head_of(c, c.due_key, c.due_full)
  local nr = head_of(c, c.retry_key, c.retry_full)
  if nr ~= -1 and (nxt == -1 or nr < nxt) then nxt = nr end
  if c.free_at and c.taken < c.limit and nxt ~= -1 and nxt <= c.horizon then
    nxt = math.max(math.min(c.free_at, c.now + 1000), c.now + 1)
  end
  return nxt
end
