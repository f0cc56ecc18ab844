"""Tables a person reads at 80 columns (a pipe, a small terminal): headers are never cut
to ``sche…``. A table that fits is printed whole; one that does not becomes a list of
records (a name, then ``header value`` pairs wrapped to the width)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table


def print_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    text_columns: int = 1,
    console: Console | None = None,
) -> None:
    """Print rows under ``headers``; the first ``text_columns`` are names (left-aligned),
    the others numbers or short values (right-aligned)."""
    out = console or Console()
    cells = [[str(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if sum(widths) + len(widths) <= out.width:
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False, pad_edge=False)
        for i, header in enumerate(headers):
            right = "left" if i < text_columns else "right"
            table.add_column(header, justify=right, no_wrap=True)  # type: ignore[arg-type]
        for row in cells:
            table.add_row(*row)
        out.print(table)
        return
    width = max(40, out.width)
    for row in cells:
        click.echo(" ".join(row[:text_columns]))
        pairs = "  ".join(
            f"{h} {v}" for h, v in zip(headers[text_columns:], row[text_columns:], strict=True)
        )
        click.echo(textwrap.fill(pairs, width, initial_indent="  ", subsequent_indent="  "))
