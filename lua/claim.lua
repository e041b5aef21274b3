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
-- KEYS[7] dead zset    T:dead              KEYS[8] limits hash  T:limits
-- KEYS[9] priority index T:prio:<queue> (runs enqueued with a priority: taken first once due;
--         an entry whose run is no longer waiting in the due set is dropped here)
-- KEYS[10] lanes zset T:lanes:<queue>   KEYS[11] laned zset T:laned:<queue>
-- Tenant lanes (docs/fairness.md): when the queue has lanes here, runs are taken round-robin
-- from the lanes T:lane:<queue>|<tenant>, least recently served tenant first, an equal share
-- of the batch each; the due-order path then skips laned runs (retries, releases, replays and
-- schedule runs are not laned and keep their due order).
-- ARGV[1] partition prefix 'ns:{tag}:' -- per-run keys (run hash) and per-schedule keys
--         (schedule hash, its running set) are built from it; they carry the same hash tag,
--         so they live in this partition's slot
-- ARGV[2] worker id    ARGV[3] max runs to claim    ARGV[4] lease ms
-- ARGV[5] claim-ahead ms (optional, default 0): runs due up to this far ahead are claimed too;
--         the worker starts each at its due time (the reply carries it), never before, so a
--         start is not delayed by the claim's round trip. Attempt start = max(now, due).
-- ARGV[6] scheduler wake channel   ARGV[7] partition index (a first lease, or one earlier than
--         the set's head, is told to the reapers, which sleep until the earliest expiry)
-- ARGV[8] queue name (the limits of a queue are looked up by it)
-- Limits (docs/fairness.md): when T:limits exists (one EXISTS when none is set: the hot path),
-- each candidate is checked against the concurrency and rate limits of its tenant, queue and
-- task before it is claimed. A run held back stays in its set, records `limited_by`, and the
-- reply's next time is when a limit may let it through (a slot's lease expiry or the next
-- token, at most 1 s away), so the worker sleeps instead of spinning. Concurrency slots are
-- T:limrun:<scope> entries scored with the lease expiry: the scripts that end an attempt free
-- them (run field `held`), and an entry whose lease has gone (a SIGKILLed worker) is pruned
-- here, so a slot can never leak past its lease.
-- A run with a pending cancel request (its worker died before honouring it) is cancelled.
-- A run record without a known state, or marked running without a lease, is dead-lettered
-- with the reason (never dropped); an index entry whose record is gone, or is in another
-- state, is stale and only removed.
-- Returns {next_due_ms or -1, missed, skipped, held_concurrency, held_rate, run fields...}:
-- 12 fields per run (see common/transitions.py). next_due_ms is the earliest due/retry time
-- left in this partition and queue (or when a limit frees); missed/skipped count the runs
-- this call finished instead of starting; held_* count runs a limit held back for the first
-- time (per limit).
local due_key, retry_key, leases_key, done_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local deadlines_key, events_key, dead_key = KEYS[5], KEYS[6], KEYS[7]
local prefix, worker = ARGV[1], ARGV[2]
local limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local horizon = now + (tonumber(ARGV[5]) or 0)
-- numbers sent to Redis as strings built once per call, not once per run (see int_s)
local now_s, until_s = int_s(now), int_s(now + lease)
local queue = ARGV[8] or ''

-- the limits of this partition, the queue's priority runs and tenant lanes, if any: one
-- EXISTS when there are none (the hot path)
local lims, prio, lanes = nil, false, false
local scan = limit
if redis.call('EXISTS', KEYS[8], KEYS[9], KEYS[10]) > 0 then
  prio = redis.call('EXISTS', KEYS[9]) == 1
  lanes = redis.call('EXISTS', KEYS[10]) == 1
  if redis.call('EXISTS', KEYS[8]) == 1 then
    lims = {}
    local flat = redis.call('HGETALL', KEYS[8])
    for x = 1, #flat, 2 do lims[flat[x]] = flat[x + 1] end
    scan = limit + 32  -- look past runs a limit holds back (HELD_SCAN), to others that may start
  end
