"""The eval's chart: accuracy against cost per item, one point per strategy with its 95% interval,
drawn by matplotlib (the `plot` extra) as chart.png and chart.svg.

Without matplotlib the eval still runs and says how to get the chart. When a provider has no price
the cost is unknown, and the x axis shows tokens per item instead, labelled so.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

PNG: Final = "chart.png"
SVG: Final = "chart.svg"
MISSING: Final = "chart skipped: matplotlib is not installed (pip install 'conclave[plot]')"


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def draw(summary: Mapping[str, Any], out: Path) -> tuple[str, str]:
    """Write chart.png and chart.svg into `out`; their names. Needs `available()`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never a window, never a display
    import matplotlib.pyplot as plt

    rows = [row for row in summary["strategies"] if row["accuracy"] is not None]
    by_cost = all(row["cost_usd_per_item"] is not None for row in rows)
    key, label = (
        ("cost_usd_per_item", "cost per item (USD)") if by_cost else ("tokens_per_item", "tokens per item")
    )
    figure, axes = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    try:
        for row in rows:
            x, y = row[key] or 0.0, row["accuracy"]
            below, above = y - row["ci_low"], row["ci_high"] - y
            marker, color = (
                ("o", "#4c72b0") if row["strategy"].startswith(("single:", "sc:")) else ("D", "#c44e52")
            )
            axes.errorbar(x, y, yerr=[[below], [above]], fmt=marker, capsize=4, color=color)
            axes.annotate(row["strategy"], (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
        axes.set_xlabel(label)
        axes.set_ylabel("accuracy (95% Wilson interval)")
        axes.set_ylim(0, 1.05)
        axes.set_xlim(left=0)
        axes.grid(alpha=0.3)
        axes.set_title(f"{summary['suite']}: {summary['items']} items", fontsize=10)
        figure.tight_layout()
        figure.savefig(out / PNG)
        figure.savefig(out / SVG, metadata={"Date": None})  # the same run draws the same file
    finally:
        plt.close(figure)
    return PNG, SVG
