#!lua
-- reap.lua: recovery pass over one partition.
-- 1. Runs whose lease expired (their score in the leases zset is past: the worker died,
--    stalled or lost Redis): the attempt's outcome is recorded as unknown; the run is retried
--    (idempotent task: at once after a first expiry, keeping its place -- scored at the time
--    it became claimable, so it is not queued behind a backlog -- and with backoff after
--    repeated ones), parked as `uncertain` (non-idempotent task: an operator decides) or
--    dead-lettered (no attempts left, or a record too damaged to retry).
-- 2. Runs never started before their starting deadline become `missed`, also when no
--    worker is running to claim them.
-- 3. Retention by state: finished runs past their state's retention are deleted, and
--    finished batches (T:batches, scored by when they finished) with their member index.
-- No `allow-oom` flag: at maxmemory Redis refuses the whole call before it writes anything,
-- so the reaper holds off exactly while heartbeats (allow-oom) are the only writes allowed.
-- Tested by: tests/integration/test_scripts.py, tests/integration/test_workers.py,
--   tests/integration/test_guardrails.py, tests/integration/test_retention.py
-- KEYS[1] leases zset   KEYS[2] dead zset   KEYS[3] uncertain zset   KEYS[4] done zset
-- KEYS[5] deadlines zset                    KEYS[6] events
-- ARGV[1] partition prefix 'ns:{tag}:' -- per-run keys (run hash, attempts, the due/retry set
--         of the run's queue) and schedule keys are built from it; all share this hash tag
-- ARGV[2] max runs per call   ARGV[3] jitter seed in [0,1)
-- ARGV[4] wake channel        ARGV[5] partition index
-- ARGV[6] retention ms of succeeded, cancelled, skipped and missed runs (0 = no retention
--         sweep in this call)   ARGV[7] of dead runs   ARGV[8] of uncertain runs (0 = never):
--         the built-in defaults, under the partition's T:retention table
-- Returns (counts) {expired_leases_handled, missed, deleted, next wake-up ms or -1,
-- auto_paused, examined}: the wake-up is the earliest lease expiry or starting deadline left;
-- auto_paused: schedules this call paused (pause_after_failures, schedule_dead in _lib.lua);
-- examined: finished runs the retention sweep read (deleted or filed).
local leases_key, dead_key, uncertain_key = KEYS[1], KEYS[2], KEYS[3]
local done_key, deadlines_key, events_key = KEYS[4], KEYS[5], KEYS[6]
local prefix, limit, seed = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local channel, partition = ARGV[4], ARGV[5]
local now = now_ms()

local bad = damaged_index({leases_key, 'zset', dead_key, 'zset', uncertain_key, 'zset',
  done_key, 'zset', deadlines_key, 'zset', events_key, 'stream'})
if bad then return bad end

-- a lease score edited to +-inf is no lease: it gets a minute (the holder's next heartbeat
-- puts its own back; a dead holder's run is reaped when that minute is up), said in the events
for _, bound in ipairs({'-inf', '+inf'}) do
  for _, id in ipairs(redis.call('ZRANGE', leases_key, bound, bound, 'BYSCORE', 'LIMIT', 0, limit)) do
    redis.call('ZADD', leases_key, now + 60000, id)
    emit(events_key, id, 'lease_repaired', 'score ' .. bound .. ' in ' .. leases_key)
  end
end

local ids = redis.call('ZRANGE', leases_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
local reaped = 0
local auto_paused = 0
local function dead_occurrence(run_key, id, reason)  -- guardrails: count it on its schedule
  if schedule_dead(prefix, run_key, id, now, reason) then auto_paused = auto_paused + 1 end
end
for n, id in ipairs(ids) do
  local run_key = prefix .. K.run .. id
  -- everything this pass needs is read and checked before the first write
  local f, unreadable = run_fields(run_key, 'state', 'fence', 'idempotent', 'queue', 'attempt',
    'worker', 'started', 'cancel_requested', 'due', 'held')
  redis.call('ZREM', leases_key, id)
  local attempts_key = prefix .. K.attempts .. id
  if unreadable then
    reaped = reaped + 1
    dead_unreadable(dead_key, events_key, id, now, 'lease expired; ' .. unreadable)
  elseif f[1] == 'running' then
    reaped = reaped + 1
    f[4] = f[4] or RUN_DEFAULTS.queue  -- format 3 leaves the default queue out
    local damaged = push_attempt(attempts_key, f[5], f[2], f[6], f[7], 'unknown', now,
      'lease expired')
    if f[10] and free_limits(prefix, run_key, id, f[10]) then
      wake_workers(channel, partition, f[4], now)
    end
    leave_running(prefix, run_key, id, now, channel, partition)
    local attempt = num(f[5])
    if damaged then
      dead_letter(prefix, run_key, dead_key, events_key, id, now, 'lease expired; ' .. damaged)
      dead_occurrence(run_key, id, 'lease expired; ' .. damaged)
    elseif f[8] then
      -- its worker died before honouring a cancel request: the cancel wins over a retry
      redis.call('HSET', run_key, 'state', 'cancelled', 'finished', now,
        'reason', 'cancel requested; the lease expired before the worker stopped it')
      redis.call('ZADD', done_key, now, id)
      emit(events_key, id, 'cancelled', 'lease expired')
      wake_waiters(prefix, run_key, id, 'cancelled')
    elseif f[3] == '0' then
      redis.call('HSET', run_key, 'state', 'uncertain', 'finished', now,
        'reason', 'lease expired; task is not idempotent, outcome unknown')
      redis.call('ZADD', uncertain_key, now, id)
      emit(events_key, id, 'uncertain', 'lease expired')
      wake_waiters(prefix, run_key, id, 'uncertain')
    elseif f[4] == '' or not attempt then
      dead_letter(prefix, run_key, dead_key, events_key, id, now,
        'lease expired; run record ' .. run_key .. ' damaged (queue or attempt unreadable)')
      dead_occurrence(run_key, id, 'lease expired; run record damaged')
    else
      -- the expired lease already made the run wait a lease length: the first expiry is
      -- retried at once, in its old place; repeated ones (a crash loop) back off as failures do
      local jitter = (seed + n * 0.6180339887) % 1
      local delay, from = 0, num(f[9]) or now
      if attempt > 1 then
        local b = redis.call('HMGET', run_key, 'backoff_base', 'backoff_max')
        local base = num(b[1] or RUN_DEFAULTS.backoff_base)
        local cap = num(b[2] or RUN_DEFAULTS.backoff_max)
        if base and cap then delay = backoff_ms(base, cap, attempt - 1, jitter) end
        from = now
      end
      local state = retry_or_dead(prefix, run_key, prefix .. K.retry .. f[4], dead_key, id, now,
        false, delay, jitter, 'lease expired', channel, partition, f[4], from)
      emit(events_key, id, state, 'lease expired')
      if state == 'dead' then
        dead_occurrence(run_key, id, 'lease expired')
      end
    end
  elseif f[1] and not STATES[f[1]] then
    dead_letter(prefix, run_key, dead_key, events_key, id, now,
      'run record ' .. run_key .. ' damaged: state ' .. f[1] .. ' is not a run state')
  elseif not f[1] and redis.call('EXISTS', run_key) == 1 then
    dead_letter(prefix, run_key, dead_key, events_key, id, now,
      'run record ' .. run_key .. ' damaged: no state')
  end
  -- any other state: a stale index entry (the run finished meanwhile); it was removed above
end

-- a starting deadline edited to +-inf: the run record's own deadline is put back (or, without
-- one, the entry goes), said in the events
for _, bound in ipairs({'-inf', '+inf'}) do
  for _, id in ipairs(redis.call('ZRANGE', deadlines_key, bound, bound, 'BYSCORE', 'LIMIT', 0, limit)) do
    local d = redis.pcall('HGET', prefix .. K.run .. id, 'deadline')
    if num(d) then redis.call('ZADD', deadlines_key, d, id) else redis.call('ZREM', deadlines_key, id) end
    emit(events_key, id, 'deadline_repaired', 'score ' .. bound .. ' in ' .. deadlines_key)
  end
end

local missed = 0
for _, id in ipairs(redis.call('ZRANGE', deadlines_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)) do
  local run_key = prefix .. K.run .. id
  local f = run_fields(run_key, 'state', 'queue', 'schedule', 'fence') or {}
  redis.call('ZREM', deadlines_key, id)
  local due_key = prefix .. K.due .. (f[2] or RUN_DEFAULTS.queue)
  if (f[1] == 'scheduled' or f[1] == 'retrying') and (num(f[4]) or 0) == 0
      and not wrong_type(due_key, 'zset') then
    missed = missed + 1
    redis.call('ZREM', due_key, id)
    if f[3] and f[3] ~= '' then
      local sched_key = prefix .. K.sched .. f[3]
      if not wrong_type(sched_key, 'hash') and redis.call('HGET', sched_key, 'buffered') == id then
        redis.call('HDEL', sched_key, 'buffered')
      end
    end
    finish_unstarted(prefix, id, 'missed', 'not started before its starting deadline', now,
      done_key, deadlines_key, events_key)
  end
end

-- 3. Retention by state (common/retention.py): each finished run -- in the done, dead and
-- uncertain indexes -- is examined once, when it comes within the shortest retention of any
-- state: deleted if its own retention (task, then queue, then namespace, then built-in) has
-- passed since it finished, else filed in T:kept at its delete time (never: not filed). A
-- watermark per index (T:swept) keeps runs examined once from being read again, so a call
-- costs at most a batch per index whatever the number of finished runs kept.
local deleted, examined = 0, 0
local short = tonumber(ARGV[6]) or 0
local cfg_key, kept_key, swept_key = prefix .. K.retention, prefix .. K.kept, prefix .. K.swept
if short > 0 and not (wrong_type(cfg_key, 'hash') or wrong_type(kept_key, 'zset')
    or wrong_type(swept_key, 'hash')) then
  local builtin = {succeeded = short, cancelled = short, skipped = short, missed = short,
    dead = tonumber(ARGV[7]) or 0, uncertain = tonumber(ARGV[8]) or 0}
  local cfg = {}
  local raw = redis.call('HGETALL', cfg_key)
  for i = 1, #raw, 2 do
    if raw[i] ~= '_digest' then cfg[raw[i]] = num(raw[i + 1]) end
  end
  local shortest = nil
  for _, v in pairs(builtin) do if v > 0 and (not shortest or v < shortest) then shortest = v end end
  for _, v in pairs(cfg) do if v > 0 and (not shortest or v < shortest) then shortest = v end end
  local function keep_ms(state, queue, task)
    local v = cfg['t:' .. (task or '') .. '|' .. state]
    if v == nil then v = cfg['q:' .. (queue or '') .. '|' .. state] end
    if v == nil then v = cfg['*|' .. state] end
    if v == nil then v = builtin[state] end
    return v  -- nil: not a finished state (left alone)
  end
  local function drop(id)
    redis.call('DEL', prefix .. K.run .. id, prefix .. K.attempts .. id, prefix .. K.deps .. id,
      prefix .. K.dependents .. id)
    redis.call('ZREM', done_key, id)
    redis.call('ZREM', dead_key, id)
    redis.call('ZREM', uncertain_key, id)
    redis.call('ZREM', kept_key, id)
    deleted = deleted + 1
  end
  local function examine(id, score)
    examined = examined + 1
    local f = redis.pcall('HMGET', prefix .. K.run .. id, 'state', 'queue', 'task', 'finished')
    if f.err then return end  -- a record of the wrong type: doctor names it
    if not f[1] then drop(id) return end  -- no record left: its index entries go
    local ms = keep_ms(f[1], f[2] or RUN_DEFAULTS.queue, f[3])
    if ms == nil then return end
    if ms <= 0 then redis.call('ZREM', kept_key, id) return end
    local at = (num(f[4]) or num(score) or now) + ms
    if at <= now then drop(id) else redis.call('ZADD', kept_key, at, id) end
  end
  for _, id in ipairs(redis.call('ZRANGE', kept_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)) do
    redis.call('ZREM', kept_key, id)
    examine(id, nil)  -- its retention read again: an edit since it was filed applies
  end
  if shortest then
    for _, idx in ipairs({{'done', done_key}, {'dead', dead_key}, {'uncertain', uncertain_key}}) do
      local wm = num(redis.call('HGET', swept_key, idx[1]))
      local batch = redis.call('ZRANGE', idx[2], wm and ('(' .. int_s(wm)) or '-inf',
        now - shortest, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
      if #batch > 0 then
        local last, seen = batch[#batch], {}
        for i = 1, #batch, 2 do
          seen[batch[i]] = true
          examine(batch[i], batch[i + 1])
        end
        if #batch >= 2 * limit then
          -- the rest of the last millisecond (a worker's batch finishes together), so the
          -- watermark passes it whole
          for _, id in ipairs(redis.call('ZRANGE', idx[2], last, last, 'BYSCORE')) do
            if not seen[id] then examine(id, last) end
          end
        end
        if num(last) then redis.call('HSET', swept_key, idx[1], last) end
      end
    end
  end
-- finished batches: kept as long as succeeded runs (an open batch's score is its creation)
local batches_key = prefix .. K.batches
if short > 0 and not wrong_type(batches_key, 'zset') then
  for _, bid in ipairs(redis.call('ZRANGE', batches_key, '-inf', now - short, 'BYSCORE',
      'LIMIT', 0, limit)) do
    local st = redis.pcall('HGET', prefix .. K.batch .. bid, 'state')
    if st ~= 'open' then
      redis.call('DEL', prefix .. K.batch .. bid, prefix .. K.bpending .. bid,
        prefix .. K.bmembers .. bid)
      redis.call('ZREM', batches_key, bid)
    end
  end
end
end

local wake = -1
for _, key in ipairs({leases_key, deadlines_key}) do
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local h = head[2] and num(head[2])
  if head[2] and not h then h = now end  -- +-inf left over a full batch: repaired next call
  if h and (wake == -1 or h < wake) then wake = h end
end
return {reaped, missed, deleted, wake, auto_paused, examined}
