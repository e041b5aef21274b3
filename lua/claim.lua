-- claim.lua: move up to N claimable runs of one partition and queue to `running`,
-- each with a new fence token, a lease key with a PX TTL and an attempt record.
-- KEYS[1] due zset     T:due:<queue>
-- KEYS[2] retry zset   T:retry:<queue>
-- KEYS[3] leases zset  T:leases
-- KEYS[4] done zset    T:done        (runs that missed their starting deadline)
-- KEYS[5] events       T:events
-- ARGV[1] partition prefix 'ns:{tag}:' -- per-run keys (run:, lease:, attempts:) are built
--         from it; they carry the same hash tag, so they live in this partition's slot
-- ARGV[2] worker id    ARGV[3] max runs to claim    ARGV[4] lease ms
-- Returns {next_due_ms or -1, run fields...}: 10 fields per run, in the order of `out` below.
-- next_due_ms is the earliest due/retry time left in this partition and queue.
local due_key, retry_key, leases_key, done_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, worker = ARGV[1], ARGV[2]
local limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()

local d = redis.call('ZRANGE', due_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
local r = redis.call('ZRANGE', retry_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')

-- merge the two sorted lists, earliest first
local picked, i, j = {}, 1, 1
while #picked < limit and (i <= #d or j <= #r) do
  if j > #r or (i <= #d and tonumber(d[i + 1]) <= tonumber(r[j + 1])) then
    picked[#picked + 1] = {d[i], due_key}; i = i + 2
  else
    picked[#picked + 1] = {r[j], retry_key}; j = j + 2
  end
end

local out = {-1}
for _, p in ipairs(picked) do
  local id, src = p[1], p[2]
  redis.call('ZREM', src, id)
  local run_key = prefix .. 'run:' .. id
  local f = redis.call('HMGET', run_key, 'state', 'deadline')
  local state = f[1]
  if state == 'scheduled' or state == 'retrying' then
    local deadline = tonumber(f[2])
    if deadline and deadline > 0 and now > deadline then
      redis.call('HSET', run_key, 'state', 'missed', 'finished', now,
        'reason', 'not started before its starting deadline')
      redis.call('ZADD', done_key, now, id)
      emit(events_key, id, 'missed', '')
    else
      local fence = redis.call('HINCRBY', run_key, 'fence', 1)
      local attempt = redis.call('HINCRBY', run_key, 'attempt', 1)
      local expires = now + lease
      redis.call('HSET', run_key, 'state', 'running', 'worker', worker, 'started', now,
        'lease_expires', expires)
      redis.call('SET', prefix .. 'lease:' .. id, worker .. ':' .. fence, 'PX', lease)
      redis.call('ZADD', leases_key, expires, id)
      redis.call('RPUSH', prefix .. 'attempts:' .. id, cjson.encode(
        {n = attempt, fence = fence, worker = worker, start = now, outcome = 'running'}))
      local v = redis.call('HMGET', run_key, 'task', 'payload', 'due', 'timeout',
        'idempotent', 'key', 'schedule')
      local out_n = #out
      out[out_n + 1] = id
      out[out_n + 2] = fence
      out[out_n + 3] = attempt
      for k = 1, 7 do out[out_n + 3 + k] = v[k] or '' end
      emit(events_key, id, 'running', worker .. ':' .. fence)
    end
  end
  -- any other state: a stale index entry (cancelled, deleted); it was removed above
end

local nd = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
local nr = redis.call('ZRANGE', retry_key, 0, 0, 'WITHSCORES')
local nxt = -1
if nd[2] then nxt = tonumber(nd[2]) end
if nr[2] and (nxt == -1 or tonumber(nr[2]) < nxt) then nxt = tonumber(nr[2]) end
out[1] = nxt
return out
