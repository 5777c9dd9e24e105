"""Small self-contained HTML reports for run folders (people would rather look than read)."""

from __future__ import annotations

import html
from pathlib import Path

from wmrl.core.io import atomic_path


def metrics_table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = ""
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c, "")
            cells.append(f"<td>{v:.2f}</td>" if isinstance(v, float) else f"<td>{html.escape(str(v))}</td>")
        body += "<tr>" + "".join(cells) + "</tr>"
    return f"<table><tr>{head}</tr>{body}</table>"


def write_report(path: Path, title: str, sections: list[tuple[str, str]]) -> Path:
    """sections: (heading, html body). Media paths inside bodies should be relative to `path`'s folder."""
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
             "img{image-rendering:pixelated;margin:4px}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"]
    for heading, body in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{body}")
    parts.append("</body></html>")
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))
    return path


def plot_curves(metrics_jsonl: Path, path: Path, keys: list[str | tuple[str, ...]], title: str = "",
                x: str = "step") -> Path | None:
    """One panel per metric key, from a run's metrics.jsonl (records that carry `x` and the key); a tuple of keys
    shares one panel (e.g. a training loss and its held-out value), titled by its first key."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(line) for line in Path(metrics_jsonl).read_text().splitlines() if line.strip()]
    panels = []
    for group in keys:
        group = (group,) if isinstance(group, str) else tuple(group)
        series = {k: [(r[x], r[k]) for r in recs if x in r and isinstance(r.get(k), (int, float))] for k in group}
        series = {k: v for k, v in series.items() if v}
        if series:
            panels.append((group[0], series))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels):
        for k, v in series.items():
            ax.plot(*zip(*v), marker="." if len(series) == 1 else None, label=k)
        if len(series) > 1:
            ax.legend(fontsize=7)
        ax.set(xlabel=x, title=name)
        ax.xaxis.set_major_locator(plt.MaxNLocator(4))  # five-digit steps: fewer ticks, or the labels run together
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
