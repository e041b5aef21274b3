#!lua
-- enqueue.lua: create runs of one partition and queue, each once (state: scheduled).
-- A run id that exists already is left alone: an idempotency key's second use, and a call
-- sent again after its reply was lost (the client retries on a broken connection), create
-- nothing the second time.
-- Tested by: tests/integration/test_scripts.py, tests/integration/test_enqueue_retry.py,
--   tests/integration/test_bad_input.py, tests/limits/test_tenants.py,
--   tests/integration/test_payload_cap.py, tests/workloads/test_debounce.py,
--   tests/workloads/test_throttle.py
-- KEYS[1] due zset  T:due:<queue>    KEYS[2] priority index  T:prio:<queue>
-- KEYS[3] laned zset  T:laned:<queue>  KEYS[4] lanes zset  T:lanes:<queue>
-- ARGV[1] partition prefix 'ns:{tag}:' -- each run's hash T:run:<id> is built from it (same
--         hash tag, so the same slot), as in the other batch scripts
-- ARGV[2] wake channel   ARGV[3] partition index   ARGV[4] queue
-- ARGV[5] fresh: '1' when every run id of the call is random and sent for the first time
--         (duetime/client/runs.py _pipelines), so none can exist and no run is looked up
--         first (create-once costs no EXISTS per run); '' = look each id up (keys, explicit
--         ids, a resend of a call whose reply was lost)
-- ARGV[6] count S of shared values, then S values: field, value pairs every run of the call
--         gets (task, queue, retry policy: the same for a batch of one task)
-- ARGV[7 + S] the runs' form: '' = each run is: run id, due ms ('' = server time + delay;
--         a fraction of a ms, to the microsecond, is kept where the partition's format is 4
--         or later, else rounded up: _lib.lua due_text),
--         delay ms, field count F, then F values: the run's own field, value pairs (payload,
--         key, ...); else a delay in ms, and each run is two values, run id and payload: due
--         at server time + that delay, no own field but its payload (a plain enqueue_many:
--         two values per run sent and read, not six)
-- then the runs, in that form
-- Fields left at their defaults are not stored: attempt/fence absent = 0, idempotent absent =
-- yes, timeout absent = none; the id is the key's suffix.
-- A run with a `priority` field (1..100) is also indexed in T:prio:<queue> (score
-- -priority * 1e13 + due): claim.lua takes due runs from there first.
-- A run with a tenant also waits in its tenant's lane T:lane:<queue>|<tenant> (and in
-- T:laned:<queue>; the tenant in T:lanes:<queue>), so claim.lua can take runs round-robin
-- between tenants (docs/fairness.md); while the queue has lanes in this partition, a run
-- without a tenant gets the lane '<queue>|' so it is not left behind them.
-- Refused as a whole at maxmemory (no allow-oom flag): a call creates all its runs or none.
-- The namespace's payload cap, when one is set (`duetime limits payload SIZE`): T:caps
-- 'max_payload' (bytes; copied into every partition from <ns>:meta, so the check stays in this
-- slot). A run whose `payload` field is longer refuses the whole call before anything is
-- written, with a PAYLOAD_TOO_LARGE error naming the run, its size and the cap: a client that
-- ignores or raised its own max_payload cannot fill the server.
-- Debounce and throttle by key: a run whose own fields start with 'debounce' or 'throttle'
-- may land on the key's current run instead of being created (the step enqueue/coalesce.lua,
-- T:coalesce '<task>\n<key>' -> run id; an id that exists already is still left alone).
-- Returns (counts) how many runs were created (the others existed already); a call with such
-- runs returns {created, then for each of them in call order the id of the run it landed on}.
-- @include enqueue/coalesce.lua
local due_key, prefix = KEYS[1], ARGV[1]
-- an index of the wrong type refuses the call before it writes a run it could not index
local bad = damaged_index({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'zset',
  prefix .. K.coalesce, 'hash'})
if bad then return bad end
local queue = ARGV[4]
local lanes = redis.call('EXISTS', KEYS[4]) == 1
local now = now_ms()
local created = 0
local fresh_call = ARGV[5] == '1'
local shared_n = tonumber(ARGV[6])
local plain_delay = ARGV[7 + shared_n]
local plain = (plain_delay or '') ~= ''
local i, nargs = 8 + shared_n, #ARGV
local added, earliest = {}, nil
local last_delay, last_due, last_due_s
-- the partition's caps (T:caps, copied from <ns>:meta): the payload cap, and the layout format
-- the namespace writes (duetime migrate moves it on once no process of an older release is
-- left): 3 compact records, 4 due times to the microsecond
local caps = redis.call('HMGET', prefix .. K.caps, 'max_payload', 'format')
local cap, fmt = tonumber(caps[1]), tonumber(caps[2]) or 2
local compact, fine = fmt >= 3, fmt >= 4
-- one field list reused for every run (no table per run): state, due (slot 4), created, the
-- shared fields, then the run's own fields from position base_n + 1. Format 3 leaves out what
-- readers take as the default (docs/keys.md "The run record"): `created` when it is the due
-- time (a run due at once, the plain form without delay), and shared fields at RUN_DEFAULTS
-- (the queue 'default', the default retry policy)
local fields = {'state', 'scheduled', 'due', 0}
if not (compact and plain and tonumber(plain_delay) == 0) then
  fields[5], fields[6] = 'created', int_s(now)
