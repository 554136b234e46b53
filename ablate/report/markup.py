"""Number formatting and the two output markups (Markdown and self-contained HTML).

A report is a list of blocks, rendered twice: ``("h1"|"h2", text)``, ``("p", text)``,
``("ul", [text, ...])``, ``("table", (headers, rows))`` and ``("figure", (caption, png_path, file))``.
Text may use Markdown's inline spans (``**bold**``, ``*italic*``, ``code``, ``[text](file)``); the
HTML renderer converts those and escapes everything else. Figures are linked by file name in Markdown and embedded as base64 PNG in
HTML, so the HTML file needs nothing else.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Block = tuple[str, Any]


def tokens(x: float) -> str:
    """1.55e9 -> ``1.55B``, 4.2e7 -> ``42.0M``, 1234 -> ``1.23k``; NaN -> an en dash."""
    if not math.isfinite(x):
        return "–"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            v = x / div
            return (
                f"{v:.2f}{unit}"
                if abs(v) < 10
                else f"{v:.1f}{unit}"
                if abs(v) < 100
                else f"{v:.0f}{unit}"
            )
    return f"{x:.0f}"


def pct(x: float, signed: bool = True) -> str:
    if not math.isfinite(x):
        return "–"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def num(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}g}" if math.isfinite(x) else "–"


def times(x: float) -> str:
    """A ratio as ``1.20×``."""
    return f"{x:.2f}×" if math.isfinite(x) else "–"


def ratio(x: float) -> str:
    """A plain ratio as ``1.07``."""
    return f"{x:#.3g}" if math.isfinite(x) else "–"


def interval(value: float, lo: float, hi: float, fmt: Any = num) -> str:
    """``value [lo, hi]``; the value alone without an interval; ``≥ lo`` for a lower bound (an
    infinite upper end and no value)."""
    if not math.isfinite(value):
        if math.isfinite(lo) and hi == math.inf:
            return f"≥ {fmt(lo)}"
        return "–"
    if math.isfinite(lo) and math.isfinite(hi):
        return f"{fmt(value)} [{fmt(lo)}, {fmt(hi)}]"
    if math.isfinite(lo) and hi == math.inf:
        return f"{fmt(value)} [{fmt(lo)}, ∞)"
    return fmt(value)


def plus_minus(mean: float, std: float, fmt: Any = num, fmt_std: Any = None) -> str:
    """``mean ± std`` (just the mean when std is NaN, e.g. one seed)."""
    if not math.isfinite(mean):
        return "–"
    fmt_std = fmt_std or (lambda v: num(v, 2))
    return f"{fmt(mean)} ± {fmt_std(std)}" if math.isfinite(std) else fmt(mean)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (pipes in cells escaped); text columns left, others right."""

    def cell(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    numeric = [all(_numeric(r[i]) for r in rows) and bool(rows) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "| " + " | ".join("---:" if n else "---" for n in numeric) + " |",
    ]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _numeric(s: str) -> bool:
    """Numbers, units, signs, intervals: right-aligned. Anything with other letters is text."""
    s = str(s).strip()
    return bool(re.fullmatch(r"[-+–±\d.,%kMBT×x\s\[\]/]+", s)) and (
        any(c.isdigit() for c in s) or s == "–"
    )


def to_markdown(blocks: Sequence[Block]) -> str:
    out = []
    for kind, body in blocks:
        if kind == "h1":
            out.append(f"# {body}")
        elif kind == "h2":
            out.append(f"## {body}")
        elif kind == "p":
            out.append(body)
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in body))
        elif kind == "table":
            out.append(markdown_table(*body))
        elif kind == "figure":
            caption, _png, file = body
            out.append(
                f"![{caption}]({file})\n\n*{caption}* ([SVG]({Path(file).with_suffix('.svg').name}))"
            )
        else:
            raise ValueError(f"unknown block kind {kind!r}")
    return "\n\n".join(out) + "\n"


_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_ITALIC = re.compile(r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _inline(text: str) -> str:
    """Markdown's inline spans as HTML, everything else escaped: ```code``` (its content verbatim),
    ``**bold**``, ``*italic*`` (``*`` that opens and closes next to non-space, as CommonMark asks,
    so ``2 * 3`` stays text) and ``[text](url)`` links (to relative files: the report's SVGs)."""
    out = []
    for i, part in enumerate(re.split(r"`([^`]+)`", str(text))):
        if i % 2:  # inside a code span
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        s = html.escape(part, quote=False)
        s = _BOLD.sub(r"<strong>\1</strong>", s)
        s = _ITALIC.sub(r"<em>\1</em>", s)
        s = _LINK.sub(lambda m: f'<a href="{html.escape(m[2])}">{m[1]}</a>', s)
        out.append(s)
    return "".join(out)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.45; }
.table-wrap { overflow-x: auto; max-width: 100%; margin: 1em 0; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
code { background: #f3f3f3; padding: 0 0.2em; border-radius: 3px; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; height: auto; }
figcaption { font-style: italic; color: #555; }
""".strip()


def to_html(blocks: Sequence[Block], title: str) -> str:
    """One HTML page with inline CSS and the figures embedded as base64 PNG: no external reference."""
    body = []
    for kind, content in blocks:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{_inline(content)}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in content) + "</ul>")
        elif kind == "table":
            headers, rows = content
            numeric = [
                all(_numeric(r[i]) for r in rows) and bool(rows) for i in range(len(headers))
            ]
            head = "".join(f"<th>{_inline(h)}</th>" for h in headers)
            trs = [
                "<tr>"
                + "".join(
                    f'<td class="num">{_inline(c)}</td>' if n else f"<td>{_inline(c)}</td>"
                    for c, n in zip(r, numeric, strict=True)
                )
                + "</tr>"
                for r in rows
            ]
            body.append(  # a wide table scrolls inside its box instead of widening the page
                f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
                f"<tbody>{''.join(trs)}</tbody></table></div>"
            )
        elif kind == "figure":
            caption, png, _file = content
            data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
            body.append(
                f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_inline(caption)}</figcaption></figure>"
            )
        else:
            raise ValueError(f"unknown block kind {kind!r}")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{CSS}\n</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
