-- _lib.lua: helpers prepended to every duetime script (local functions only; no keys).
-- Time comes only from the server clock, so every process agrees on due times and leases.

local EVENTS_MAXLEN = 10000

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer as a decimal string, for arguments and JSON. A string read from Redis passes
-- through untouched; a number is formatted as an integer. Lua's own number-to-string (used
-- when a number is passed to redis.call or joined with ..) goes through printf's float path
-- (%.14g): profiling the hot scripts found that float formatting took ~12% of Redis's CPU.
local function int_s(x)
  if type(x) == 'string' and x ~= '' then return x end
  return string.format('%d', tonumber(x) or 0)
end

-- Append a lifecycle event to the partition's capped stream.
local function emit(events_key, run_id, kind, detail)
  redis.call('XADD', events_key, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
    'run', run_id, 'event', kind, 'detail', detail or '')
end

-- Close the current attempt: one JSON entry per attempt, pushed when it ends, so entry
-- number `fence` (1-based) is that claim's attempt. The running attempt lives in the run hash.
-- Built as one string (no table + cjson.encode per run: complete.lua does this per success).
-- n, fence, start and now: integers, or their decimal strings as read from Redis.
local function push_attempt(attempts_key, n, fence, worker, start, outcome, now, err)
  local s = '{"n":' .. int_s(n) .. ',"fence":' .. int_s(fence)
    .. ',"worker":' .. cjson.encode(worker or '') .. ',"end":' .. int_s(now)
    .. ',"outcome":"' .. outcome .. '"'
  if start and start ~= '' then s = s .. ',"start":' .. int_s(start) end
  if err then s = s .. ',"error":' .. cjson.encode(err) end
  redis.call('RPUSH', attempts_key, s .. '}')
end

-- Merge fields into attempt entry number `fence` (1-based), if it was pushed already.
local function set_attempt(attempts_key, fence, fields)
  local idx = tonumber(fence) - 1
  local raw = redis.call('LINDEX', attempts_key, idx)
  if not raw then return end
  local a = cjson.decode(raw)
  for k, v in pairs(fields) do a[k] = v end
  redis.call('LSET', attempts_key, idx, cjson.encode(a))
end

-- Exponential backoff with "equal jitter": half fixed, half random (jitter in [0,1)), capped.
local function backoff_ms(base, cap, attempt, jitter)
  local d = tonumber(base) * (2 ^ (tonumber(attempt) - 1))
  if d > tonumber(cap) then d = tonumber(cap) end
  return math.floor(d / 2 + (d / 2) * tonumber(jitter))
end

-- Add a member to a due/retry zset; tell idle workers when it became the set's earliest.
local function add_due(zkey, score, run_id, channel, wake_tag)
  local head = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
  redis.call('ZADD', zkey, score, run_id)
  if head[2] == nil or score < tonumber(head[2]) then
    redis.call('PUBLISH', channel, wake_tag .. '|' .. score)
  end
end

-- A failed or abandoned attempt: retry with backoff, or dead-letter when attempts ran out.
-- Returns the new state and the retry time (or 0).
local function retry_or_dead(run_key, retry_key, dead_key, run_id, now, force_dead, delay,
                             jitter, reason, channel, wake_tag)
  local f = redis.call('HMGET', run_key, 'attempt', 'max_attempts', 'backoff_base', 'backoff_max')
  if force_dead or tonumber(f[1]) >= tonumber(f[2]) then
    redis.call('HSET', run_key, 'state', 'dead', 'finished', now, 'reason', reason)
    redis.call('ZADD', dead_key, now, run_id)
    return 'dead', 0
  end
  if delay == nil then delay = backoff_ms(f[3], f[4], f[1], jitter) end
  local at = now + delay
  redis.call('HSET', run_key, 'state', 'retrying', 'retry_at', at, 'reason', reason)
  add_due(retry_key, at, run_id, channel, wake_tag)
  return 'retrying', at
end

-- A run of a schedule stops running (any outcome): forget it, and make the schedule's
-- buffered successor (overlap buffer_one / cancel_other) due now, if it has one. Runs of
-- schedules with overlap 'allow' are not tracked (claim.lua does not add them).
-- Schedule keys are built from the partition prefix: they share the run's hash tag.
local function leave_running(prefix, run_key, run_id, now, channel, partition)
  local f = redis.call('HMGET', run_key, 'schedule', 'overlap')
  local sched, overlap = f[1], f[2]
  if not sched or sched == '' or not overlap or overlap == 'allow' then return end
  local running = prefix .. 'sched_running:' .. sched
  redis.call('SREM', running, run_id)
  if redis.call('SCARD', running) > 0 then return end
  local sched_key = prefix .. 'sched:' .. sched
  local buffered = redis.call('HGET', sched_key, 'buffered')
  if buffered and buffered ~= '' then
    redis.call('HDEL', sched_key, 'buffered')
    -- due now, but never before its own due time (it may have been claimed ahead of it)
    local b = redis.call('HMGET', prefix .. 'run:' .. buffered, 'queue', 'due')
    if b[1] then
      add_due(prefix .. 'due:' .. b[1], math.max(now, tonumber(b[2]) or 0), buffered, channel,
        partition .. '|' .. b[1])
    end
  end
end

-- A run that will never start (skipped, missed, cancelled before it ran) is finished.
local function finish_unstarted(prefix, run_id, state, reason, now, done_key, deadlines_key,
                                 events_key)
  local run_key = prefix .. 'run:' .. run_id
  redis.call('HSET', run_key, 'state', state, 'finished', now, 'reason', reason)
  redis.call('ZADD', done_key, now, run_id)
  redis.call('ZREM', deadlines_key, run_id)
  local sched = redis.call('HGET', run_key, 'schedule')
  if sched and sched ~= '' then
    redis.call('HINCRBY', prefix .. 'sched:' .. sched, state .. '_count', 1)
  end
  emit(events_key, run_id, state, reason)
end
