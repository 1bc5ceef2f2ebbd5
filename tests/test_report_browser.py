"""A generated report opened in a real browser: headless Chromium (Debian's `chromium` package; `.ci/run` installs
it) loads index.html and every <img> must have decoded (naturalWidth > 0, and down to its last row: a truncated PNG
keeps its size but leaves the bottom transparent), every link must resolve (an anchor to an id on the page, a
relative path to a file that exists).

The report is regenerated from the committed compact store of the first study (reports/first-study/mlflow.db.gz,
experiment `norms`). Chromium has no scripting hook from the command line, so the page is opened inside an iframe
of a small wrapper page (same file:// origin with --allow-file-access-from-files) whose script records what the
browser actually loaded; `--dump-dom` prints it. Without Chromium this test fails (it is part of CI, not optional).
"""
import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from analysis import report as report_mod

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
STORE_GZ = REPO / "reports" / "first-study" / "mlflow.db.gz"

WRAPPER = """<!DOCTYPE html><html><body>
<iframe id="page" src="{src}" style="width:1200px;height:900px"></iframe>
<pre id="result">not loaded</pre>
<script>
window.addEventListener("load", function () {{
  var doc = document.getElementById("page").contentDocument;
  var out = {{title: null, images: [], links: [], ids: []}};
  if (doc) {{
    out.title = doc.title;
    doc.querySelectorAll("img").forEach(function (i) {{
      // decoded down to its last row? a truncated file leaves the bottom transparent (our figures are opaque)
      var opaque = 0;
      if (i.naturalWidth > 0) {{
        var c = document.createElement("canvas");
        c.width = i.naturalWidth; c.height = i.naturalHeight;
        var g = c.getContext("2d");
        g.drawImage(i, 0, 0);
        var row = g.getImageData(0, i.naturalHeight - 1, i.naturalWidth, 1).data;
        for (var k = 3; k < row.length; k += 4) if (row[k] > 0) opaque++;
      }}
      out.images.push({{src: i.getAttribute("src"), complete: i.complete, width: i.naturalWidth,
                        height: i.naturalHeight, last_row_opaque: opaque}});
    }});
    doc.querySelectorAll("a[href]").forEach(function (a) {{
      out.links.push({{href: a.getAttribute("href"), resolved: a.href}});
    }});
    doc.querySelectorAll("[id]").forEach(function (e) {{ out.ids.push(e.id); }});
  }}
  document.getElementById("result").textContent = JSON.stringify(out);
}});
</script></body></html>
"""


def chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.fail("headless Chromium not found (looked for $CHROMIUM, chromium, chromium-browser): install Debian's "
                "package with `apt-get install -y chromium` (.ci/run does)")


def browser_view(index_html: Path, tmp_path: Path) -> dict:
    """What Chromium loaded for `index_html`: title, images (src, complete, natural size), links, element ids."""
    wrapper = tmp_path / "wrapper.html"
    wrapper.write_text(WRAPPER.format(src=index_html.resolve().as_uri()), encoding="utf-8")
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", wrapper.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="result">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"chromium printed no result (exit {proc.returncode}): {proc.stderr[-2000:]}"
    import html

    return json.loads(html.unescape(found.group(1)))


def problems(view: dict, page: Path) -> list[str]:
    """Every image that did not load and every link that does not resolve, in words."""
    bad = []
    for img in view["images"]:
        if not (img["complete"] and img["width"] > 0 and img["height"] > 0):
            bad.append(f"image {img['src']} did not load")
        elif img["last_row_opaque"] == 0:
            bad.append(f"image {img['src']} is truncated (its last row did not decode)")
    ids = set(view["ids"])
    for link in view["links"]:
        target = urlsplit(link["resolved"])
        if target.scheme != "file":
            bad.append(f"link {link['href']} leaves the report ({target.scheme})")
        elif Path(unquote(target.path)) == page.resolve():
            if target.fragment and target.fragment not in ids:
                bad.append(f"link {link['href']}: no element with id {target.fragment!r}")
        elif not Path(unquote(target.path)).exists():
            bad.append(f"link {link['href']}: no file {unquote(target.path)}")
    return bad


@pytest.fixture(scope="module")
def first_study_report(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("browser_report")
    db = work / "mlflow.db"
    db.write_bytes(gzip.decompress(STORE_GZ.read_bytes()))
    out = work / "norms"
    assert report_mod.main(["norms", "--tracking-uri", f"sqlite:///{db}", "--out", str(out)]) == 0
    return out


def test_every_figure_loads_and_every_link_resolves(first_study_report, tmp_path):
    page = first_study_report / "index.html"
    view = browser_view(page, tmp_path)
    assert view["title"] == "Ablation report: experiment `norms`"
    # every figure file of the report is shown, and Chromium decoded each one
    figures = sorted(p.name for p in (first_study_report / "figures").glob("*.png"))
    assert sorted(Path(i["src"]).name for i in view["images"]) == figures and len(figures) == 6
    assert view["links"], "the report links to its own sections"
    assert problems(view, page) == []


def test_the_check_catches_a_broken_figure_and_a_dead_link(first_study_report, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(first_study_report, broken)
    (broken / "figures" / "loss_vs_time.png").unlink()
    (broken / "figures" / "loss_vs_step.png").write_bytes(b"not a png")
    cut = broken / "figures" / "loss_vs_tokens.png"
    cut.write_bytes(cut.read_bytes()[:20_000])
    text = (broken / "index.html").read_text(encoding="utf-8")
    text = text.replace("</body>", '<p><a href="summary.csv">ok</a> <a href="missing.csv">dead</a> '
                                   '<a href="#nowhere">dead anchor</a></p></body>')
    (broken / "index.html").write_text(text, encoding="utf-8")
    found = problems(browser_view(broken / "index.html", tmp_path), broken / "index.html")
    assert sorted(found) == sorted([
        "image figures/loss_vs_time.png did not load",
        "image figures/loss_vs_step.png did not load",
        "image figures/loss_vs_tokens.png is truncated (its last row did not decode)",
        f"link missing.csv: no file {broken.resolve() / 'missing.csv'}",
        "link #nowhere: no element with id 'nowhere'",
    ])
