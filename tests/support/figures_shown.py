"""What a person reads of a run's figures in each place: the summary `opdflow run` prints, the
report's tables and the table `opdflow sweep` prints, parsed back from the text.

Each reader returns, per run, the printed text of the figures every place shows (trainer
wait share, updates/hour, held-out accuracy at the end), so a test compares what people see.
"""

from __future__ import annotations

import html.parser
import io

from opdflow.analysis.figures import label

SHOWN = ("trainer_wait_share", "updates_per_hour", "heldout_accuracy_end")
"""The figures the summary, the report and the sweep table all show."""


def number(text: str) -> float:
    """A printed figure as a number: '2.7%' -> 0.027, '0.011 s' -> 0.011, '1234' -> 1234."""
    t = text.strip()
    if t.endswith("%"):
        return float(t[:-1]) / 100
    return float(t.removesuffix(" s").removesuffix("x").replace(",", ""))


def summary_shown(summary: dict) -> dict[str, str]:
    """The figures of the summary table `opdflow run` prints at the end."""
    from rich.console import Console

    from opdflow.commands.console import print_summary

    out = io.StringIO()
    print_summary(summary, Console(file=out, width=400, color_system=None))
    rows = {}
    for line in out.getvalue().splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    wait = rows["trainer wait mean / share (after warm-up)"].split(" / ")
    accuracy = rows["held-out accuracy (start -> end)"].split(" -> ")
    return {
        "trainer_wait_share": wait[1],
        "updates_per_hour": rows[label("updates_per_hour")],
        "heldout_accuracy_end": accuracy[1].split(" (")[0],
    }


class _Tables(html.parser.HTMLParser):
    """Every <table> of a page as a list of rows of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def report_tables(page: str) -> list[dict[str, dict[str, str]]]:
    """Each table of the report page as {first cell of a row: {header: cell}}."""
    parser = _Tables()
    parser.feed(page)
    out = []
    for rows in parser.tables:
        head, body = rows[0], rows[1:]
        out.append({r[0]: dict(zip(head, r)) for r in body})
    return out


def report_shown(page: str) -> dict[str, dict[str, str]]:
    """Per run directory name: the figures of the report's table of runs."""
    runs = report_tables(page)[0]
    return {name: {key: row[label(key)] for key in SHOWN} for name, row in runs.items()}


def report_sweep_shown(page: str) -> dict[str, dict[str, str]]:
    """Per sweep label (k=0, ...): the figures of the report's sweep table."""
    sweep = next(t for t in report_tables(page) if any(name.startswith("k=") for name in t))
    return {name: {key: row[label(key)] for key in SHOWN} for name, row in sweep.items()}


def sweep_table_shown(text: str) -> dict[str, dict[str, str]]:
    """Per sweep label (k=0, ...): the figures of the table `opdflow sweep` prints (printed
    wide enough that rich cuts no cell)."""
    from opdflow.commands.sweep import COLUMNS

    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == len(COLUMNS) and cells[0].startswith(("k=", "adaptive")):
            row = dict(zip(COLUMNS, cells))
            out[cells[0]] = {key: row[key] for key in SHOWN}
    return out
