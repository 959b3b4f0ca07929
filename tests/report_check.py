#!/usr/bin/env python3
"""report_check.py NEOFLOW NEOFLOWD - the training report as a person sees
it (client/report.c, docs/report.md).

A short Fashion-MNIST run (examples/fashion_mlp.nf, until its kernels are
tuned, on a private daemon with a small budget) with --report DIR leaves
DIR/report.html, and then:
  - the page has each section (summary, step time, loss, test accuracy,
    the partitioned graph, tuning curves, the profile), a box per op in the
    graph, a mark per kernel arrival, a tuning curve per tuned entry;
  - every inline SVG parses as XML; the page has no script and fetches
    nothing (no http(s) address but the SVG namespace);
  - headless Chromium (Debian's chromium, which the test command installs)
    renders it to a screenshot and logs no error from the page (a console
    message, a resource that failed); where Chromium cannot start, this
    part is skipped with a message and the rest still runs.

Exit 77 (skipped) without the Fashion-MNIST files or the daemon."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ui_check_util import PrivateDaemon, check, failures  # noqa: E402

NEOFLOW, NEOFLOWD = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def browser():
    for b in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(b):
            return shutil.which(b)
    return None


def main():
    if not NEOFLOWD or not os.path.exists(NEOFLOWD):
        print("report: skipped: no neoflowd in this build")
        return 77
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("report: skipped: no Fashion-MNIST (Debian's dataset-fashion-mnist)")
        return 77
    tmp = tempfile.mkdtemp(prefix="nf_report_")
    env = dict(os.environ, NEOFLOW_LIB=os.path.join(ROOT, "lib"), NEOFLOW_CONFIG="none",
               NEOFLOW_VERIFIED="none")
    d = PrivateDaemon(NEOFLOWD, tmp, env)
    sock = d.sock
    try:
        out = os.path.join(tmp, "out")
        r = subprocess.run([NEOFLOW, "train", os.path.join(ROOT, "examples", "fashion_mlp.nf"),
                            "mlp", "--data", "fashion-mnist", "--steps", "20000", "--until-tuned",
                            "20", "--tune-trials", "4", "--threads", "1", "--daemon", sock,
                            "--no-spawn", "--report", out], env=env, capture_output=True,
                           text=True, timeout=400)
        page = os.path.join(out, "report.html")
        check(r.returncode == 0 and ("report: " + page) in r.stdout,
              "neoflow train --report trains and prints the page's path (%s)"
              % (r.stdout[-300:] + r.stderr[-300:]))
        if not os.path.exists(page):
            return 1
        html = open(page, encoding="utf-8").read()
        ids = re.findall(r'<section id="([^"]+)"', html)
        for want in ("summary", "step-time", "loss", "graph", "tuning", "profile"):
            check(want in ids, "the page has its %s section" % want)
        check("test accuracy" in html and any(i.startswith("metric-") for i in ids),
              "the test accuracy has a chart of its own")
        svgs = re.findall(r"<svg\b.*?</svg>", html, re.S)
        bad = []
        for s in svgs:
            try:
                ET.fromstring(s)
            except ET.ParseError as e:
                bad.append(str(e))
        check(len(svgs) >= 5 and not bad, "%d inline SVGs, each parses (%s)" % (len(svgs), bad[:2]))
        boxes = html.count('class="box"')
        ops = re.search(r"<p>(\d+) ops in (\d+) layers", html)
        check(ops and boxes == int(ops.group(1)) and boxes > 5,
              "the graph draws a box per op (%d boxes, %s)" % (boxes, ops.group(0) if ops else "?"))
        check(html.count('class="edge"') >= boxes - 1, "arrows carry the data between the ops")
        check(html.count('class="arrival"') >= 5, "the kernels' arrivals are marked (%d)"
              % html.count('class="arrival"'))
        check(html.count('aria-label="tuning"') >= 1, "tuning curves are drawn (%d)"
              % html.count('aria-label="tuning"'))
        rows = html.count("<tr>") - 1
        check(rows >= 5, "the profile lists the kernels (%d rows)" % rows)
        addrs = [a for a in re.findall(r"https?://[^\"' )<]+", html)
                 if a != "http://www.w3.org/2000/svg"]
        check("<script" not in html.lower() and not addrs,
              "no script, nothing fetched (%s)" % addrs[:3])
        b = browser()
        if not b:
            print("skip  the browser checks: no chromium (Debian's chromium)")
        else:
            shot = os.path.join(tmp, "report.png")
            br = subprocess.run([b, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                 "--enable-logging=stderr", "--v=0", "--window-size=1280,3200",
                                 "--user-data-dir=" + os.path.join(tmp, "chromium"),
                                 "--screenshot=" + shot, "file://" + page],
                                capture_output=True, text=True, timeout=120)
            if br.returncode != 0 and not os.path.exists(shot):
                print("skip  the browser checks: chromium could not start (%s)"
                      % br.stderr.strip()[-300:])
            else:
                size = os.path.getsize(shot) if os.path.exists(shot) else 0
                check(size > 20000, "Chromium renders the page to a screenshot (%d bytes)" % size)
                # the page's own errors: console messages, resources that failed
                page_errors = [ln for ln in br.stderr.splitlines()
                               if "CONSOLE" in ln or "Uncaught" in ln or "Failed to load" in ln
                               or "net::ERR" in ln or "Refused to" in ln]
                check(not page_errors, "the browser logged no error from the page (%s)"
                      % page_errors[:3])
                keep = os.environ.get("NF_REPORT_SHOT")
                if keep and os.path.exists(shot):
                    shutil.copyfile(shot, keep)
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("report: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
