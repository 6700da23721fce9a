"""The Python examples of docs/python.md and the package's README, as
written: a block that is a program runs against a registry (its DSN from
PG_TICKET_DSN, as the examples read it); a block headed "# ... project code
(PATH)" is a whole file of the test suite's Django app, word for word (with
its imports: a reader can copy it; #48 item 2), which test_django.py runs. The README's
example also runs in a fresh venv with nothing but the wheel installed."""

import os
import re
import subprocess
import sys
import venv

import pytest

from conftest import ROOT

PAGES = [ROOT / "docs" / "python.md", ROOT / "crates" / "ticket-py" / "README.md"]
EXCERPT = re.compile(r"^# \w+ project code \((?P<path>[^)]+)\)\n")


def blocks(page):
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def test_every_page_has_examples():
    assert all(blocks(page) for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_examples_run_as_written(page, registry):
    ran = 0
    for block in blocks(page):
        excerpt = EXCERPT.match(block)
        if excerpt:
            source = (ROOT / excerpt.group("path")).read_text()
            assert block[excerpt.end():] == source, f"{page.name}: the block is not {excerpt.group('path')} as it is"
            continue
        done = subprocess.run([sys.executable, "-c", block], env={**os.environ, "PG_TICKET_DSN": registry.dsn}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{page.name}:\n{block}\n{done.stderr}"
        ran += 1
    assert ran >= 1


def test_the_wheel_alone_in_a_fresh_venv_runs_the_readme_example(registry, tmp_path):
    wheel = os.environ.get("PG_TICKET_WHEEL")
    if not wheel:
        pytest.skip("PG_TICKET_WHEEL not set: run through make test-python")
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", wheel], check=True, timeout=120)
    readme = blocks(ROOT / "crates" / "ticket-py" / "README.md")[0]
    done = subprocess.run([python, "-c", readme], env={**os.environ, "PG_TICKET_DSN": registry.dsn}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "made at" in done.stdout
