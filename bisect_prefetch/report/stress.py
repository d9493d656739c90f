"""The verdict's stress line (commands/bisect.py, the HTML report), from bisect's JSON `stress`."""

from __future__ import annotations

from bisect_prefetch.judge.signals import describe_stress


def stress_line(stress: dict) -> str:
    """The verdict's stress line: the setting, its step-time cost, the chance with and without."""
    cost = stress["step_time_ms"]
    if cost["ratio"] is not None:
        cost_words = (f"step time {cost['with']:.0f} ms with, {cost['without']:.0f} ms without "
                      f"(x{cost['ratio']:.2f})")
    elif cost["with"] is not None:
        cost_words = f"step time {cost['with']:.0f} ms with (without: not measured)"
    else:
        cost_words = "no step time under stress"
    used = "on" if stress["used"] else "off"
    line = f"stress: {used} (--stress {stress['mode']}); every run the verdict counts ran with stress {used}"
    if stress["chance_with"] is not None:
        without, with_ = stress["chance_without"], stress["chance_with"]
        line += (f"; per-run chance without {without['per_run_chance']:.2f} "
                 f"({without['divergences']} of {without['runs']}), with "
                 f"{with_['per_run_chance']:.2f} ({with_['divergences']} of {with_['runs']})")
    if stress["used"]:
        line += f"; {cost_words}"
    if stress["used"] and (record := describe_stress(stress.get("record"))):
        line += f"; a run's {record}"
    if stress["unstressed_search"] is not None:
        line += (f"; no drift under stress, so searched again without it: "
                 f"{stress['unstressed_search']['verdict']}")
    return line
