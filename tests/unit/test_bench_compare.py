"""bench.compare: what it reads from a bench's output and how it pairs the rounds."""

from bench.compare import measures, order, table

OUTPUT = """server=redis runs=20000 repeat=1 concurrency=256 middleware=0 rtt_ms=0.0 task=noop
  drain_per_s              median   31897.93   min   31897.93   max   31897.93
  redis_cpu_us_per_run     median      28.89   min      28.89   max      28.89
  rtt_measured_ms          median       0.00   min       0.00   max       0.00
"""


def test_measures_reads_the_median_lines_only():
    assert measures(OUTPUT) == {"drain_per_s": 31897.93, "redis_cpu_us_per_run": 28.89,
                                "rtt_measured_ms": 0.0}
    assert measures("nothing here\n") == {}


def test_sides_take_turns_going_first():
    assert [order(r) for r in range(3)] == [("base", "new"), ("new", "base"), ("base", "new")]


def test_ratio_is_the_median_of_the_rounds_ratios_not_of_the_medians():
    rounds = [
        {"base": {"cpu": 50.0, "x": 1.0}, "new": {"cpu": 25.0}},  # x: only base printed it
        {"base": {"cpu": 40.0, "x": 1.0}, "new": {"cpu": 30.0}},
        {"base": {"cpu": 60.0, "x": 1.0}, "new": {"cpu": 36.0}},
    ]
    ((name, base, new, ratio),) = table(rounds)
    assert (name, base, new) == ("cpu", 50.0, 30.0)
    assert ratio == 0.6  # rounds 0.5, 0.75, 0.6: their median; the medians' ratio is 0.6 too
    rounds[2]["new"]["cpu"] = 60.0  # rounds 0.5, 0.75, 1.0
    assert table(rounds)[0][3] == 0.75  # while the medians' ratio would be 30/50 = 0.6


def test_a_zero_base_gives_no_ratio():
    rounds = [{"base": {"m": 0.0}, "new": {"m": 1.0}}]
    assert table(rounds) == [("m", 0.0, 1.0, None)]
