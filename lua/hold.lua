#!lua
-- hold.lua: create runs of one partition that wait for a gate (state `waiting`), and the
-- batch they belong to: runs enqueued with depends_on, a batch's members and callbacks.
-- One mechanism (docs/workloads.md): a waiting run's gate is its set T:deps:<id> of pending
-- dependencies, or, for a batch callback, its batch's pending set; the scripts that end a run
-- settle its gates in the same call (_lib.lua settle_dependents). A run id that exists
-- already is left alone (create-once, as in enqueue.lua), so a call sent again creates
-- nothing twice, and a batch's callbacks, whose ids derive from the batch id, exist once.
-- Tested by: tests/workloads/test_dependencies.py, tests/workloads/test_batches.py
-- KEYS[1] events stream T:events   KEYS[2] batch index T:batches
-- KEYS[3] waiting runs zset T:waiting (for listings; left when the run is released)
-- ARGV[1] partition prefix 'ns:{tag}:' (run, deps, dependents, batch keys are built from it)
-- ARGV[2] batch id ('' = none)
-- ARGV[3] batch step: '' (none) | 'open' (create the batch, held open by the member '~open'
--         of its pending set until sealed) | 'add' (more members: refused once it finished)
-- ARGV[4] '1': seal the batch after this call's runs (its creation is complete)
-- then per run: run id, role ('' | 'member' | 'on_complete' | 'on_success' | 'on_failure'),
--   mode ('' = due at once | 'succeed' | 'finish' (depends_on: all succeed / all finish) |
--   'batch' (a callback: its batch opens its gate)), due ms ('' = server time + delay),
--   delay ms, D, then D dependencies '<partition>|<run id>', F, then F field/value pairs
--   (task, queue, payload, retry policy, ...; as enqueue.lua stores them)
-- A dependency in this partition is checked and registered here (T:dependents:<dep>); one
-- in another partition is put in T:deplinks for the caller (or, if it died, the relay) to
-- register there (deps_link.lua). A dependency already finished counts at once.
-- Refused before any write: an unknown dependency in this partition (UNKNOWN_DEPENDENCY), a
-- batch to add to that does not exist or finished (NO_BATCH, BATCH_FINISHED), a payload over
-- the namespace cap (PAYLOAD_TOO_LARGE), a damaged key (DAMAGED).
-- Returns (counts) how many runs were created (the others existed already).
local prefix, batch_id, step, seal = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local events_key = KEYS[1]
local here = prefix_partition(prefix)
local bkey, pending_key = prefix .. K.batch .. batch_id, prefix .. K.bpending .. batch_id
local members_key = prefix .. K.bmembers .. batch_id
-- the partition's caps (T:caps): the payload cap, and whether it keeps a due time to the
-- microsecond (format 4; else one asked for so is rounded up: _lib.lua due_text)
local caps = redis.call('HMGET', prefix .. K.caps, 'max_payload', 'format')
local cap, fine = tonumber(caps[1]), (tonumber(caps[2]) or 2) >= 4

