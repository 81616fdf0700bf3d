"""``cachedb report`` and ``cachedb datasette-metadata``: the command-line side of
:mod:`cachedb.tools.report` and :mod:`cachedb.tools.datasette`.

Registered on the ``cachedb`` group when :mod:`cachedb.cli` is imported.
"""

from __future__ import annotations

import click

from ._common import _Context, _printable, db_options, err, main, pass_ctx


def _commands() -> list[click.Command]:

    @click.command("report")
    @click.option("--out", "out", metavar="FILE.html", type=click.Path(dir_okay=False, path_type=str),
                  default="cachedb-report.html", show_default=True, help="Where the HTML report is written.")
    @click.option("--format", "fmt", type=click.Choice(["html", "text"]), default="html", show_default=True,
                  help="html: one self-contained file (works offline); text: the same tables in the terminal.")
    @click.option("--open", "open_", is_flag=True, help="Open the HTML report in a web browser.")
    @click.option("--max-charts", type=click.IntRange(min=0), default=None, metavar="N",
                  help="Op/shape groups drawn as charts, e.g. --max-charts 10 (default 40; 0: tables only; the "
                       "tables list all).")
    @db_options
    @pass_ctx
    def report(obj: _Context, out: str, fmt: str, open_: bool, max_charts: int | None) -> None:
        """The tuning history and the cache's contents, as an HTML report or tables.

        Per op and input shape: every choice's timing (ms) and the winner, per precision,
        GPU/CPU and torch version, and the benchmarks over time; best configs per kernel;
        entries and bytes by kind and fingerprint; kernels; hits over time. The HTML file
        inlines its charting library (Plotly: pip install 'cachedb[report]') and fetches
        nothing from the network. Never creates a database.

        \b
        Example:
          cachedb --db inductor.db report --out report.html --open
          cachedb report --db inductor.db --format text
        """
        from ..tools import report as rep

        if fmt == "text":
            if open_:
                raise click.UsageError("--open needs --format html")
            with obj.open(existing=True) as db:
                data = rep.collect(db)
            from rich.console import Console

            rep.render_text(data, Console(width=max(120, Console().width), soft_wrap=False))
            return
        limit = rep.DEFAULT_MAX_GROUPS if max_charts is None else max_charts
        rep._plotly_js()  # fail early, before reading the database, when Plotly is missing
        with obj.open(existing=True) as db:
            path = rep.write_html(db, out, max_groups=limit)
        click.echo(_printable(f"report written to {path} ({path.stat().st_size:,} bytes)"))
        if open_:
            import webbrowser

            if not webbrowser.open(path.as_uri()):
                err.print(f"no web browser found: open {path.as_uri()} yourself", highlight=False, markup=False)

    @click.command("datasette-metadata")
    @click.option("--format", "fmt", type=click.Choice(["json", "yaml"]), default="json", show_default=True)
    @click.option("--out", "out", metavar="FILE", type=click.Path(dir_okay=False, path_type=str),
                  help="Write the metadata to FILE and print FILE's path (for -m $(...)); default: stdout.")
    @click.option("--name", metavar="NAME",
                  help="Database name as Datasette shows it (default: the --db file's name without .db).")
    @db_options
    @pass_ctx
    def datasette_metadata(obj: _Context, fmt: str, out: str | None, name: str | None) -> None:
        """Datasette metadata for a cachedb database: descriptions, units, canned queries.

        Tables and views are described (units: ms, ns, bytes); canned queries: winners
        per op, regressions between two torch versions, largest entries, stale
        fingerprints (not used for N days). The database itself is not opened.

        \b
        Example:
          datasette inductor.db -m "$(cachedb --db inductor.db datasette-metadata --out meta.json)"
          cachedb --db inductor.db datasette-metadata --format yaml > meta.yml
        """
        from ..tools import datasette as ds

        document = ds.dump(ds.metadata(name or ds.database_name(obj.location)), fmt)
        if out is None:
            click.echo(document, nl=not document.endswith("\n"))
            return
        path = ds.write(document, out)
        click.echo(_printable(str(path)))

    return [report, datasette_metadata]


def register(group: click.Group) -> None:
    """Add ``report`` and ``datasette-metadata`` to ``group`` (the ``cachedb`` command)."""
    for command in _commands():
        group.add_command(command)


register(main)
