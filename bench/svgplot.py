"""svgplot.py - hand-written SVG for bench/run (no plotting library): the
cold-start plot, step time over wall time while the daemon's kernels are
swapped in.

coldstart_svg(rows, path, title, subtitle) with rows of (elapsed_ms,
step_ms, tier1, tier2, kernels) draws two panels sharing the x axis
(elapsed seconds since the session was opened): step ms on a log scale,
one dot per step joined by a line, with a dashed vertical line wherever
the tier-1 or tier-2 count changed; below, the tier-1 and tier-2 counts
as step lines out of the kernel count (the rest run at tier 0).
"""

import math
from xml.sax.saxutils import escape

W, H = 900, 560
ML, MR = 70, 30           # left and right margins
TOP1, BOT1 = 70, 370      # the step-time panel
TOP2, BOT2 = 410, 510     # the tier-count panel
C_STEP, C_T1, C_T2 = "#1f5fa8", "#d9822b", "#2e9e4f"


def _nice_step(span, n=8):
    raw = span / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt(v):
    return ("%.0f" % v) if v >= 10 or v == int(v) else ("%.3g" % v)


def coldstart_svg(rows, path, title, subtitle=""):
    if not rows:
        raise ValueError("no steps to plot")
    xs = [r[0] / 1e3 for r in rows]
    ys = [max(r[1], 1e-3) for r in rows]
    kernels = max(r[4] for r in rows) or 1
    x0, x1 = 0.0, max(xs) * 1.02 or 1.0
    lo = 10 ** math.floor(math.log10(min(ys)))
    hi = 10 ** math.ceil(math.log10(max(ys)))
    if hi <= lo:
        hi = lo * 10

    def px(x):
        return ML + (x - x0) / (x1 - x0) * (W - ML - MR)

    def py(y):
        return BOT1 - (math.log10(y) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) \
            * (BOT1 - TOP1)

    def py2(c):
        return BOT2 - c / kernels * (BOT2 - TOP2)

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">' % (W, H, W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>'
           % (ML, escape(title))]
    if subtitle:  # at most two lines, broken at "; "
        lines, cur = [], ""
        for part in subtitle.split("; "):
            if cur and len(cur) + len(part) > 120:
                lines.append(cur + ";")
                cur = part
            else:
                cur = cur + "; " + part if cur else part
        lines.append(cur)
        for k, ln in enumerate(lines[:2]):
            out.append('<text x="%d" y="%d" fill="#555">%s</text>' % (ML, 38 + 14 * k, escape(ln)))
    # frames
    for top, bot in ((TOP1, BOT1), (TOP2, BOT2)):
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>'
                   % (ML, top, W - ML - MR, bot - top))
    # x grid and labels (both panels)
    xstep = _nice_step(x1 - x0)
    x = 0.0
    while x <= x1 + 1e-9:
        X = px(x)
        for top, bot in ((TOP1, BOT1), (TOP2, BOT2)):
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>'
                       % (X, top, X, bot))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                   % (X, BOT2 + 16, _fmt(x)))
        x += xstep
    out.append('<text x="%d" y="%d" text-anchor="middle">elapsed s since the session '
               'was opened</text>' % ((ML + W - MR) // 2, BOT2 + 36))
    # y grid (decades, with 2 and 5) and labels
    d = lo
    while d <= hi * 1.0001:
        for m in (1, 2, 5):
            v = d * m
            if v < lo or v > hi * 1.0001:
                continue
            Y = py(v)
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>'
                       % (ML, Y, W - MR, Y, "#ddd" if m == 1 else "#f2f2f2"))
            out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                       % (ML - 6, Y + 4, _fmt(v)))
        d *= 10
    out.append('<text x="18" y="%d" transform="rotate(-90 18 %d)" text-anchor="middle">'
               'ms per step (log)</text>' % ((TOP1 + BOT1) // 2, (TOP1 + BOT1) // 2))
    for c in (0, kernels):
        out.append('<text x="%d" y="%.1f" text-anchor="end">%d</text>' % (ML - 6, py2(c) + 4, c))
    out.append('<text x="18" y="%d" transform="rotate(-90 18 %d)" text-anchor="middle">'
               'kernels</text>' % ((TOP2 + BOT2) // 2, (TOP2 + BOT2) // 2))
    # where the tier counts change
    prev = (0, 0)
    for r, x in zip(rows, xs):
        if (r[2], r[3]) != prev:
            X = px(x)
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" '
                       'stroke-dasharray="3,3"><title>%.1f s: tier1 %d, tier2 %d of %d'
                       '</title></line>' % (X, TOP1, X, BOT1, x, r[2], r[3], r[4]))
            prev = (r[2], r[3])
    # the step times
    pts = " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in zip(xs, ys))
    out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.2"/>'
               % (pts, C_STEP))
    if len(rows) <= 2000:
        for x, y in zip(xs, ys):
            out.append('<circle cx="%.1f" cy="%.1f" r="2" fill="%s"/>' % (px(x), py(y), C_STEP))
    # the tier counts as step lines
    for idx, color in ((2, C_T1), (3, C_T2)):
        p, last = [], None
        for r, x in zip(rows, xs):
            if last is not None:
                p.append("%.1f,%.1f" % (px(x), py2(last)))
            p.append("%.1f,%.1f" % (px(x), py2(r[idx])))
            last = r[idx]
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>'
                   % (" ".join(p), color))
    # legend
    lx = W - MR - 250
    for k, (color, label) in enumerate(((C_STEP, "ms per step"),
                                        (C_T1, "kernels at tier 1 (the daemon's default)"),
                                        (C_T2, "kernels at tier 2 (tuned)"))):
        y = TOP1 + 16 + 16 * k
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                   % (lx, y - 4, lx + 18, y - 4, color))
        out.append('<text x="%d" y="%d">%s</text>' % (lx + 24, y, escape(label)))
    out.append('</svg>')
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