end
for j = 7, 6 + shared_n, 2 do
  if not (compact and RUN_DEFAULTS[ARGV[j]] == ARGV[j + 1]) then
    fields[#fields + 1] = ARGV[j]
    fields[#fields + 1] = ARGV[j + 1]
  end
end
local base_n = #fields
-- debounce / throttle (enqueue/coalesce.lua): the call's state, the ids the runs landed on
local co = {prefix = prefix, hash = prefix .. K.coalesce, queue = queue, due_key = due_key,
            prio_key = KEYS[2], laned_key = KEYS[3], added = added, at = {}, landed = nil,
            task = ''}
for j = 7, 6 + shared_n, 2 do if ARGV[j] == 'task' then co.task = ARGV[j + 1] end end
if cap then
  local j = i
  while j <= nargs do
    local nf = plain and 0 or tonumber(ARGV[j + 3])
    local f0, f1 = j + 4, j + 3 + nf
    if plain then f0, f1 = j, j end  -- the run id and its payload: ARGV[f + 1]
    for f = f0, f1, 2 do
      if (plain or ARGV[f] == 'payload') and #ARGV[f + 1] > cap then
        return redis.error_reply('PAYLOAD_TOO_LARGE run ' .. ARGV[j] .. ': payload of '
          .. #ARGV[f + 1] .. ' bytes is over the namespace cap of ' .. int_s(cap)
          .. ' bytes (max_payload in <ns>:meta); nothing was enqueued')
      end
    end
    j = j + (plain and 2 or 4 + nf)
  end
end

-- A run created: its record (the own fields ARGV[j0..j1], or `payload` alone for the plain
-- form) and its indexes but the due set (written once, after the loop).
local function create(run_id, run_key, due, due_s, j0, j1, payload)
  fields[4] = due_s
  local n = base_n
  if payload then
    fields[n + 1] = 'payload'
    fields[n + 2] = payload
    n = n + 2
  else
    for j = j0, j1 do n = n + 1; fields[n] = ARGV[j] end
  end
  redis.call('HSET', run_key, unpack(fields, 1, n))
  local tenant = nil
  if not payload then
    for j = j0, j1, 2 do
      if ARGV[j] == 'priority' then
        redis.call('ZADD', KEYS[2], -tonumber(ARGV[j + 1]) * 1e13 + due, run_id)
      elseif ARGV[j] == 'tenant' then
        tenant = ARGV[j + 1]
      end
    end
  end
  if tenant or lanes then
    tenant = tenant or ''
    redis.call('ZADD', prefix .. K.lane .. queue .. '|' .. tenant, due_s, run_id)
    redis.call('ZADD', KEYS[3], due_s, run_id)
    redis.call('ZADD', KEYS[4], 'NX', 0, tenant)
    lanes = true
  end
  added[#added + 1] = due_s
  added[#added + 1] = run_id
  if earliest == nil or due < earliest then earliest = due end
  created = created + 1
end

if plain then
  local due = now + tonumber(plain_delay)
  local due_s = int_s(due)
  for j = i, nargs, 2 do
    local run_id = ARGV[j]
    local run_key = prefix .. K.run .. run_id
    if fresh_call or redis.call('EXISTS', run_key) == 0 then
      create(run_id, run_key, due, due_s, nil, nil, ARGV[j + 1])
    end
  end
  i = nargs + 1
end
while i <= nargs do
  local run_id = ARGV[i]
  local run_key = prefix .. K.run .. run_id
  local due_s = ARGV[i + 1]
  local due = tonumber(due_s)
  if due ~= nil and not fine then
    due_s = due_text(due_s, fine)
    due = tonumber(due_s)
  elseif due == nil then
    -- a delay from server time: a bulk call repeats one delay, so format each delay once
    if ARGV[i + 2] ~= last_delay then
      last_delay = ARGV[i + 2]
      last_due = now + tonumber(last_delay)
      last_due_s = int_s(last_due)
    end
    due, due_s = last_due, last_due_s
  end
  local nf = tonumber(ARGV[i + 3])
  local mode = coalesce_mode(i, nf)
  local fresh = fresh_call or redis.call('EXISTS', run_key) == 0
  if mode then
    local joined = fresh and coalesce(co, mode, i, nf, now) or nil
    co.landed = co.landed or {}
    co.landed[#co.landed + 1] = joined or run_id
    if joined then fresh = false end
  end
  if fresh then
    create(run_id, run_key, due, due_s, i + 4, i + 3 + nf, nil)
    if mode then coalesce_created(co, run_id, #added - 1) end
  end
  i = i + 4 + nf
end
if earliest ~= nil then
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  zadd_batch(due_key, added)
  if head[2] == nil or earliest < tonumber(head[2]) then
    wake_workers(ARGV[2], ARGV[3], queue, earliest)
  end
end
if co.landed then return {created, unpack(co.landed)} end
return created
