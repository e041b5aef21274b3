-- heartbeat.lua: extend the leases a worker holds in one partition, each checked against
-- its fence token. A lease whose key already expired is revived only if the run was not
-- reaped or claimed again meanwhile (state still running with the same fence).
-- KEYS[1] leases zset  T:leases
-- KEYS[2..] for each run, two keys: lease string T:lease:<run>, run hash T:run:<run>
-- ARGV[1] lease ms
-- ARGV[2..] for each run, two values: run id, owner token '<worker>:<fence>'
-- Returns one integer per run: 1 = lease held, 0 = lost (the worker must stop that run),
-- 2 = held, but cancellation was requested (the worker stops the run and reports 'cancel').
local leases_key = KEYS[1]
local lease = tonumber(ARGV[1])
local now = now_ms()
local now_s, until_s = int_s(now), int_s(now + lease)  -- formatted once per call
local out = {}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local lease_key, run_key = KEYS[2 * i], KEYS[2 * i + 1]
  local run_id, token = ARGV[2 * i], ARGV[2 * i + 1]
  local held = redis.call('GET', lease_key)
  local ok = 0
  if held == token then
    ok = 1
  elseif not held then
    local f = redis.call('HMGET', run_key, 'state', 'fence', 'worker')
    local fence = string.match(token, ':(%d+)$')
    if f[1] == 'running' and f[2] == fence and f[3] .. ':' .. f[2] == token then ok = 1 end
  end
  if ok == 1 then
    redis.call('SET', lease_key, token, 'PX', ARGV[1])
    redis.call('ZADD', leases_key, until_s, run_id)
    redis.call('HSET', run_key, 'lease_expires', until_s, 'heartbeat', now_s)
    if redis.call('HEXISTS', run_key, 'cancel_requested') == 1 then ok = 2 end
  end
  out[i] = ok
end
return out
