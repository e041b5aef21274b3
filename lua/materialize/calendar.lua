-- materialize/calendar.lua: the data interval of a schedule's run, and the occurrences a
-- business calendar excluded (recorded once each as a skipped run, counted on the schedule).
-- Tested by: tests/integration/test_calendars.py

-- A run's data interval: from the trigger's previous occurrence (calendar applied) to its own.
-- `start` '' (or absent): no interval (a manual run); '0': its trigger had no occurrence before.
local function add_interval(fields, start, occ)
  if start and start ~= '' then
    if start ~= '0' then
      fields[#fields + 1] = 'interval_start'; fields[#fields + 1] = start
    end
    fields[#fields + 1] = 'interval_end'; fields[#fields + 1] = occ
  end
end

-- ARGV[from..] pairs (run id, occurrence ms): a `skipped` run for each that has no record
-- yet, in the done index, with the reason naming the calendar and its version.
local function record_excluded(prefix, name, sched_key, cal, from, now, done_key, events_key)
  local reason = 'excluded by calendar ' .. cal
  local n = 0
  for i = from, #ARGV - 1, 2 do
    local run_id, occ = ARGV[i], ARGV[i + 1]
    local run_key = prefix .. K.run .. run_id
    if redis.call('EXISTS', run_key) == 0 then
      redis.call('HSET', run_key, 'id', run_id, 'state', 'skipped', 'created', now,
        'due', occ, 'occurrence', occ, 'attempt', 0, 'fence', 0, 'schedule', name,
        'finished', now, 'reason', reason, 'calendar', cal)
      redis.call('ZADD', done_key, now, run_id)
      emit(events_key, run_id, 'skipped', reason)
      n = n + 1
    end
  end
  if n > 0 then
    redis.call('HINCRBY', sched_key, 'skipped_count', n)
    redis.call('HINCRBY', sched_key, 'excluded_count', n)
  end
end