end

local d = redis.call('ZRANGE', due_key, '-inf', horizon, 'BYSCORE', 'LIMIT', 0, scan, 'WITHSCORES')
local r = redis.call('ZRANGE', retry_key, '-inf', horizon, 'BYSCORE', 'LIMIT', 0, scan,
  'WITHSCORES')

-- priority runs first: highest priority, then earliest due, among those due by the horizon
local ids, froms, scores, i, j = {}, {}, {}, 1, 1
local seen, from_prio, from_lane = {}, {}, {}
if prio then
  local stale = {}
  for _, id in ipairs(redis.call('ZRANGE', KEYS[9], 0, scan * 2 + 31)) do
    local due = tonumber(redis.call('ZSCORE', due_key, id))
    if not due or redis.call('HGET', prefix .. K.run .. id, 'state') ~= 'scheduled' then
      stale[#stale + 1] = id  -- claimed, retried, cancelled, held by its schedule: gone
    elseif due <= horizon then
      local n = #ids + 1
      ids[n], froms[n], scores[n], seen[id] = id, true, int_s(due), true
      if n >= scan then break end
    end
  end
  if #stale > 0 then redis.call('ZREM', KEYS[9], unpack(stale)) end
end
-- then the tenant lanes, round-robin
local lane_of = {}  -- run id -> its lane key, for runs taken from a lane
local skip = seen
if lanes then
  local tenants = redis.call('ZRANGE', KEYS[10], 0, 31)
  -- each tenant's share of this batch, by weight (T:limits 'tenant:<name>:w', default 1)
  local weights, total = {}, 0
  for x, t in ipairs(tenants) do
    weights[x] = (lims and tonumber(lims['tenant:' .. t .. ':w'])) or 1
    total = total + weights[x]
  end
  local want = math.max(limit - #ids, 1)
  local served, picked, most = {}, {}, 0
  for x, t in ipairs(tenants) do
    local lane = prefix .. K.lane .. queue .. '|' .. t
    local quantum = math.max(1, math.ceil(want * weights[x] / total))
    local got = redis.call('ZRANGE', lane, '-inf', horizon, 'BYSCORE', 'LIMIT', 0, quantum,
      'WITHSCORES')
    if #got == 0 then
      if redis.call('EXISTS', lane) == 0 then redis.call('ZREM', KEYS[10], t) end
    else
      served[#served + 1] = now_s
      served[#served + 1] = t
      picked[#picked + 1] = {lane, got}
      if #got > most then most = #got end
    end
  end
  -- interleaved (first of each lane, then second, ...), so a batch smaller than the shares
  -- still splits fairly; a lane entry whose run left the due set (cancelled, say) is met
  -- below like any stale index entry, and removed from its lane there
  for x = 1, most, 2 do
    for _, lg in ipairs(picked) do
      local id = lg[2][x]
      if id and not seen[id] and #ids < scan then
        local n = #ids + 1
        ids[n], froms[n], scores[n], seen[id], lane_of[id] = id, true, lg[2][x + 1], true, lg[1]
      end
    end
  end
  if #served > 0 then redis.call('ZADD', KEYS[10], unpack(served)) end
  -- laned runs wait for their lane: the due-order path below passes them by
  if #d > 0 then
    local ds = {}
    for x = 1, #d, 2 do ds[#ds + 1] = d[x] end
    local sc = redis.call('ZMSCORE', KEYS[11], unpack(ds))
    skip = {}
    for id in pairs(seen) do skip[id] = true end
    for x = 1, #ds do if sc[x] then skip[ds[x]] = true end end
  end
end
-- then merge the two sorted lists, earliest first (parallel arrays: no table per run)
local check = prio or lanes
while #ids < scan and (i <= #d or j <= #r) do
  local n = #ids + 1
  if j > #r or (i <= #d and tonumber(d[i + 1]) <= tonumber(r[j + 1])) then
    if not (check and skip[d[i]]) then ids[n], froms[n], scores[n] = d[i], true, d[i + 1] end
    i = i + 2
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

-- Limit state, read once per call and per scope. conc[scope] = {max, count, key, hold told}
-- or false (no concurrency limit); bucket[scope] = {tokens, rate per ms, burst, key, taken}
-- or false (no rate limit).
local HELD_SCAN = 32  -- the `scan` window above is limit + HELD_SCAN
local NONE = {}  -- the fields of a held run: none read
local conc, bucket, free_at = {}, {}, nil
local held_c, held_r = 0, 0

local function hold_until(t)
  if free_at == nil or t < free_at then free_at = t end
end

local function conc_of(scope)
  local c = conc[scope]
  if c ~= nil then return c end
  local max = tonumber(lims[scope .. ':c'])
  if not max then conc[scope] = false; return false end
  local key = prefix .. K.limrun .. scope
  -- entries past their lease hint: kept (re-scored) while the run's lease lives, else freed
  for _, m in ipairs(redis.call('ZRANGE', key, '-inf', now, 'BYSCORE')) do
    local ls = tonumber(redis.call('ZSCORE', leases_key, m))
    if ls and ls > now then redis.call('ZADD', key, ls, m) else redis.call('ZREM', key, m) end
  end
  c = {max, redis.call('ZCARD', key), key}
  conc[scope] = c
  return c
end

local function bucket_of(scope)
  local b = bucket[scope]
  if b ~= nil then return b end
  local spec = lims[scope .. ':r']
  if not spec then bucket[scope] = false; return false end
  local rate, burst = string.match(spec, '^(%S+) (%S+)$')
  rate, burst = tonumber(rate), tonumber(burst)
  if not rate or not burst or rate <= 0 then bucket[scope] = false; return false end
  local key = prefix .. K.bucket .. scope
  local st = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens, ts = tonumber(st[1]), tonumber(st[2])
  if not tokens or not ts then tokens, ts = burst, now end
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  b = {tokens, rate, burst, key, false}
  bucket[scope] = b
  return b
end

-- The scopes a run is limited by: its tenant, this queue, its task.
local function scopes_of(tenant, task)
  local s = {'queue:' .. queue, 'task:' .. (task or '')}
  if tenant and tenant ~= '' then s[3] = 'tenant:' .. tenant end
  return s
end

-- nil when every limit lets the run start now, else the limit that holds it back
-- ('tenant:acme:concurrency') and its kind ('c' or 'r').
local function blocked_by(scopes)
  for _, scope in ipairs(scopes) do
    local c = conc_of(scope)
    if c and c[2] >= c[1] then
      if not c[4] then  -- once per scope: its earliest slot expiry
        local first = redis.call('ZRANGE', c[3], 0, 0, 'WITHSCORES')
        c[4] = true
        hold_until(tonumber(first[2]) or (now + 1000))
      end
      return scope .. ':concurrency', 'c'
    end
    local b = bucket_of(scope)
    if b and b[1] < 1 then
      hold_until(now + math.ceil((1 - b[1]) / b[2]))
      return scope .. ':rate', 'r'
    end
  end
  return nil
end

-- The run starts: take a slot of each concurrency limit and a token of each rate limit.
-- Returns the concurrency scopes it holds (freed when the attempt ends), space separated.
local function take(scopes, id)
  local held = ''
  for _, scope in ipairs(scopes) do
    local c = conc[scope]
    if c then
      c[2] = c[2] + 1
      redis.call('ZADD', c[3], until_s, id)
      held = held .. (held == '' and '' or ' ') .. scope
    end
    local b = bucket[scope]
    if b then b[1] = b[1] - 1; b[5] = true end
  end
  return held
end

local out = {-1, 0, 0, 0, 0}
local leased, from_due, from_retry = {}, {}, {}
local taken, held_n = 0, 0
for n, id in ipairs(ids) do
  -- past HELD_SCAN held runs in one call, the rest waits for the next (bounded cost while a
  -- limit is full; other partitions are not affected, see docs/fairness.md)
  if taken >= limit or held_n >= HELD_SCAN then break end
  local run_key = prefix .. K.run .. id
  local why, kind, scopes = nil, nil, nil
  if lims then
    -- a light read first: a run a limit holds back costs five short fields
    local g = redis.call('HMGET', run_key, 'state', 'tenant', 'task', 'limited_by',
      'cancel_requested')
    if (g[1] == 'scheduled' or g[1] == 'retrying') and not g[5] then
      scopes = scopes_of(g[2], g[3])
      why, kind = blocked_by(scopes)
    end
    if why then
      held_n = held_n + 1
      -- it stays in its set; say which limit held it (counted once per run and limit)
      if g[4] ~= why then
        redis.call('HSET', run_key, 'limited_by', why)
        if kind == 'c' then held_c = held_c + 1 else held_r = held_r + 1 end
      end
    end
  end
  local f, state = NONE, nil
  if not why then
    f = redis.call('HMGET', run_key, 'state', 'deadline', 'schedule', 'overlap', 'fence',
      'attempt', 'task', 'payload', 'due', 'timeout', 'idempotent', 'key', 'cancel_requested',
      'limited_by')
    state = f[1]
    if froms[n] then
      from_due[#from_due + 1] = id
      if prio then from_prio[#from_prio + 1] = id end
      if lane_of[id] then
        redis.call('ZREM', lane_of[id], id)
        from_lane[#from_lane + 1] = id
      elseif lanes then  -- laned once, but met in due order (its lane was gone): tidy up
        from_lane[#from_lane + 1] = id
      end
    else from_retry[#from_retry + 1] = id end
  end
  local deadline, sched = tonumber(f[2]), f[3]
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
      taken = taken + 1
      fence, attempt = fence + 1, attempt + 1
      local fence_s = int_s(fence)
      -- claimed ahead of its due time: the attempt starts at the due time (the score)
      local started = now_s
      if tonumber(scores[n]) > now then started = scores[n] end
      local held = scopes and take(scopes, id) or ''
      if held == '' then
        redis.call('HSET', run_key, 'state', 'running', 'fence', fence_s, 'attempt',
          int_s(attempt), 'worker', worker, 'started', started)
      else  -- the concurrency slots it took, freed when the attempt ends
        redis.call('HSET', run_key, 'state', 'running', 'fence', fence_s, 'attempt',
          int_s(attempt), 'worker', worker, 'started', started, 'held', held)
      end
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
      out[o + 12] = f[14] or ''
    end
  elseif why then
    -- held back by a limit (above): left where it is
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
if #from_prio > 0 then redis.call('ZREM', KEYS[9], unpack(from_prio)) end
if #from_lane > 0 then redis.call('ZREM', KEYS[11], unpack(from_lane)) end
if #leased > 0 then
  tell_schedulers(ARGV[6], 'l', ARGV[7], leases_key, until_s)
  redis.call('ZADD', leases_key, unpack(leased))
end

for _, b in pairs(bucket) do
  if b and b[5] then
    redis.call('HSET', b[4], 'tokens', tostring(b[1]), 'ts', now_s)
    -- an idle bucket is full again after burst / rate: it may vanish then
    redis.call('PEXPIRE', b[4], math.ceil(b[3] / b[2]) + 1000)
  end
end

local nd = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
local nr = redis.call('ZRANGE', retry_key, 0, 0, 'WITHSCORES')
local nxt = -1
if nd[2] then nxt = tonumber(nd[2]) end
if nr[2] and (nxt == -1 or tonumber(nr[2]) < nxt) then nxt = tonumber(nr[2]) end
if free_at and taken < limit and nxt ~= -1 and nxt <= horizon then
  -- runs a limit holds back are still at the head: come back when a limit may free (a call
  -- that filled its batch says "due now" instead: others may be claimable behind them)
  nxt = math.max(math.min(free_at, now + 1000), now + 1)
end
out[1] = nxt
out[3] = skipped
out[4] = held_c
out[5] = held_r
return out
