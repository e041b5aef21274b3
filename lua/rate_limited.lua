#!lua
-- rate_limited.lua: a run whose task raised RateLimited(retry_after, scope) goes back to its
-- queue without spending an attempt (the claim's increment is undone, as release.lua does),
-- due at now + retry_after, and the scope's hold in this partition's T:holds is raised to the
-- same time: claim.lua admits no other run of that task, queue or tenant here until then (an
-- HTTP 429 pauses the work that would hit the same limit, not just this run).
-- The worker sends the same call with no run id to every other partition for a task or queue
-- scope (a tenant's runs live in its home partition): there it only raises the hold.
-- Tested by: tests/workloads/test_rate_limited.py
-- KEYS[1] leases zset   KEYS[2] due zset (the run's queue)   KEYS[3] events
-- KEYS[4] holds hash T:holds (scope -> until ms)
-- ARGV[1] partition prefix 'ns:{tag}:' (the run's hash and attempts are built from it)
-- ARGV[2] run id ('' = raise the hold only)   ARGV[3] fence   ARGV[4] wake channel
-- ARGV[5] partition index   ARGV[6] queue   ARGV[7] retry after ms
-- ARGV[8] scope kind: 'task', 'queue' or 'tenant'   ARGV[9] the scope's name ('' = the run's
--         own task, queue or tenant; a run without a tenant holds only itself)
-- ARGV[10] worker id
-- A hold is only ever raised (a later, shorter RateLimited does not shorten it); an entry
-- past its time is ignored by the claim and dropped there.
-- Returns (status) 'rate_limited' (with a run id: given back; without: hold raised), 'stale'
-- or 'missing'.
local leases_key, due_key, events_key, holds_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = damaged_index({holds_key, 'hash'})
if bad then return bad end
local prefix, run_id, fence = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local until_ms = now + math.max(tonumber(ARGV[7]) or 0, 0)
local kind, name = ARGV[8], ARGV[9]

local function hold(scope_name)
  if not scope_name or scope_name == '' then return end
  local scope = kind .. ':' .. scope_name
  local cur = tonumber(redis.call('HGET', holds_key, scope))
  if not cur or cur < until_ms then redis.call('HSET', holds_key, scope, int_s(until_ms)) end
end

if run_id == '' then
  hold(name)
  return 'rate_limited'
end

local run_key = prefix .. K.run .. run_id
local f, status = take_back(prefix, leases_key, run_key, run_id, fence, ARGV[4], ARGV[5],
  ARGV[6], now, 'schedule', 'attempt', 'worker', 'started', 'task', 'tenant', 'rate_limited')
if not f then return status end
step_out_of_schedule(prefix, f[3], run_id)  -- it will run again
if name == '' then
  if kind == 'task' then name = f[7] elseif kind == 'queue' then name = ARGV[6]
  else name = f[8] end
end
hold(name)
local scope = kind .. ':' .. (name or '')
push_attempt(prefix .. K.attempts .. run_id, f[4], fence, f[5], f[6], 'rate_limited', now,
  'rate limited: ' .. scope .. ' held for ' .. int_s(until_ms - now) .. ' ms')
redis.call('HSET', run_key, 'state', 'scheduled', 'limited_by', scope .. ':held',
  'attempt', int_s(math.max((tonumber(f[4]) or 1) - 1, 0)),
  'rate_limited', int_s((tonumber(f[9]) or 0) + 1))
add_due(due_key, until_ms, run_id, ARGV[4], ARGV[5], ARGV[6])
emit(events_key, run_id, 'rate_limited', scope)
return 'rate_limited'
