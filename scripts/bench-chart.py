#!/usr/bin/env python3
"""An SVG line chart of rows/s over table size, one line per key kind, from
the CSV scripts/bench-inserts.sh writes (kind,quarter,table_mb,rows_per_s).
No plotting library: the chart is a few SVG elements.

    scripts/bench-chart.py CURVE.csv OUT.svg "title"
"""

import csv
import sys

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def main(path, out, title):
    series = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            series.setdefault(row["kind"], []).append((float(row["table_mb"]), float(row["rows_per_s"])))
    xmax = max(x for points in series.values() for x, _ in points) * 1.05
    ymax = max(y for points in series.values() for _, y in points) * 1.1
    width, height, left, bottom, top, right = 760, 420, 70, 50, 40, 170
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x):
        return left + plot_w * x / xmax

    def py(y):
        return top + plot_h * (1 - y / ymax)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{title}</text>',
    ]
    for i in range(6):
        y = ymax * i / 5
        parts.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + plot_w}" y2="{py(y):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y / 1000:.0f}k</text>')
    for i in range(6):
        x = xmax * i / 5
        parts.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 18}" text-anchor="middle">{x:.0f}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">table size in the middle of each quarter (MB, heap and index)</text>')
    parts.append(f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" text-anchor="middle">rows/s in the quarter</text>')
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
    for n, (kind, points) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(points))
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in points:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        ly = top + 14 + 18 * n
        parts.append(f'<line x1="{left + plot_w + 14}" y1="{ly - 4}" x2="{left + plot_w + 34}" y2="{ly - 4}" stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{left + plot_w + 40}" y="{ly}">{kind}</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
