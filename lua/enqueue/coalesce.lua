-- enqueue/coalesce.lua: debounce and throttle by key, enqueue.lua's step for the runs enqueued
-- with key= and debounce= or throttle= (docs/debounce.md).
-- Tested by: tests/workloads/test_debounce.py, tests/workloads/test_throttle.py
-- Such a run's own fields start with its mode (the client puts them first, so a plain run
-- costs one comparison): 'debounce', ms, 'max_wait', ms (0: none) or 'throttle', ms; they
-- stay on the run's record. The key's current run is T:coalesce '<task>\n<key>' -> run id, in
-- the key's partition (the client pins the run's id there, or to its tenant's partition).
-- - debounce: while the current run waits (scheduled, never started: fence 0, same queue), a
--   new enqueue replaces its payload and moves its due time to now + debounce, never past
--   its first enqueue (`created`) + max_wait; once it started, the next enqueue creates a run.
-- - throttle: the first enqueue of a window creates the run; until created + throttle, later
--   enqueues land on it, whatever its state.
-- A joined run counts the later enqueues that landed on it (field `joined`).

-- The mode of the run at ARGV[i] with nf own fields: 'debounce', 'throttle' or nil (plain).
local function coalesce_mode(i, nf)
  if nf < 2 then return nil end
  local f = ARGV[i + 4]
  if f == 'debounce' or f == 'throttle' then return f end
  return nil
end

-- The value of field `name` among the run's own fields (nil if absent).
local function own_field(i, nf, name)
  for j = i + 4, i + 3 + nf, 2 do
    if ARGV[j] == name then return ARGV[j + 1] end
  end
  return nil
end

-- A debounced run that is still waiting: its payload replaced, its due time moved in every
-- index it waits in (a run created earlier in this call is not in the due set yet: its score
-- in `added`, written after the loop, is moved instead).
local function debounce_join(co, cur, f, i, nf, now)
  local due = now + tonumber(ARGV[i + 5])
  local max_wait = tonumber(ARGV[i + 7]) or 0
  if max_wait > 0 then due = math.min(due, tonumber(f[3]) + max_wait) end
  local due_s = int_s(due)
  local run_key = co.prefix .. K.run .. cur
  redis.call('HSET', run_key, 'payload', own_field(i, nf, 'payload'), 'due', due_s)
  if co.at[cur] then
    co.added[co.at[cur]] = due_s
  else
    redis.call('ZADD', co.due_key, 'XX', due_s, cur)
  end
  if f[4] then redis.call('ZADD', co.prio_key, 'XX', -tonumber(f[4]) * 1e13 + due, cur) end
  redis.call('ZADD', co.prefix .. K.lane .. co.queue .. '|' .. (f[5] or ''), 'XX', due_s, cur)
  redis.call('ZADD', co.laned_key, 'XX', due_s, cur)
end

-- Where the coalesced run at ARGV[i] lands: nil to create it (it becomes the key's current
-- run, see coalesce_created), or the id of the key's current run it joined.
local function coalesce(co, mode, i, nf, now)
  co.slot = co.task .. '\n' .. (own_field(i, nf, 'key') or '')
  local cur = redis.call('HGET', co.hash, co.slot)
  if not cur then return nil end
  local f = run_fields(co.prefix .. K.run .. cur, 'state', 'fence', 'created', 'priority',
                       'tenant', 'queue')
  if not f or not f[3] then return nil end  -- gone or damaged: a new run
  if mode == 'throttle' then
    if now >= tonumber(f[3]) + tonumber(ARGV[i + 5]) then return nil end
  else
    if f[1] ~= 'scheduled' or (f[2] and f[2] ~= '0') or (f[6] or RUN_DEFAULTS.queue) ~= co.queue then
      return nil
    end
    debounce_join(co, cur, f, i, nf, now)
  end
  redis.call('HINCRBY', co.prefix .. K.run .. cur, 'joined', 1)
  return cur
end

-- A coalesced run created by this call: the key's current run from now on; `pos` is its due
-- score's place in `added`.
local function coalesce_created(co, run_id, pos)
  redis.call('HSET', co.hash, co.slot, run_id)
  co.at[run_id] = pos
end
