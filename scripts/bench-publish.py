#!/usr/bin/env python3
"""Publish a `make bench` report as BENCHMARKS.md (run by `make bench`).

    scripts/bench-publish.py target/bench/report.md [--commit SHA]

BENCHMARKS.md becomes: what is measured (kept from the page), a summary
table (each allocator against its anchor from the same run, the ratio, the
bar it must reach, and the previous run's ratio), the chart
bench/summary.svg drawn from that table with matplotlib, then the new full
report. The full report it replaces moves to bench/history/. The summary is
read from the reports themselves, so an older report in the same format
gives the previous column.

matplotlib comes from PyPI into target/bench/venv (scripts/bench.sh
makes it); without it the chart is skipped with a message, the page is
still written."""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from dataclasses import dataclass

root = pathlib.Path(__file__).resolve().parent.parent
page = root / "BENCHMARKS.md"
chart = root / "bench" / "summary.svg"
history = root / "bench" / "history"
REPORT_HEADING = "## Latest full report"
SUMMARY_HEADING = "## Summary"


@dataclass
class Row:
    what: str
    anchor: str
    measured: str
    ratio: float | None
    unit: str  # how the ratio reads: "% of cap", "× the rate", "× the time"...
    bar: float | None
    higher_is_better: bool

    def met(self) -> str:
        if self.ratio is None or self.bar is None:
            return ""
        ok = self.ratio >= self.bar if self.higher_is_better else self.ratio <= self.bar
        return "yes" if ok else "**no**"

    def against_bar(self) -> float | None:
        """The ratio as a multiple of its bar, 1.0 = exactly at it and more
        = better, whichever way the ratio reads."""
        if self.ratio is None or self.bar is None or self.ratio == 0:
            return None
        return self.ratio / self.bar if self.higher_is_better else self.bar / self.ratio


def number(text: str) -> float:
    return float(text.replace(" ", "").replace(",", ""))


def find(pattern: str, text: str) -> re.Match | None:
    return re.search(pattern, text, re.M)


def table_row(text: str, first_cells: list[str]) -> list[str] | None:
    """The cells of the first table row whose leading cells are these."""
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[: len(first_cells)] == first_cells:
            return cells
    return None


def fmt(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}".replace(",", " ")


