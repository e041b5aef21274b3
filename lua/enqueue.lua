-- enqueue.lua: create runs of one partition and queue, each once (state: scheduled).
-- A run id that exists already is left alone (idempotency key): its due time is returned.
-- KEYS[1] due zset  T:due:<queue>
-- KEYS[2..] one run hash T:run:<id> per run, in ARGV order
-- ARGV[1] wake channel   ARGV[2] wake tag '<partition>|<queue>'
-- ARGV[3] count S of shared values, then S values: field, value pairs every run of the call
--         gets (task, queue, retry policy: the same for a batch of one task)
-- then per run: run id, due ms ('' = server time + delay), delay ms, may-exist flag (1 for
--         ids derived from an idempotency key; random ids are never looked up), field count F,
--         then F values: the run's own field, value pairs (payload, key, ...)
-- Fields left at their defaults are not stored: attempt/fence absent = 0, idempotent absent =
-- yes, timeout absent = none; the id is the key's suffix.
-- Returns per run {created 1/0, due ms}, flattened.
local due_key = KEYS[1]
local now = now_ms()
local out = {}
local shared_n = tonumber(ARGV[3])
local i, k = 4 + shared_n, 2
local added, earliest = {}, nil
while i <= #ARGV do
  local run_key, run_id = KEYS[k], ARGV[i]
  local due = tonumber(ARGV[i + 1]) or (now + tonumber(ARGV[i + 2]))
  local nf = tonumber(ARGV[i + 4])
  if ARGV[i + 3] == '1' and redis.call('EXISTS', run_key) == 1 then
    out[#out + 1] = 0
    out[#out + 1] = tonumber(redis.call('HGET', run_key, 'due')) or 0
  else
    local fields = {'state', 'scheduled', 'created', now, 'due', due}
    for j = 4, 3 + shared_n do fields[#fields + 1] = ARGV[j] end
    for j = i + 5, i + 4 + nf do fields[#fields + 1] = ARGV[j] end
    redis.call('HSET', run_key, unpack(fields))
    added[#added + 1] = due
    added[#added + 1] = run_id
    if earliest == nil or due < earliest then earliest = due end
    out[#out + 1] = 1
    out[#out + 1] = due
  end
  i = i + 5 + nf
  k = k + 1
end
if earliest ~= nil then
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  redis.call('ZADD', due_key, unpack(added))
  if head[2] == nil or earliest < tonumber(head[2]) then
    redis.call('PUBLISH', ARGV[1], ARGV[2] .. '|' .. earliest)
  end
end
return out
