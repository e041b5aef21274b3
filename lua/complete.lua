#!lua
-- complete.lua: record successful attempts of runs of one partition (a worker's batch).
-- Accepted from the current fence holder. A late success from a holder whose lease expired
-- still finishes the run if nobody claimed it since (same fence; state retrying/uncertain),
-- instead of letting a retry run the work again. Anything else is recorded as a late result.
-- Finished records stay until the reaper's retention sweep of the done set. The same report
-- sent twice (the client retries a call whose reply a broken connection lost) gets the same
-- answer the second time and changes nothing but this: a report sent again because the first
-- send failed in transit (the connection dropped, maybe after this script committed) carries
-- that fault, and it is recorded on the attempt's entry (`report_fault`), decided or not.
-- Tested by: tests/integration/test_scripts.py, tests/integration/test_worker_inprocess.py,
--   tests/limits/test_concurrency.py, tests/integration/test_guardrails.py
-- KEYS[1] leases zset   KEYS[2] done zset   KEYS[3] uncertain zset   KEYS[4] events
-- ARGV[1] partition prefix 'ns:{tag}:' -- per-run keys (run hash, attempts, the retry set of
--         the run's queue) and schedule keys are built from it; they share this partition's
--         hash tag (a batch of hundreds of runs would otherwise send three key names per run)
-- ARGV[2] wake channel   ARGV[3] partition index
-- ARGV[4] form: '' = each run is the 5 values below; '1' = each run is 2 values, run id and
--         fence: a bare first attempt (mark '1') with no result stored and no fault (most
--         successes: two values per run sent and read, not five)
-- ARGV[5..] the runs, in that form; the full form, 5 values per run: run id, fence, result (msgpack; '' = none stored), the fault
--         an earlier send of this report met ('' = none), bare: '1' or 'b' when the claim of
--         this fence said the run has no schedule, no batch and took no limit slot (claim.lua's
--         reply, `bare`: fields no script changes while the attempt runs), so they are not
--         looked up; '1' says too that this claim was the run's first attempt (attempt 1: a
--         claim writes fence and attempt together, and nothing changes the attempt while that
--         fence runs), so the attempt is not looked up either; '' = look them up (any other
--         caller)
-- Returns (each) per run: 'succeeded' (accepted), 'late_succeeded' (a late success finished
-- the run), 'stale' (refused: another attempt owns the run, or it finished) or 'missing'.
local leases_key, done_key, uncertain_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, channel, partition = ARGV[1], ARGV[2], ARGV[3]
local bad = damaged_index({leases_key, 'zset', done_key, 'zset', uncertain_key, 'zset',
  events_key, 'stream'})
if bad then return bad end
local now = now_ms()
local now_s = int_s(now)  -- one number-to-string per call, not per run
local out, finished, unleased = {}, {}, {}
local freed = {}  -- queues where a limit slot was freed: their workers are woken once

local plain = ARGV[4] == '1'
local step = plain and 2 or 5
for i = 5, #ARGV, step do
  local run_id, fence, result_value, fault, bare = ARGV[i], ARGV[i + 1], '', '', '1'
  if not plain then
    result_value, fault, bare = ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  end
  local run_key = prefix .. K.run .. run_id
  -- only what decides (state, fence, attempt) and the optional features that add work; the
  -- rest is read where a branch needs it (a plain run is most of them, and every field asked
  -- of a listpack hash that lacks it scans the whole record). A bare run's schedule, held and
  -- batch are not asked (absent: its claim said so); waited and deps_out may be set while it
  -- runs (wait.lua, deps_link.lua), so they are always read.
  -- A record key of the wrong type is no run: 'missing' (the reaper dead-letters it)
  -- A bare first attempt's attempt is '1' (its mark says so) and is not asked either: one
  -- field fewer (bench/RESULTS.md).
  local state, rec_fence, attempt, sched, waited, held, batch, deps_out
  if bare == '1' then
    local f = run_fields(run_key, 'state', 'fence', 'waited', 'deps_out') or {}
    state, rec_fence, attempt, waited, deps_out = f[1], f[2], '1', f[3], f[4]
  elseif bare == 'b' then
    local f = run_fields(run_key, 'state', 'fence', 'attempt', 'waited', 'deps_out') or {}
    state, rec_fence, attempt, waited, deps_out = f[1], f[2], f[3], f[4], f[5]
  else
    local f = run_fields(run_key, 'state', 'fence', 'attempt', 'schedule', 'waited', 'held',
      'batch', 'deps_out') or {}
    state, rec_fence, attempt, sched, waited, held, batch, deps_out =
      f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]
  end
  local result
  if not state then
    result = 'missing'
  elseif state == 'succeeded' and rec_fence == fence then
    result = 'succeeded'  -- this very report, sent again
    if fault and fault ~= '' then
      set_attempt(prefix .. K.attempts .. run_id, fence, {report_fault = fault}, run_key)
    end
  elseif rec_fence ~= fence or not (state == 'running' or state == 'retrying' or state == 'uncertain') then
    set_attempt(prefix .. K.attempts .. run_id, fence,
      {late = true, late_outcome = 'succeeded', late_at = now}, run_key)
    emit(events_key, run_id, 'late_result_rejected', 'succeeded:' .. fence)
    result = 'stale'
  elseif state == 'running' then
    -- the attempt that succeeds stays inline: its entry is the run hash's attempt, fence,
    -- worker, started and finished (docs/keys.md "The attempt history"), so a first-try
    -- success writes no attempts key. A report sent again after a fault in transit records
    -- the fault on a pushed entry (the attempt entry first: an attempts key of the wrong
    -- type loses the entry, not the success, and the events say so)
    if fault and fault ~= '' then
      local w = redis.call('HMGET', run_key, 'worker', 'started')
      local a_key = prefix .. K.attempts .. run_id
      local damaged = push_attempt(a_key, attempt, fence, w[1], w[2], 'succeeded', now_s, nil)
      if damaged then emit(events_key, run_id, 'attempt_not_recorded', damaged) end
      set_attempt(a_key, fence, {report_fault = fault})
    end
    unleased[#unleased + 1] = run_id
    if result_value ~= '' then
      redis.call('HSET', run_key, 'state', 'succeeded', 'finished', now_s, 'result', result_value)
    else
      redis.call('HSET', run_key, 'state', 'succeeded', 'finished', now_s)
    end
    -- an earlier attempt's error stays in its attempt entry, not on a succeeded run
    if attempt ~= '1' then redis.call('HDEL', run_key, 'error', 'reason') end
    if sched then
      local overlap = redis.call('HGET', run_key, 'overlap')
      if overlap and overlap ~= 'allow' then
        leave_running(prefix, run_key, run_id, now, channel, partition)
      end
    end
    if held and free_limits(prefix, run_key, run_id, held) then
      freed[redis.call('HGET', run_key, 'queue') or RUN_DEFAULTS.queue] = true
    end
    result = 'succeeded'
  else
    -- late success of a reaped attempt that nobody claimed again: it finishes the run
    local queue = redis.call('HGET', run_key, 'queue') or RUN_DEFAULTS.queue
    redis.call('ZREM', prefix .. K.retry .. queue, run_id)  -- checked by retry_or_dead
    redis.call('ZREM', uncertain_key, run_id)
    redis.call('HSET', run_key, 'state', 'succeeded', 'finished', now_s)
    if result_value ~= '' then redis.call('HSET', run_key, 'result', result_value) end
    redis.call('HDEL', run_key, 'retry_at', 'reason', 'error')
    set_attempt(prefix .. K.attempts .. run_id, fence,
      {outcome = 'succeeded', late = true, late_at = now})
    emit(events_key, run_id, 'succeeded', 'late result of attempt ' .. fence)
    result = 'late_succeeded'
  end
  if (result == 'succeeded' and state == 'running') or result == 'late_succeeded' then
    finished[#finished + 1] = now_s
    finished[#finished + 1] = run_id
    if waited or batch or deps_out then  -- waited on, in a batch, or depended on
      wake_waiters(prefix, run_key, run_id, 'succeeded', waited or '0', {batch or false, deps_out or false})
    end
    if sched then  -- guardrails: the streak ends
      schedule_succeeded(prefix, sched, redis.call('HGET', run_key, 'replay_of'))
    end
  end
  out[#out + 1] = result
end
if #unleased > 0 then redis.call('ZREM', leases_key, unpack(unleased)) end
if #finished > 0 then zadd_batch(done_key, finished) end
for q in pairs(freed) do wake_workers(channel, partition, q, now_s) end
return out
