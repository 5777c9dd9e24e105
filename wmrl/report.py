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
