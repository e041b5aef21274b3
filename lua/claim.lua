#!lua
-- claim.lua: move up to N claimable runs of one partition and queue to `running`, each with
-- a new fence token and a lease: its score in the leases zset is the expiry, the run hash's
-- worker and fence say who holds it.
-- Applies, atomically, the starting deadline (-> missed) and the schedule's overlap policy
-- (a schedule and its runs share this partition). The attempt's history entry is written
-- when the attempt ends; while it runs, the run hash holds worker, fence and start.
-- KEYS[1] due zset     T:due:<queue>       KEYS[2] retry zset   T:retry:<queue>
-- KEYS[3] leases zset  T:leases            KEYS[4] done zset    T:done
-- KEYS[5] deadlines    T:deadlines         KEYS[6] events       T:events
-- KEYS[7] dead zset    T:dead
-- ARGV[1] partition prefix 'ns:{tag}:' -- per-run keys (run hash) and per-schedule keys
--         (schedule hash, its running set) are built from it; they carry the same hash tag,
--         so they live in this partition's slot
-- ARGV[2] worker id    ARGV[3] max runs to claim    ARGV[4] lease ms
-- ARGV[5] claim-ahead ms (optional, default 0): runs due up to this far ahead are claimed too;
--         the worker starts each at its due time (the reply carries it), never before, so a
--         start is not delayed by the claim's round trip. Attempt start = max(now, due).
-- ARGV[6] scheduler wake channel   ARGV[7] partition index (a first lease, or one earlier than
--         the set's head, is told to the reapers, which sleep until the earliest expiry)
-- A run with a pending cancel request (its worker died before honouring it) is cancelled.
-- A run record without a known state, or marked running without a lease, is dead-lettered
-- with the reason (never dropped); an index entry whose record is gone, or is in another
-- state, is stale and only removed.
-- Returns {next_due_ms or -1, missed, skipped, run fields...}: 11 fields per run (see
-- common/transitions.py). next_due_ms is the earliest due/retry time left in this partition
-- and queue; missed/skipped count the runs this call finished instead of starting.
local due_key, retry_key, leases_key, done_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local deadlines_key, events_key, dead_key = KEYS[5], KEYS[6], KEYS[7]
local prefix, worker = ARGV[1], ARGV[2]
local limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local horizon = now + (tonumber(ARGV[5]) or 0)
-- numbers sent to Redis as strings built once per call, not once per run (see int_s)
local now_s, until_s = int_s(now), int_s(now + lease)

local d = redis.call('ZRANGE', due_key, '-inf', horizon, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
local r = redis.call('ZRANGE', retry_key, '-inf', horizon, 'BYSCORE', 'LIMIT', 0, limit,
  'WITHSCORES')

-- merge the two sorted lists, earliest first (parallel arrays: no table per run)
local ids, froms, scores, i, j = {}, {}, {}, 1, 1
while #ids < limit and (i <= #d or j <= #r) do
  local n = #ids + 1
  if j > #r or (i <= #d and tonumber(d[i + 1]) <= tonumber(r[j + 1])) then
    ids[n], froms[n], scores[n] = d[i], true, d[i + 1]; i = i + 2
  else
    ids[n], froms[n], scores[n] = r[j], false, r[j + 1]; j = j + 2
  end
end

local skipped = 0

-- The overlap policy of a scheduled run; returns true when the run may start now.
local function overlap_allows(id, run_key, sched, overlap)
  if overlap == 'allow' or overlap == '' then return true end  -- nothing to track
  local running = prefix .. K.sched_running .. sched
  if redis.call('SCARD', running) == 0 then
    redis.call('SADD', running, id)
    return true
  end
  if overlap == 'skip' then
    finish_unstarted(prefix, id, 'skipped', 'overlap: previous run still running', now,
      done_key, deadlines_key, events_key)
    skipped = skipped + 1
    return false
  end
  -- buffer_one / cancel_other: wait (out of the due set) until the running one has left
  local sched_key = prefix .. K.sched .. sched
  local buffered = redis.call('HGET', sched_key, 'buffered')
  if buffered and buffered ~= '' and buffered ~= id then
    finish_unstarted(prefix, id, 'skipped', 'overlap: a run is already buffered', now,
      done_key, deadlines_key, events_key)
    skipped = skipped + 1
    return false
  end
  redis.call('HSET', sched_key, 'buffered', id)
  emit(events_key, id, 'buffered', overlap)
  if overlap == 'cancel_other' then
    for _, other in ipairs(redis.call('SMEMBERS', running)) do
      redis.call('HSET', prefix .. K.run .. other, 'cancel_requested', now)
      emit(events_key, other, 'cancel_requested', 'overlap: cancel_other by ' .. id)
    end
  end
  return false
end

local out = {-1, 0, 0}
local leased, from_due, from_retry = {}, {}, {}
for n, id in ipairs(ids) do
  if froms[n] then from_due[#from_due + 1] = id else from_retry[#from_retry + 1] = id end
  local run_key = prefix .. K.run .. id
  local f = redis.call('HMGET', run_key, 'state', 'deadline', 'schedule', 'overlap', 'fence',
    'attempt', 'task', 'payload', 'due', 'timeout', 'idempotent', 'key', 'cancel_requested')
  local state, deadline, sched = f[1], tonumber(f[2]), f[3]
  local fence, attempt = tonumber(f[5]) or 0, tonumber(f[6]) or 0
  if fence > 0 then deadline = nil end  -- a starting deadline: retries are not late starts
  if state == 'scheduled' or state == 'retrying' then
    if f[13] then
      finish_unstarted(prefix, id, 'cancelled', 'cancel requested before it could run again', now,
        done_key, deadlines_key, events_key)
    elseif deadline and deadline > 0 and now > deadline then
      finish_unstarted(prefix, id, 'missed', 'not started before its starting deadline', now,
        done_key, deadlines_key, events_key)
      out[2] = out[2] + 1
    elseif not sched or sched == '' or overlap_allows(id, run_key, sched, f[4] or '') then
      fence, attempt = fence + 1, attempt + 1
      local fence_s = int_s(fence)
      -- claimed ahead of its due time: the attempt starts at the due time (the score)
      local started = now_s
      if tonumber(scores[n]) > now then started = scores[n] end
      redis.call('HSET', run_key, 'state', 'running', 'fence', fence_s, 'attempt', int_s(attempt),
        'worker', worker, 'started', started)
      if deadline then redis.call('ZREM', deadlines_key, id) end
      leased[#leased + 1] = until_s
      leased[#leased + 1] = id
      local o = #out
      out[o + 1] = id
      out[o + 2] = fence
      out[o + 3] = attempt
      out[o + 4] = f[7] or ''
      out[o + 5] = f[8] or ''
      out[o + 6] = f[9] or ''
      out[o + 7] = f[10] or ''
      out[o + 8] = f[11] or ''
      out[o + 9] = f[12] or ''
      out[o + 10] = sched or ''
      out[o + 11] = scores[n]
    end
  elseif state == 'running' and not redis.call('ZSCORE', leases_key, id) then
    -- waiting in a due set, yet marked running with no lease: nothing would ever finish or
    -- recover it (a state written by hand); claimed running runs always hold a lease
    dead_letter(prefix, run_key, dead_key, events_key, id, now,
      'run record damaged: state running, but it holds no lease')
  elseif not STATES[state] then
    if redis.call('EXISTS', run_key) == 1 then
      dead_letter(prefix, run_key, dead_key, events_key, id, now,
        'run record damaged: state ' .. tostring(state or '(missing)') .. ' is not a run state')
    end
  end
  -- any other state: a stale index entry (cancelled, deleted); it is removed below
end
if #from_due > 0 then redis.call('ZREM', due_key, unpack(from_due)) end
if #from_retry > 0 then redis.call('ZREM', retry_key, unpack(from_retry)) end
if #leased > 0 then
  tell_schedulers(ARGV[6], 'l', ARGV[7], leases_key, until_s)
  redis.call('ZADD', leases_key, unpack(leased))
end

local nd = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
local nr = redis.call('ZRANGE', retry_key, 0, 0, 'WITHSCORES')
local nxt = -1
if nd[2] then nxt = tonumber(nd[2]) end
if nr[2] and (nxt == -1 or tonumber(nr[2]) < nxt) then nxt = tonumber(nr[2]) end
out[1] = nxt
out[3] = skipped
return out
