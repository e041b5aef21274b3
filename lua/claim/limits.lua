-- claim/limits.lua: the limits a claim checks (docs/fairness.md "Limits"). The partition's
-- shares (T:limits) are read once per call; per scope (`tenant:<name>`, `queue:<name>`,
-- `task:<name>`) a concurrency count (T:limrun:<scope>) and a token bucket (T:bucket:<scope>)
-- are read at most once per call, counted in `c` while the claim runs and written back once.
-- c.conc[scope] = {max, count, key, hold told} or false (no concurrency limit);
-- c.bucket[scope] = {tokens, rate per ms, burst, key, taken} or false (no rate limit).
-- Tested by: tests/limits/test_concurrency.py, tests/limits/test_admission.py,
--   tests/limits/test_rate.py, tests/limits/test_cluster_limits.py

-- How far one claim reads past runs a limit holds back, to others that may start: the
-- due-order window is the batch plus HELD_SCAN, and a claim stops after meeting HELD_SCAN
-- held runs (the rest wait for the next call; docs/fairness.md states the bound).
local HELD_SCAN = 32

-- T:limits as a table: 'tenant:acme:c' -> '3', 'task:noop:r' -> '<rate per ms> <burst>', ...
local function read_limits(limits_key)
  local lims, flat = {}, redis.call('HGETALL', limits_key)
  for x = 1, #flat, 2 do lims[flat[x]] = flat[x + 1] end
  return lims
end

-- The reply's next time: the earliest moment a limit may let a held run through.
local function hold_until(c, t)
  if c.free_at == nil or t < c.free_at then c.free_at = t end
end

local function conc_of(c, scope)
  local s = c.conc[scope]
  if s ~= nil then return s end
  local max = tonumber(c.lims[scope .. ':c'])
  if not max then c.conc[scope] = false; return false end
  local key, now = c.prefix .. K.limrun .. scope, c.now
  -- entries past their lease hint: kept (re-scored) while the run's lease lives, else freed
  for _, m in ipairs(redis.call('ZRANGE', key, '-inf', now, 'BYSCORE')) do
    local ls = tonumber(redis.call('ZSCORE', c.leases_key, m))
    if ls and ls > now then redis.call('ZADD', key, ls, m) else redis.call('ZREM', key, m) end
  end
  s = {max, redis.call('ZCARD', key), key}
  c.conc[scope] = s
  return s
end

local function bucket_of(c, scope)
  local b = c.bucket[scope]
  if b ~= nil then return b end
  local spec = c.lims[scope .. ':r']
  if not spec then c.bucket[scope] = false; return false end
  local rate, burst = string.match(spec, '^(%S+) (%S+)$')
  rate, burst = tonumber(rate), tonumber(burst)
  if not rate or not burst or rate <= 0 then c.bucket[scope] = false; return false end
  local key, now = c.prefix .. K.bucket .. scope, c.now
  local st = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens, ts = tonumber(st[1]), tonumber(st[2])
  if not tokens or not ts then tokens, ts = burst, now end
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  b = {tokens, rate, burst, key, false}
  c.bucket[scope] = b
  return b
end

-- The rate-limit holds in force (T:holds, lua/rate_limited.lua): c.holds[scope] = until ms;
-- an entry past its time is dropped. A hold of this queue sets c.queue_held (nothing claimed
-- until then). Returns true when some hold is in force.
local function read_holds(c)
  local flat, any = redis.call('HGETALL', c.keys.holds), false
  for x = 1, #flat, 2 do
    local t = tonumber(flat[x + 1])
    if t and t > c.now then
      c.holds = c.holds or {}
      c.holds[flat[x]] = t
      any = true
    else
      redis.call('HDEL', c.keys.holds, flat[x])
    end
  end
  if any and c.holds['queue:' .. c.queue] then c.queue_held = c.holds['queue:' .. c.queue] end
  return any
end

-- The scopes a run is limited by: this queue, its task, its tenant.
local function scopes_of(c, tenant, task)
  local s = {'queue:' .. c.queue, 'task:' .. (task or '')}
  if tenant and tenant ~= '' then s[3] = 'tenant:' .. tenant end
  return s
end

-- nil when every limit lets the run start now, else the limit that holds it back
-- ('tenant:acme:concurrency') and its kind ('c' or 'r').
local function blocked_by(c, scopes)
  for _, scope in ipairs(scopes) do
    local h = c.holds and c.holds[scope]
    if h then  -- a rate-limit hold (RateLimited): until its end
      hold_until(c, h)
      return scope .. ':held', 'h'
    end
    local s = conc_of(c, scope)
    if s and s[2] >= s[1] then
      if not s[4] then  -- once per scope: its earliest slot expiry
        local first = redis.call('ZRANGE', s[3], 0, 0, 'WITHSCORES')
        s[4] = true
        hold_until(c, tonumber(first[2]) or (c.now + 1000))
      end
      return scope .. ':concurrency', 'c'
    end
    local b = bucket_of(c, scope)
    if b and b[1] < 1 then
      hold_until(c, c.now + math.ceil((1 - b[1]) / b[2]))
      return scope .. ':rate', 'r'
    end
  end
  return nil
end

-- The light read of a candidate when limits are set (five short fields). Returns the limit
-- holding it back (nil when none does) and the scopes of a run waiting to start (nil for any
-- other state: the full read decides). A held run stays in its set and records the limit in
-- `limited_by`, counted once per run and limit (c.held_c, c.held_r).
local function held_by_limit(c, run_key)
  local g = run_fields(run_key, 'state', 'tenant', 'task', 'limited_by', 'cancel_requested')
  if not g then return nil, nil end  -- a damaged record: admit dead-letters it
  local why, kind, scopes = nil, nil, nil
  if (g[1] == 'scheduled' or g[1] == 'retrying') and not g[5] then
    scopes = scopes_of(c, g[2], g[3])
    why, kind = blocked_by(c, scopes)
  end
  if why then
    if g[4] ~= why then
      redis.call('HSET', run_key, 'limited_by', why)
      if kind == 'c' then c.held_c = c.held_c + 1
      elseif kind == 'r' then c.held_r = c.held_r + 1 end
    end
  end
  return why, scopes
end

-- The run starts: take a slot of each concurrency limit and a token of each rate limit.
-- Returns the concurrency scopes it holds (freed when the attempt ends), space separated.
local function take(c, scopes, id)
  local held = ''
  for _, scope in ipairs(scopes) do
    local s = c.conc[scope]
    if s then
      s[2] = s[2] + 1
      redis.call('ZADD', s[3], c.until_s, id)
      held = held .. (held == '' and '' or ' ') .. scope
    end
    local b = c.bucket[scope]
    if b then b[1] = b[1] - 1; b[5] = true end
  end
  return held
end

-- The buckets this claim took tokens from, written back once.
local function save_buckets(c)
  if not c.bucket then return end  -- no limit key: nothing taken
  for _, b in pairs(c.bucket) do
    if b and b[5] then
      redis.call('HSET', b[4], 'tokens', tostring(b[1]), 'ts', c.now_s)
      -- an idle bucket is full again after burst / rate: it may vanish then
      redis.call('PEXPIRE', b[4], math.ceil(b[3] / b[2]) + 1000)
    end
  end
end
