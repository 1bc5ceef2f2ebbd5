"""The reports' document model (a list of blocks rendered to Markdown and HTML) and the number formats every
report shares, so that one number prints the same wherever it appears.

Blocks: ("h1" | "h2", text), ("p", text), ("ul", [items]), ("code", text), ("img", alt, path),
("table", headers, rows). Inline Markdown in text: `code`, **bold**, [link](#anchor).
"""
from __future__ import annotations

import html
import re

import numpy as np


def p_text(p: float) -> str:
    """A p-value: three decimals, "< 0.001" below that, n/a when undefined."""
    return "n/a" if p is None or not np.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def margin_text(m: float) -> str:
    return f"±{m:.3g}" if np.isfinite(m) else "none"


def fit_param(row, name: str) -> str:
    """A fitted parameter of a scaling table row: its value, or "not identifiable (E at bound 0)" when the fit left it
    at a bound (analysis/scaling.py); A is not identifiable when E or alpha is not."""
    flags = [f for f in str(row.get("not_identifiable") or "").split("; ") if f]
    mine = [f for f in flags if f.startswith(f"{name} at bound")] if name != "A" else flags
    return f"not identifiable ({'; '.join(mine)})" if mine else sci(row[name])


def identifiability_blocks(table) -> list:
    """A note naming the scaling fits with a parameter at its bound (empty when every fit is identifiable)."""
    flagged = [(r["arm"], r["not_identifiable"]) for _, r in table.iterrows()
               if str(r.get("not_identifiable") or "") not in ("", "nan")]
    if not flagged:
        return []
    return [("p", "**Not identifiable**: " + "; ".join(f"`{a}` ({why})" for a, why in flagged) + ". The least-squares "
                  "optimum lies on a bound of the fit, so the data do not determine that parameter (any value past "
                  "the bound fits as well); its number is not a result, and neither is an extrapolation of that law.")]


def sci(v: float) -> str:
    """Three significant digits; ∞ for infinity, n/a for NaN."""
    if not np.isfinite(v):
        return "∞" if v == np.inf else "n/a"
    return f"{v:.3g}"


def _md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------- document model (rendered to md and html)
def _md_inline_to_html(text: str) -> str:
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\[([^\]]+)\]\((#[a-z0-9-]+)\)", r'<a href="\2">\1</a>', out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def render_markdown(blocks) -> str:
    parts = []
    for b in blocks:
        kind = b[0]
        if kind == "h1":
            parts.append(f"# {b[1]}")
        elif kind == "h2":
            parts.append(f"## {b[1]}")
        elif kind == "p":
            parts.append(b[1])
        elif kind == "ul":
            parts.append("\n".join(f"- {item}" for item in b[1]))
        elif kind == "code":
            parts.append(f"```\n{b[1]}\n```")
        elif kind == "img":
            parts.append(f"![{b[1]}]({b[2]})")
        elif kind == "table":
            headers, rows = b[1], b[2]
            lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |",
                     "|" + "|".join("---" for _ in headers) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
            parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}code,pre{background:#f6f6f6}pre{padding:.6em}"""


def render_html(blocks, title: str) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>{html.escape(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>"]
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2"):
            anchor = re.sub(r"[^a-z0-9]+", "-", b[1].lower()).strip("-")
            parts.append(f'<{kind} id="{anchor}">{_md_inline_to_html(b[1])}</{kind}>')
        elif kind == "p":
            parts.append(f"<p>{_md_inline_to_html(b[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{_md_inline_to_html(i)}</li>" for i in b[1]) + "</ul>")
        elif kind == "code":
            parts.append(f"<pre><code>{html.escape(b[1])}</code></pre>")
        elif kind == "img":
            parts.append(f'<p><img src="{html.escape(b[2])}" alt="{html.escape(b[1])}"></p>')
        elif kind == "table":
            head = "".join(f"<th>{_md_inline_to_html(str(h))}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(f"<td>{_md_inline_to_html(str(c))}</td>" for c in r) + "</tr>"
                           for r in b[2])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


