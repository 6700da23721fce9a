#!/usr/bin/env python3
"""The docs tier's second half (scripts/docs-test.sh): every result a
comment in the docs states is checked against what the statement printed.

A statement whose last line ends in a comment `-- => <result>` states its
result, as it prints (psql's aligned output in the pg_regress results):

    SELECT next_scoped_id('demo-queue', 'request');        -- => 1
    INSERT ... RETURNING no;                                -- => 3, 4
    INSERT ... RETURNING shop, no;                          -- => (shop-17, 1), (shop-18, 1)
    SELECT * FROM event WHERE what = 'x';                   -- => (0 rows)
    SELECT number_rows('t', 'number', 'q', domain => 'd'); -- => ERROR 42703: column "number"

`<result>` is one value per row, in order, joined by ", " (the row's only
column, or for one row all its columns); whole rows in parentheses;
`(0 rows)`; or `ERROR <SQLSTATE>: <text>`, where the error's SQLSTATE must
be that and its message must contain the text (docs-test.sh echoes psql's
:SQLSTATE after such a statement). Usage: docs-check.py [--catalog CATALOG.out reference.md] RESULT.out...
(exit 1 and a line per mismatch). With --catalog, also: the state tables
reference.md lists are those of the catalog, each with its columns."""

import re
import sys

STATED = re.compile(r"--\s*=>\s*(.*?)\s*$")


def result_after(lines, i):
    """The output printed after the echoed statement ending at line i:
    ('error', message), ('rows', [[cells]]), or ('none', None)."""
    j = i + 1
    if j < len(lines) and lines[j].startswith("ERROR:"):
        message = lines[j][len("ERROR:"):].strip()
        # The SQLSTATE line docs-test.sh added after the statement.
        for k in range(j + 1, min(j + 12, len(lines))):
            if lines[k].startswith("SQLSTATE "):
                return "error", lines[k].split()[1] + ": " + message
        return "error", "?????: " + message
    # A table: a header, a separator of dashes, rows, "(N rows)".
    if j + 1 < len(lines) and re.match(r"^-+(\+-+)*$", lines[j + 1].strip()):
        rows = []
        k = j + 2
        while k < len(lines) and not re.match(r"^\(\d+ rows?\)$", lines[k].strip()):
            rows.append([cell.strip() for cell in lines[k].split("|")])
            k += 1
        return "rows", rows
    return "none", None


CHECKED = 0


def check(path):
    global CHECKED
    failures = []
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        stated = STATED.search(line)
        # Only a statement's last line (it ends in ';' before the comment).
        if not stated or not line[: stated.start()].rstrip().endswith(";"):
            continue
        expected = stated.group(1)
        CHECKED += 1
        kind, value = result_after(lines, i)
        ok = False
        error = re.match(r"^ERROR ([0-9A-Z]{5}): (.+)$", expected)
        if expected.startswith("ERROR"):
            ok = (error is not None and kind == "error"
                  and value.startswith(error.group(1) + ": ") and error.group(2) in value)
        elif expected == "(0 rows)":
            ok = kind == "rows" and value == []
        elif kind == "rows" and expected.startswith("("):
            want = [[v.strip() for v in row.split(",")] for row in re.findall(r"\(([^()]*)\)", expected)]
            ok = value == want
        elif kind == "rows":
            want = [v.strip() for v in expected.split(",")]
            first_column = [row[0] for row in value]
            ok = first_column == want or (len(value) == 1 and value[0] == want)
        if not ok:
            failures.append(f"{path}:{i + 1}: {line.strip()}\n    states {expected!r}, printed {kind}: {value!r}")
    return failures


TYPES = {"text", "bigint", "integer", "timestamptz", "boolean", "bytea", "oid", "regrole", "regclass", "char"}


def check_catalog(catalog_out, reference_md):
    """reference.md's "State tables" table names every table and sequence of
    schema pgticket, each with exactly its columns."""
    failures = []
    catalog = {}
    for line in open(catalog_out, encoding="utf-8"):
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 2 and cells[0] and not cells[0].startswith(("state_table", "-", "(")):
            catalog[cells[0]] = set(cells[1].split())
    text = open(reference_md, encoding="utf-8").read()
    section = re.search(r"^## State tables\n(.*?)(?=^## )", text, re.S | re.M)
    documented = {}
    for row in re.findall(r"^\| `pgticket\.(\w+)` \| ([^|]*) \|", section.group(1) if section else "", re.M):
        documented[row[0]] = set(re.findall(r"[a-z_]+", row[1])) - TYPES
    if not catalog:
        failures.append(f"{catalog_out}: no state tables read")
    for table in sorted(set(catalog) | set(documented)):
        if table not in documented:
            failures.append(f"docs/reference.md, State tables: pgticket.{table} is missing")
        elif table not in catalog:
            failures.append(f"docs/reference.md, State tables: pgticket.{table} is not a state table")
        elif catalog[table] != documented[table]:
            failures.append(
                f"docs/reference.md, State tables: pgticket.{table} has columns {sorted(catalog[table])}, "
                f"the docs say {sorted(documented[table])}"
            )
    return failures


def main():
    args = sys.argv[1:]
    failures = []
    if args[:1] == ["--catalog"]:
        failures += check_catalog(args[1], args[2])
        args = args[3:]
    failures += [f for path in args for f in check(path)]
    for f in failures:
        print(f)
    if failures:
        print(f"docs-check: {len(failures)} mismatches ({CHECKED} stated results read)")
        sys.exit(1)
    print(f"docs-check: {CHECKED} stated results are what ran")


if __name__ == "__main__":
    main()