def summarize(report: str) -> list[Row]:
    rows: list[Row] = []
    one = {}
    for name in ("snowflake", "nextval"):
        cells = table_row(report, [f"{name} × 2M"])
        if cells:
            one[name] = (number(cells[1]), number(cells[2]))
    if "snowflake" in one:
        rate = one["snowflake"][1]
        rows.append(Row("`snowflake_id()`, one backend", "the layout's cap, 4 096 000 IDs/s",
                        f"{fmt(rate / 1e6)} M IDs/s", 100 * rate / 4_096_000, "% of the cap", 95.0, True))
    m = find(r"With a leased machine id .*?: ([\d.]+) ms for 2M = (\d+) IDs/s, ([\d.]+)× the fixed id's rate", report)
    if m:
        rows.append(Row("`snowflake_id()`, a leased machine id", "the fixed id, same run",
                        f"{fmt(number(m.group(2)) / 1e6)} M IDs/s", number(m.group(3)), "× the rate", 0.99, True))
    m = find(r"The leased client generator .*?: (\d+) IDs/s = ([\d.]+)% of the layout's cap", report)
    if m:
        rows.append(Row("the leased client generator (ticket-client), one thread", "the layout's cap, 4 096 000 IDs/s",
                        f"{fmt(number(m.group(1)) / 1e6)} M IDs/s", number(m.group(2)), "% of the cap", 95.0, True))
    m = find(r"The Python package's leased generator .*?: next_id\(\) (\d+) IDs/s, next_ids\(1000\) (\d+) IDs/s", report)
    client = find(r"The leased client generator .*?: (\d+) IDs/s", report)
    if m:
        anchor = f"the Rust client, same run: {fmt(number(client.group(1)) / 1e6)} M IDs/s" if client else "the Rust client, same run"
        for what, rate, bar in (("`next_id()`", number(m.group(1)), 1.0), ("`next_ids(1000)`", number(m.group(2)), 3.0)):
            rows.append(Row(f"Python `pg_ticket.LeasedGenerator.{what[1:]}, one thread", anchor,
                            f"{fmt(rate / 1e6)} M IDs/s", rate / 1e6, "M IDs/s", bar, True))
    m = find(r"sharded_id\(1\) × 2M in one backend: ([\d.]+) ms = (\d+) IDs/s = ([\d.]+)%", report)
    if m:
        rows.append(Row("`sharded_id()`, one shard", "one shard's cap, 1 024 000 IDs/s",
                        f"{fmt(number(m.group(2)) / 1e6)} M IDs/s", number(m.group(3)), "% of the cap", 95.0, True))
    big = table_row(report, ["1000000"])
    small = table_row(report, ["100000"])
    if big:
        scoped, nextval = number(big[1]), number(big[2])
        rows.append(Row("`next_scoped_id()` × 1M in one transaction", "`nextval()` × 1M",
                        f"{fmt(scoped, 0)} ms", scoped / nextval, "× the time", 0.5, False))
        if small:
            rows.append(Row("`next_scoped_id()`, linearity", "its own 100k",
                            f"t(1M)/t(100k)", scoped / number(small[1]), "× the time", 12.0, False))
    m = find(r"next_ticket\(\) × 1M in one statement: ([\d.]+) ms = ([\d.]+)× the time", report)
    if m:
        rows.append(Row("`next_ticket()` × 1M in one statement", "`nextval()` × 1M",
                        f"{fmt(number(m.group(1)), 0)} ms", number(m.group(2)), "× the time", 1.0, False))

    def pgbench(ours: str, clients: str, sync: str) -> tuple[float, float] | None:
        """pg_ticket's median tps and the median of the pairs' ratios."""
        cells = table_row(report, [ours, sync, clients])
        return (number(cells[3]), number(cells[6])) if cells else None

    for clients in ("8", "1"):
        for sync in ("on", "off"):
            tps = pgbench("ticket_same", clients, sync)
            if tps:
                rows.append(Row(f"`next_ticket()`, pgbench {clients} client{'s' if clients != '1' else ''}, sync {sync}",
                                "`nextval()`, same run", f"{fmt(tps[0], 0)} tps", tps[1], "× the tps", 1.0, True))
    for ours, what, anchor in (
        ("snowflake", "`snowflake_id()`", "`nextval()`"),
        ("scoped_same", "`next_scoped_id()`, one scope", "the plain upsert"),
        ("scoped_distinct", "`next_scoped_id()`, a scope per client", "the plain upsert"),
        ("block", "`reserve_block(…, 100)`", "the plain `UPDATE … RETURNING`"),
    ):
        runs = [(c, s, pgbench(ours, c, s)) for c in ("1", "8") for s in ("on", "off")]
        runs = [(c, s, t[1]) for c, s, t in runs if t]
        if runs:
            c, s, low = min(runs, key=lambda r: r[2])
            bar = 1.0 if ours == "snowflake" else 0.95
            rows.append(Row(f"{what}, pgbench, lowest of 1 and 8 clients, sync on and off", f"{anchor}, same run",
                            f"{c} client{'s' if c != '1' else ''}, sync {s}", low, "× the tps", bar, True))
    cells = table_row(report, ["next_scoped_id × 1M in one transaction (ms)"])
    if cells:
        off, on = number(cells[1]), number(cells[2])
        rows.append(Row("rights per scope on, 1 000 grants", "rights off, same run",
                        f"{fmt(on, 0)} ms", on / off, "× the time", 1.05, False))
    alone = table_row(report, ["alone"])
    flood = table_row(report, ["beside a role with no cap asking new names"])
    if alone and flood:
        rows.append(Row("a victim's `next_ticket()` p99 while one role floods new names", "the victim alone",
                        f"{flood[2]} ms", number(flood[2]) / number(alone[2]), "× the p99", None, False))
    # The workers table's "alone" row is the second row named so.
    workers_alone = [l for l in report.splitlines() if l.startswith("| alone |")][1:2]
    beside = table_row(report, ["beside four databases each asking a new scope a second"])
    if workers_alone and beside:
        alone_p99 = number(workers_alone[0].strip("|").split("|")[2])
        rows.append(Row("a fifth database's `next_ticket()` p99 beside four busy ones", "the fifth alone",
                        f"{beside[2]} ms", number(beside[2]) / alone_p99, "× the p99", None, False))
    for name in ("nextval()", "next_scoped_id()", "next_ticket()", "snowflake_id()", "sharded_id()"):
        cells = table_row(report, [name])
        if cells and len(cells) == 6:
            rows.append(Row(f"`{name}` cost per ID, 10M in one statement", "its own cost at 100k",
                            f"{cells[4]} ns per ID", number(cells[5]), "× the cost", 1.2, False))
    for bits in ("10", "16"):
        cells = table_row(report, [bits])
        if cells and len(cells) == 9:
            rows.append(Row(f"`snowflake_id()` at {bits} machine bits: CPU while at full speed", "one core, same wall time",
                            f"{cells[7]} µs CPU per ID", number(cells[8]), "× a core", None, False))
    return rows


def run_heading(report: str) -> str:
    m = find(r"^## Run of (.*)$", report)
    return m.group(1).strip() if m else "an unnamed run"


