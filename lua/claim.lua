#!lua
-- claim.lua: move up to N claimable runs of one partition and queue to `running`, each with
-- a new fence token and a lease: its score in the leases zset is the expiry, the run hash's
-- worker and fence say who holds it.
-- Applies, atomically, the starting deadline (-> missed) and the schedule's overlap policy
-- (a schedule and its runs share this partition). The attempt's history entry is written
-- when the attempt ends; while it runs, the run hash holds worker, fence and start.
-- Tested by: tests/integration/test_scripts.py, tests/limits/test_admission.py,
--   tests/limits/test_concurrency.py, tests/limits/test_rate.py, tests/limits/test_fairness.py,
--   tests/limits/test_priority.py, tests/property/test_damaged_records.py,
--   tests/integration/test_cluster.py, tests/integration/test_reshard.py,
--   tests/integration/test_queue_pause.py, tests/workloads/test_rate_limited.py
-- KEYS[1] due zset     T:due:<queue>       KEYS[2] retry zset   T:retry:<queue>
-- KEYS[3] leases zset  T:leases            KEYS[4] done zset    T:done
-- KEYS[5] deadlines    T:deadlines         KEYS[6] events       T:events
-- KEYS[7] dead zset    T:dead              KEYS[8] limits hash  T:limits
-- KEYS[9] priority index T:prio:<queue> (runs enqueued with a priority: taken first once due;
--         an entry whose run is no longer waiting in the due set is dropped here)
-- KEYS[10] lanes zset T:lanes:<queue>   KEYS[11] laned zset T:laned:<queue>
-- KEYS[12] paused hash T:paused (queue -> pause record; duetime/client/pause.py): a paused
--          queue claims nothing; the reply is the header alone, next_due_ms = now + 1 s, so a
--          worker looks again a second later (a resume also wakes the workers at once)
-- KEYS[13] holds hash T:holds ('<kind>:<name>' -> until ms; lua/rate_limited.lua): a run of a
--          held task, queue or tenant is not admitted until then (claim/limits.lua); a held
--          queue claims nothing, the reply the header alone with next_due_ms = the hold's end
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
-- Returns a header, then the same fields for each run claimed (common/transitions.py
-- CLAIM_REPLY_HEADER and CLAIM_RUN_FIELDS, checked by tests/unit/test_script_assembly.py):
-- Reply header: next_due_ms missed skipped held_concurrency held_rate
-- Reply per run: head task payload due_ms extra
-- head: one string of four values, separated by single spaces, the run id last (every other
-- value of it is a number the script wrote or read from an index; a run's own fields, which
-- an operator's HSET may have damaged, are the separate values after it):
-- Reply head: fence attempt ready_ms run_id
-- extra: '' (none set: most runs), or the run's optional fields (CLAIM_EXTRA_FIELDS):
-- Reply extra: timeout_ms idempotent key schedule limited_by interval_start interval_end tenant
--   headers bare
-- bare: '1' when the run has no schedule, no batch and took no limit slot (a plain run: extra
-- ''): its success report says so and complete.lua reads three fields fewer.
-- next_due_ms is the earliest due/retry time left in this partition and queue (or when a
-- limit frees), -1 for none; missed/skipped count the runs this call finished instead of
-- starting; held_* count runs a limit held back for the first time (per limit).
-- The claim, as a recipe: each step lives in the file of lua/claim/ named beside it, included
-- (whole, in this order, before this body) by common/scripts.py. `c` is the claim's state,
-- handed to every step; one script call, so the whole batch is one atomic transition.
-- @include claim/checks.lua
-- @include claim/limits.lua
-- @include claim/candidates.lua
-- @include claim/lanes.lua
-- @include claim/admission.lua
-- @include claim/lease.lua
-- @include claim/index.lua
-- @include claim/next_due.lua

local PAUSED_RECHECK_MS = 1000  -- a paused queue's next look: the worker must not spin
local now = now_ms()
local lease, ahead = tonumber(ARGV[4]), tonumber(ARGV[5]) or 0
-- the claim's state; fields left nil until a step sets them are named in comments (a nil
-- field in a table constructor still costs a slot), and the option paths' tables are made
-- only when an option key exists (step 0)
local c = {
  due_key = KEYS[1], retry_key = KEYS[2], leases_key = KEYS[3], done_key = KEYS[4],
  deadlines_key = KEYS[5], events_key = KEYS[6], dead_key = KEYS[7],
  prefix = ARGV[1], worker = ARGV[2], queue = ARGV[8] or '',
  sched_wake = ARGV[6], partition = ARGV[7],
  limit = tonumber(ARGV[3]), now = now, horizon = now + ahead,
  -- numbers sent to Redis as strings built once per call, not once per run (see int_s)
  now_s = int_s(now), until_s = int_s(now + lease), horizon_s = int_s(now + ahead),
  -- the rare paths' keys (claim/checks.lua): checked yet; `damaged`, the refusal when one is
  rare_checked = false,
  -- what the partition has besides plain runs (read_options): `lims` (its limits), `holds`
  -- and `queue_held` (rate-limit holds in force, claim/limits.lua read_holds)
  options = false,  -- one of the option keys exists (step 0)
  prio = false, lanes = false, paused = false, scan = tonumber(ARGV[3]),
  -- the candidates (claim/candidates.lua; lanes.lua: `picked`)
  ids = {}, froms = {}, scores = {}, past_read = false,
  -- limit state (claim/limits.lua): `free_at`, when a held run may start
  held_c = 0, held_r = 0,
  -- what the batch did: the index writes, the leases, the reply (claim/index.lua, lease.lua)
  from_due = {}, from_retry = {}, leased = {},
  out = {-1, 0, 0, 0, 0}, taken = 0, missed = 0, skipped = 0,
}

