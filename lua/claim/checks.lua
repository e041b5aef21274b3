-- claim/checks.lua: which of the partition's keys a claim checks, and when. An index of the
-- wrong type (edited by hand) must refuse the call before its first write, never fail it
-- halfway (Redis does not undo the writes before an error). The keys every claim writes are
-- checked first: the leases set by TYPE, the due and retry sets by their window reads
-- (candidates.lua due_windows); the option keys with them when one exists. The keys only a
-- rare path writes -- the done, deadlines and dead sets and the events stream, written when a
-- run is finished unstarted, dead-lettered or repaired -- are checked once, just before that
-- path's first write: a plain claim sends no TYPE for them (four calls fewer per claim).
-- Tested by: tests/integration/test_damaged_keys.py, tests/integration/test_damage_fuzz.py,
--   tests/integration/test_scripts.py

-- The refusal naming `key`, which a read found not to be a `want`.
local function damaged_reply(key, want)
  return redis.error_reply('DAMAGED ' .. (wrong_type(key, want)
    or ('key ' .. key .. ' cannot be read as a ' .. want)))
end

-- Nil when the rare paths' keys are absent or of their types (checked once per call), else
-- the refusal naming the first damaged one; c.damaged keeps it, so the claim stops there.
local function rare_keys_damaged(c)
  if c.rare_checked then return c.damaged end
  c.rare_checked = true
  c.damaged = damaged_index({c.done_key, 'zset', c.deadlines_key, 'zset', c.events_key,
    'stream', c.dead_key, 'zset'})
  return c.damaged
end