def show(ratio: float | None, bar: float | None, unit: str) -> str:
    """A ratio as the table prints it: enough digits that a miss of its bar
    does not round to a hit."""
    if ratio is None:
        return "—"
    percent = unit.startswith("%")
    digits = 1 if percent else 2
    if bar is not None and round(ratio, digits) == round(bar, digits) and ratio != bar:
        digits += 1
    if not percent and not unit.startswith("×"):
        return f"{fmt(ratio, digits)} {unit}"  # a plain quantity: "2.20 M IDs/s"
    return f"{fmt(ratio, digits)}{'%' if percent else '×'} {unit.lstrip('%× ').strip()}"


def summary_table(rows: list[Row], previous: list[Row], previous_run: str | None) -> str:
    before = {r.what: r for r in previous}
    out = [
        "| what | anchor | measured | ratio to the anchor | bar | met | previous run |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bar = "—" if r.bar is None else f"{'≥' if r.higher_is_better else '≤'} {show(r.bar, None, r.unit)}"
        old = before.get(r.what)
        out.append(f"| {r.what} | {r.anchor} | {r.measured} | {show(r.ratio, r.bar, r.unit)} | {bar} | {r.met()} | {show(old.ratio if old else None, r.bar, r.unit)} |")
    return "\n".join(out)


def draw(rows: list[Row], previous: list[Row], run: str, previous_run: str | None) -> bool:
    try:
        import matplotlib

        matplotlib.use("svg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench-publish: matplotlib is not installed (scripts/bench.sh puts it in target/bench/venv); no chart", file=sys.stderr)
        return False
    plotted = [r for r in rows if r.against_bar() is not None]
    before = {r.what: r for r in previous}
    labels = [re.sub(r"`", "", r.what).replace(", lowest of 1 and 8 clients, sync on and off", " (the lowest of four)") for r in plotted]
    now = [r.against_bar() for r in plotted]
    then = [before[r.what].against_bar() if r.what in before and before[r.what].against_bar() else 0 for r in plotted]
    matplotlib.rcParams["svg.hashsalt"] = "pg_ticket"
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(plotted) + 1.6))
    y = list(range(len(plotted)))[::-1]
    height = 0.38
    ax.barh([v + height / 2 for v in y], now, height, color=["#2b7bba" if v >= 1 else "#d9534f" for v in now], label=run)
    if previous_run:
        ax.barh([v - height / 2 for v in y], then, height, color="#b8c7d6", label=previous_run)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("the ratio as a multiple of its bar (right of the line: met)")
    ax.set_title("pg_ticket: each allocator against its anchor, in one run", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlim(0, max(now + then + [1.2]) * 1.08)
    fig.tight_layout()
    chart.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(chart, format="svg", metadata={"Date": None})
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=pathlib.Path)
    parser.add_argument("--commit", default="")
    args = parser.parse_args()
    report = args.report.read_text(encoding="utf-8").strip() + "\n"
    text = page.read_text(encoding="utf-8")
    intro = text.split(SUMMARY_HEADING)[0].rstrip() + "\n"
    old_report = text.split(REPORT_HEADING, 1)[1].split("\n", 1)[1].strip() + "\n" if REPORT_HEADING in text else None
    run = run_heading(report) + (f", {args.commit}" if args.commit else "")
    rows = summarize(report)
    previous, previous_run = [], None
    if old_report:
        previous, previous_run = summarize(old_report), run_heading(old_report)
        stamp = re.sub(r"[^0-9]", "", previous_run)[:12] or "previous"
        history.mkdir(parents=True, exist_ok=True)
        (history / f"{stamp}.md").write_text(f"# Run of {previous_run}\n\n{old_report.split(chr(10), 1)[1].lstrip()}", encoding="utf-8")
    drawn = draw(rows, previous, run, previous_run)
    parts = [
        intro,
        f"{SUMMARY_HEADING}\n",
        f"From the run of {run} (the full report below){f'; the previous run: {previous_run}' if previous_run else ''}. "
        "Every ratio's anchor ran in the same run; a bar is SPEC §6's or an issue's.\n",
        summary_table(rows, previous, previous_run) + "\n",
    ]
    if drawn:
        parts.append("![Each ratio as a multiple of its bar](bench/summary.svg)\n")
    parts.append("Earlier runs: [bench/history/](bench/history/).\n")
    parts.append(f"{REPORT_HEADING}\n\n{report}")
    page.write_text("\n".join(parts), encoding="utf-8")
    print(f"bench-publish: {len(rows)} summary rows, chart {'written' if drawn else 'skipped'}, BENCHMARKS.md rewritten")


if __name__ == "__main__":
    main()
