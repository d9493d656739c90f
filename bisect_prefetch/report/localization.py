"""Where a diverged run first differed, in words (metrics.localize.Localization's JSON)."""

from __future__ import annotations

from typing import Any


def in_unit(localization: dict[str, Any] | None) -> str:
    """' in layers.4 (rank 1)', or '' when the run was not localized."""
    if not localization:
        return ""
    where = "every unit" if localization.get("rule") == "every-unit" else localization["unit"]
    return f" in {where} (rank {localization['rank']})"


def describe(localization: dict[str, Any] | None) -> str:
    """'gradients first differ at step 9 in layers.4 (rank 1, layers.4.qkv.weight; 3 units
    differ at that step)', or '' when the run was not localized."""
    if not localization:
        return ""
    units = localization["units_differing"]
    if localization.get("rule") == "every-unit":  # metrics/localize.py: the order cannot tell
        return (f"gradients of every unit ({units}) first differ at step {localization['step']} "
                f"(rank {localization['rank']}): the digests cannot tell where it began; "
                "explain names the first op that differs")
    # The rule that named the unit (metrics/localize.py); records before it had none.
    if localization.get("rule") == "values":
        what, how = "parameter values", ""
    else:
        what, how = "gradients", ", first in backward order" if localization.get("rule") else ""
    return (f"{what} first differ at step {localization['step']} in {localization['unit']} "
            f"(rank {localization['rank']}, {localization['param']}{how}; "
            f"{units} unit{'s' if units != 1 else ''} differ{'' if units != 1 else 's'} at that step)")
