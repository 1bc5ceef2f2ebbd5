"""The reports' document model (a list of blocks rendered to Markdown and HTML) and the number formats every
report shares, so that one number prints the same wherever it appears. No other module of analysis/ defines a
number format: they all call these.

Blocks: ("h1" | "h2" | "h3", text), ("p", text), ("ul", [items]), ("code", text), ("img", alt, path),
("table", headers, rows). Inline Markdown in text: `code`, **bold**, [link](#anchor).
"""
from __future__ import annotations

import html
import re

import numpy as np


MINUS = "−"  # U+2212: signed numbers in verdict tables line up with their plus signs


def _finite(v) -> bool:
    return v is not None and bool(np.isfinite(v))


def fixed(v: float, digits: int = 4, inf: str = "n/a") -> str:
    """A number at fixed decimals (losses, bpb: 4); `inf` for +infinity (e.g. "inf (diverged)"), n/a otherwise."""
    if v is not None and v == np.inf:
        return inf
    return f"{v:.{digits}f}" if _finite(v) else "n/a"


def signed(v: float, digits: int = 4) -> str:
    """A difference with its sign, the minus typographic: +0.0123, −0.0456."""
    return "n/a" if not _finite(v) else ("+" if v >= 0 else MINUS) + f"{abs(v):.{digits}f}"


def signed_ascii(v: float, digits: int = 4) -> str:
    """A difference with an ASCII sign (+0.0123, -0.0456): the context-length and floor tables print these."""
    return f"{v:+.{digits}f}"


def ci_text(lo: float, hi: float, digits: int = 4) -> str:
    """A confidence interval of a difference: [−0.0533, +0.0339]; n/a when undefined."""
    return "n/a" if not _finite(lo) else f"[{signed(lo, digits)}, {signed(hi, digits)}]"


def mean_std(mean: float, std: float, digits: int = 4) -> str:
    """mean ± std over seeds; the mean alone when the std is undefined (one seed)."""
    return fixed(mean, digits) + ("" if not _finite(std) else f" ± {fixed(std, digits)}")


def value(v: float, kind: str) -> str:
    """A per-variant metric by kind: loss (4 decimals), pct (MFU), int (counts, bytes), rate (3 significant digits
    below 10, one decimal below 1000, thousands separators above)."""
    if not _finite(v):
        return "n/a"
    if kind == "loss":
        return f"{v:.4f}"
    if kind == "pct":
        return f"{100 * v:.2f}%" if abs(v) >= 0.001 else f"{100 * v:.2g}%"
    if kind == "int" or abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def signed_value(v: float, kind: str) -> str:
    s = value(abs(v), kind)
    return s if s == "n/a" else ("+" if v >= 0 else MINUS) + s


def lr_text(x: float) -> str:
    """A learning rate: 3 significant digits, scientific below 1e-3."""
    return f"{x:.3g}" if x >= 1e-3 else f"{x:.2e}"


def run_counts(values) -> list[str]:
    """"`value`: n run(s)" per distinct value (sorted), for provenance lists."""
    counts: dict = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return [f"`{k}`: {n} run{'s' if n != 1 else ''}" for k, n in sorted(counts.items())]


def machine_of(runs):
    """A Series: each run's machine (tag device_name: the GPU, else the CPU model); None without that column. The
    same config and seed on another machine is another trajectory (other kernels round differently)."""
    return runs["device_name"].fillna("(not recorded)").astype(str) if "device_name" in runs else None


def machine_counts(runs, group: str) -> list[str]:
    """"`machine`: n runs (the `group` values that ran there)" per machine (`machine_of`), for provenance lists."""
    machines = machine_of(runs)
    if machines is None or not len(runs):
        return []
    out = []
    for m in sorted(set(machines)):
        groups = sorted({str(g) for g in runs.loc[machines == m, group]})
        n = int((machines == m).sum())
        out.append(f"`{m}`: {n} run{'s' if n != 1 else ''} ({', '.join(groups)})")
    return out


def params_vs(params: float, base: float) -> str:
    """Whether an arm's parameter count differs from the baseline's: same / **differs** with both counts / n/a."""
    if not (_finite(params) and _finite(base)):
        return "n/a"
    if params == base:
        return "same"
    return f"**differs**: {params:,.0f} vs {base:,.0f} ({100 * (params / base - 1):+.1f}%)"


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


def multiplier_text(row) -> str:
    """A scaling table row's compute multiplier with its bootstrap CI (baseline, ∞, or why there is none)."""
    if row["is_baseline"]:
        return "baseline"
    if np.isfinite(row["multiplier"]) or row["multiplier"] == np.inf:
        return f"{sci(row['multiplier'])} [{sci(row['multiplier_ci_low'])}, {sci(row['multiplier_ci_high'])}]"
    return "n/a (baseline law not identifiable)"


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


HEADINGS = {"h1": 1, "h2": 2, "h3": 3}


def render_markdown(blocks) -> str:
    parts = []
    for b in blocks:
        kind = b[0]
        if kind in HEADINGS:
            parts.append(f"{'#' * HEADINGS[kind]} {b[1]}")
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
        if kind in HEADINGS:
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


