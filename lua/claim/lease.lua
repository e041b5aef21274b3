-- claim/lease.lua: a run starts. It gets a new fence token and attempt number, and a lease:
-- its score in T:leases is the expiry (written with the batch, claim/index.lua), the run
-- hash's worker and fence say who holds it. The attempt's history entry is written when the
-- attempt ends; while it runs, the run hash holds worker, fence and start.
-- Tested by: tests/integration/test_scripts.py, tests/unit/test_script_assembly.py

-- The reply's last field of a run: '' for a plain run, else its optional fields, in the order
-- of common/transitions.py CLAIM_EXTRA_FIELDS (a test reads the `-- name` of each `x[N]` line).
-- Most runs have none of them: the reply then carries 5 values per run, not 14 (each value
-- is a reply element Redis writes and the worker decodes). `bare` ('1', or '' for a plain
-- run) says the run has no schedule, no batch and holds no limit slot (`held`, the scopes
-- this claim took): fields that never change while the attempt runs, so the worker's report
-- of its success passes it on and complete.lua does not look them up (three fields fewer
-- asked of the record; each absent one scans it whole).
local function reply_extra(f, held)
  local bare = not (f[3] or f[19] or held ~= '')
  if bare and not (f[10] or f[11] or f[12] or f[14] or f[15] or f[16] or f[17] or f[18]) then
    return ''
  end
  local x = {'', '', '', '', '', '', '', '', '', ''}
  x[1] = f[10] or ''  -- timeout_ms
  x[2] = f[11] or ''  -- idempotent
  x[3] = f[12] or ''  -- key
  x[4] = f[3] or ''  -- schedule
  x[5] = f[14] or ''  -- limited_by
  x[6] = f[15] or ''  -- interval_start
  x[7] = f[16] or ''  -- interval_end
  x[8] = f[17] or ''  -- tenant
  x[9] = f[18] or ''  -- headers
  x[10] = bare and '1' or ''  -- bare
  return x
end

-- The step that starts a run, bound once per call to the claim `c` (its values become the
-- function's upvalues: no table lookup per run). start(id, run_key, f, ready, deadline,
-- scopes, plain): `f` are the run's fields as admit read them, `ready` its score (when it became
-- claimable), `deadline` its starting deadline entry to clear, `scopes` the limits it counts
-- against (nil when no limit is set). The run goes to the reply; the reply's fields per run,
-- in this order, are common/transitions.py CLAIM_RUN_FIELDS (a test reads the `-- name` of
-- each `out[o + N]` line below).
local function lease_starter(c)
  local worker, now, now_s, until_s = c.worker, c.now, c.now_s, c.until_s
  local out, leased, deadlines_key = c.out, c.leased, c.deadlines_key
  return function(id, run_key, f, ready, deadline, scopes, plain)
    -- a first claim (no fence, no attempt yet): '1' as it is, no number formatted; a plain
    -- run (admit's fourth value) is one, with no limit and nothing optional to reply
    local fence_s, attempt_s, held = '1', '1', ''
    if not plain then
      if f[5] then fence_s = int_s((tonumber(f[5]) or 0) + 1) end
      if f[6] then attempt_s = int_s((tonumber(f[6]) or 0) + 1) end
      held = scopes and take(c, scopes, id) or ''
    end
    -- claimed ahead of its due time: the attempt starts at the due time (the score; its
    -- record keeps whole ms: one kept to the microsecond, format 4, is rounded up)
    local started = now_s
    if tonumber(ready) > now then started = ceil_s(ready) end
    if held == '' then
      redis.call('HSET', run_key, 'state', 'running', 'fence', fence_s, 'attempt',
        attempt_s, 'worker', worker, 'started', started)
    else  -- the concurrency slots it took, freed when the attempt ends
      redis.call('HSET', run_key, 'state', 'running', 'fence', fence_s, 'attempt',
        attempt_s, 'worker', worker, 'started', started, 'held', held)
    end
    if deadline then redis.call('ZREM', deadlines_key, id) end
    leased[#leased + 1] = until_s
    leased[#leased + 1] = id
    -- head: fence, attempt, ready and the run id joined in one value (5 reply values per
    -- run, not 8: each is an element the server writes and the worker decodes)
    local o = #out
    out[o + 1] = fence_s .. ' ' .. attempt_s .. ' ' .. ready .. ' ' .. id  -- head
    out[o + 2] = f[7] or ''  -- task
    out[o + 3] = f[8] or ''  -- payload
    out[o + 4] = f[9] or ''  -- due_ms
    out[o + 5] = plain and '' or reply_extra(f, held)  -- extra
  end
end