-- 0. checked before the first write (claim/checks.lua): an index of the wrong type (edited by
-- hand) refuses the call, naming the key, so this partition and queue wait and nothing is left
-- half done. The option keys (limits, priority index, lanes, pause, holds) are one EXISTS
-- first: their types, and every index's, are checked only when one of them exists (none does
-- on the hot path); else the leases set here, the due and retry sets by their window reads,
-- and the keys of the rare paths only when a candidate takes one.
c.options = redis.call('EXISTS', KEYS[8], KEYS[9], KEYS[10], KEYS[12], KEYS[13]) > 0
local bad
if c.options then
  -- the option paths' state: their keys, the runs taken (by priority or lane) and each one's
  -- lane, the concurrency and rate state per limit scope (claim/limits.lua)
  c.keys = {limits = KEYS[8], prio = KEYS[9], lanes = KEYS[10], laned = KEYS[11],
            paused = KEYS[12], holds = KEYS[13]}
  c.seen, c.lane_of, c.conc, c.bucket = {}, {}, {}, {}
  c.rare_checked = true
  bad = damaged_index({KEYS[3], 'zset', KEYS[4], 'zset', KEYS[5], 'zset', KEYS[6], 'stream',
    KEYS[7], 'zset', KEYS[11], 'zset', KEYS[8], 'hash', KEYS[9], 'zset', KEYS[10], 'zset',
    KEYS[12], 'hash', KEYS[13], 'hash'})
else
  bad = damaged_index({KEYS[3], 'zset'})
end
if bad then return bad end

-- 1. candidates: priority runs, then tenant lanes, then the due and retry sets in due order; a
-- due or retry score edited to +inf (never claimable) is put back from the run record
read_options(c)
if c.paused then return {now + PAUSED_RECHECK_MS, 0, 0, 0, 0} end  -- the header alone
if c.queue_held then return {c.queue_held, 0, 0, 0, 0} end  -- a held queue: until its end
local d, r
d, r, bad = due_windows(c)
if bad then return bad end
bad = repair_unending(c)
if bad then return bad end
if c.prio then priority_candidates(c) end
local skip = c.seen
if c.lanes then skip = lane_candidates(c, d) end
due_order_candidates(c, d, r, skip)

-- 2. each candidate in order: limits, then admission, then the lease. Past HELD_SCAN held
-- runs in one call the rest waits for the next (bounded cost while a limit is full; other
-- partitions are not affected, see docs/fairness.md)
local start = lease_starter(c)
local prefix, lims, limit, froms, scores = c.prefix, c.lims, c.limit, c.froms, c.scores
local ids, from_due, from_retry, taken, held = c.ids, c.from_due, c.from_retry, 0, 0
local first = 1
repeat
  local last = #ids
  for n = first, last do
    if taken >= limit or held >= HELD_SCAN then break end
    local id = ids[n]
    local run_key = prefix .. K.run .. id
    local why, scopes = nil, nil
    if lims then why, scopes = held_by_limit(c, run_key) end
    if why then
      held = held + 1  -- a run a limit holds back stays where it is
    else
      local f, starts, deadline, plain = admit(c, id, run_key)
      if c.damaged then break end  -- a rare path's key is damaged: nothing done to this run
      if froms[n] then from_due[#from_due + 1] = id else from_retry[#from_retry + 1] = id end
      if starts then
        taken = taken + 1
        start(id, run_key, f, scores[n], deadline, scopes, plain and not lims)
      end
    end
  end
  first = last + 1
  -- room left (runs held, lanes short of their shares, runs that did not start): once, the
  -- lanes past their shares (claim/lanes.lua)
until c.damaged or taken >= limit or held >= HELD_SCAN
  or not lanes_past_shares(c, (limit - taken) + (HELD_SCAN - held))
c.taken = taken
-- the damaged key met before anything was done: the refusal (else the runs taken so far go
-- out, and the next call meets it first)
if c.damaged and taken == 0 and #from_due == 0 and #from_retry == 0 then return c.damaged end

-- 3. the batch's writes: indexes and leases, token buckets
write_indexes(c)
save_buckets(c)

-- 4. the reply: next time worth trying, what this call finished or held, the runs
local out = c.out
out[1] = next_due(c)  -- next_due_ms
out[2] = c.missed  -- missed
out[3] = c.skipped  -- skipped
out[4] = c.held_c  -- held_concurrency
out[5] = c.held_r  -- held_rate
return out