-- the runs of the call, read once: {id, role, mode, due, delay, deps = {...}, fields = {...}}
local function read_runs()
  local runs, i = {}, 5
  while i <= #ARGV do
    local r = {id = ARGV[i], role = ARGV[i + 1], mode = ARGV[i + 2], due = ARGV[i + 3],
      delay = ARGV[i + 4], deps = {}, fields = {}}
    local nd = tonumber(ARGV[i + 5])
    for j = i + 6, i + 5 + nd do r.deps[#r.deps + 1] = ARGV[j] end
    i = i + 6 + nd
    local nf = tonumber(ARGV[i])
    for j = i + 1, i + nf do r.fields[#r.fields + 1] = ARGV[j] end
    i = i + 1 + nf
    runs[#runs + 1] = r
  end
  return runs
end

-- Step 1: everything checked before the first write.
local function refusal(runs)
  local pairs_ = {events_key, 'stream', KEYS[2], 'zset', KEYS[3], 'zset'}
  if batch_id ~= '' then
    for _, x in ipairs({bkey, 'hash', pending_key, 'set', members_key, 'zset'}) do
      pairs_[#pairs_ + 1] = x
    end
  end
  local bad = damaged_index(pairs_)
  if bad then return bad end
  if step == 'add' then
    local st = redis.call('HGET', bkey, 'state')
    if not st then return redis.error_reply('NO_BATCH no batch ' .. batch_id) end
    if st ~= 'open' then
      return redis.error_reply('BATCH_FINISHED batch ' .. batch_id .. ' is ' .. st
        .. ': no run can be added to it')
    end
  end
  local created, queues = {}, {}
  for _, r in ipairs(runs) do
    for f = 1, #r.fields, 2 do
      if r.fields[f] == 'queue' and not queues[r.fields[f + 1]] then
        local q = r.fields[f + 1]
        queues[q] = true
        bad = damaged_index({prefix .. K.due .. q, 'zset', prefix .. K.prio .. q, 'zset',
          prefix .. K.lanes .. q, 'zset', prefix .. K.laned .. q, 'zset'})
        if bad then return bad end
      end
    end
    for f = 1, #r.fields, 2 do
      if cap and r.fields[f] == 'payload' and #r.fields[f + 1] > cap then
        return redis.error_reply('PAYLOAD_TOO_LARGE run ' .. r.id .. ': payload of '
          .. #r.fields[f + 1] .. ' bytes is over the namespace cap of ' .. int_s(cap)
          .. ' bytes (max_payload in <ns>:meta); nothing was enqueued')
      end
    end
    for _, d in ipairs(r.deps) do
      local p, dep = string.match(d, '^(%d+)|(.+)$')
      if p == here and not created[dep] then
        local why = wrong_type(prefix .. K.run .. dep, 'hash')
          or wrong_type(prefix .. K.dependents .. dep, 'set')
        if why then return redis.error_reply('DAMAGED ' .. why) end
        if redis.call('EXISTS', prefix .. K.run .. dep) == 0 then
          return redis.error_reply('UNKNOWN_DEPENDENCY run ' .. r.id .. ' depends on ' .. dep
            .. ': no such run; nothing was enqueued')
        end
      elseif not p then
        return redis.error_reply('UNKNOWN_DEPENDENCY unreadable dependency ' .. d)
      end
    end
    created[r.id] = true  -- a later run of the call may depend on it (a chain)
  end
  return nil
end

-- Step 2: the batch record, once (a call sent again finds it and goes on).
local function open_batch(runs, now)
  if step ~= 'open' or redis.call('EXISTS', bkey) == 1 then return end
  local f = {'state', 'open', 'total', 0, 'succeeded', 0, 'failed', 0, 'created', now}
  for _, r in ipairs(runs) do
    if r.role ~= '' and r.role ~= 'member' then f[#f + 1] = r.role; f[#f + 1] = r.id end
  end
  redis.call('HSET', bkey, unpack(f))
  redis.call('SADD', pending_key, '~open')
  redis.call('ZADD', KEYS[2], now, batch_id)
end

-- Step 3: one run, if it does not exist: its record, its batch membership, its gate.
local function create(r, now, todo)
  local run_key = prefix .. K.run .. r.id
  if redis.call('EXISTS', run_key) == 1 then return 0 end
  local due_s = tonumber(r.due) and due_text(r.due, fine)
    or int_s(now + (tonumber(r.delay) or 0))
  if r.mode ~= '' then redis.call('ZADD', KEYS[3], now, r.id) end  -- listed while it waits
  redis.call('HSET', run_key, 'state', 'waiting', 'created', int_s(now), 'due', due_s,
    unpack(r.fields))
  if batch_id ~= '' then
    redis.call('HSET', run_key, 'batch', batch_id)
    if r.role == 'member' then
      redis.call('SADD', pending_key, r.id)
      redis.call('ZADD', members_key, now, r.id)
      redis.call('HINCRBY', bkey, 'total', 1)
    else
      redis.call('HSET', run_key, 'batch_role', r.role)
    end
  end
  if r.mode == 'batch' then return 1 end  -- released or cancelled by its batch
  if r.mode == '' or #r.deps == 0 then
    release_waiting(prefix, r.id, now, true)
    return 1
  end
  redis.call('HSET', run_key, 'deps_mode', r.mode, 'depends_on', table.concat(r.deps, ' '))
  local pending = prefix .. K.deps .. r.id
  local finished = {}
  for _, d in ipairs(r.deps) do
    local p, dep = string.match(d, '^(%d+)|(.+)$')
    redis.call('SADD', pending, dep)
    if p == here then
      local st = redis.call('HGET', prefix .. K.run .. dep, 'state')
      if FINAL[st] then
        finished[#finished + 1] = {dep, st}
      else
        redis.call('SADD', prefix .. K.dependents .. dep, here .. '|' .. r.id)
        redis.call('HSET', prefix .. K.run .. dep, 'deps_out', '1')
      end
    else
      redis.call('RPUSH', prefix .. K.deplinks, p .. '|' .. dep .. '|' .. r.id)
    end
  end
  emit(events_key, r.id, 'waiting', 'depends on ' .. table.concat(r.deps, ' '))
  for _, x in ipairs(finished) do gate_apply(prefix, r.id, x[1], x[2], now, todo) end
  return 1
end

local runs = read_runs()
local bad = refusal(runs)
if bad then return bad end
local now = now_ms()
open_batch(runs, now)
local todo, created = {}, 0
for _, r in ipairs(runs) do created = created + create(r, now, todo) end
if seal == '1' and batch_id ~= '' then batch_counted(prefix, batch_id, '~open', nil, now, todo) end
-- runs cancelled here (a dependency had failed already): their own gates, in turn
for i = 1, #todo, 2 do
  settle_dependents(prefix, prefix .. K.run .. todo[i], todo[i], todo[i + 1])
end
return created
