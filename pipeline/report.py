"""HTML reports that render offline: one file, plots embedded as base64 PNG.

matplotlib (Agg, no display) draws the plots; the page has no script and loads
nothing from the network, so it opens the same in a browser, a CI artifact viewer
or an air-gapped machine.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

_STYLE: Final = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222;
max-width:1200px}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.8em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666;font-size:.9em}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:8em}
.card .v{font-size:1.4em;font-weight:600}.card .k{color:#666;font-size:.85em}
.card.bad{border-color:#c0392b;background:#fdecea}
table{border-collapse:collapse;font-size:.88em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.none{color:#999}td.n{text-align:right;font-variant-numeric:tabular-nums}
.wide{overflow-x:auto}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.fail{color:#c0392b;font-weight:600}.pass{color:#1e8449;font-weight:600}
"""


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return f"<td>{str(value).lower()}</td>"
    if isinstance(value, int):
        return f'<td class="n">{value:,}</td>'
    if isinstance(value, float):
        return f'<td class="n">{value:,.3f}</td>'
    if isinstance(value, list | tuple):
        return "<td>" + "<br>".join(html.escape(str(v)) for v in value) + "</td>"
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "backslashreplace")
    if value is None:
        return '<td class="none">—</td>'
    return f"<td>{html.escape(str(value))}</td>"


class HtmlReport:
    """Builds one self-contained page: cards, tables and embedded plots."""

    def __init__(self, title: str, subtitle: str = "", refresh_s: int | None = None) -> None:
        self.title = title
        self.refresh_s = refresh_s  # a live page: the browser reloads it this often
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.parts: list[str] = [f"<h1>{html.escape(title)}</h1>",
                                 f'<p class="meta">{html.escape(subtitle)} — {stamp}</p>']

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def paragraph(self, text: str, css: str = "") -> None:
        klass = f' class="{css}"' if css else ""
        self.parts.append(f"<p{klass}>{html.escape(text)}</p>")

    def cards(self, items: Iterable[tuple[str, Any, bool]]) -> None:
        """(label, value, alarming) boxes."""
        cells = []
        for label, value, bad in items:
            shown = f"{value:,}" if isinstance(value, int) else str(value)
            cells.append(f'<div class="card{" bad" if bad else ""}"><div class="v">'
                         f'{html.escape(shown)}</div><div class="k">{html.escape(label)}'
                         "</div></div>")
        self.parts.append(f'<div class="cards">{"".join(cells)}</div>')

    def table(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
              empty: str = "none") -> None:
        if not rows:
            self.paragraph(empty, "meta")
            return
        names = list(columns or rows[0].keys())
        head = "".join(f"<th>{html.escape(c)}</th>" for c in names)
        body = "".join("<tr>" + "".join(_cell(row.get(n)) for n in names) + "</tr>"
                       for row in rows)
        self.parts.append(f'<div class="wide"><table><thead><tr>{head}</tr></thead>'
                          f"<tbody>{body}</tbody></table></div>")

    def figure(self, fig: Any, alt: str) -> None:
        """A matplotlib figure, embedded as PNG (and closed)."""
        import matplotlib.pyplot as plt

        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        self.parts.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')

    def html(self) -> str:
        refresh = (f'<meta http-equiv="refresh" content="{self.refresh_s}">'
                   if self.refresh_s else "")
        return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"{refresh}<title>{html.escape(self.title)}</title><style>{_STYLE}</style>"
                "</head>"
                f"<body>{''.join(self.parts)}</body></html>")

    def write(self, path: Path) -> Path:
        """Written beside, then renamed: a browser reloading it never reads half a page."""
        staging = path.with_name(f".{path.name}.tmp")
        staging.write_text(self.html(), encoding="utf-8")
        staging.replace(path)
        return path


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_chart(labels: Sequence[str], series: Mapping[str, Sequence[float]], title: str,
              ylabel: str, stacked: bool = True) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.35 * len(labels) + 1)))
    left = [0.0] * len(labels)
    for name, values in series.items():
        ax.barh(list(labels), list(values), left=left if stacked else None, label=name)
        if stacked:
            left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_title(title)
    ax.set_xlabel(ylabel)
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return fig


# How far a time chart of a single point in time reaches each side of it.
SINGLE_POINT_SPAN: Final = timedelta(minutes=1)


def time_chart(times: Sequence[datetime], series: Mapping[str, Sequence[float]], title: str,
               ylabel: str) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for name, values in series.items():
        ax.plot(list(times), list(values), label=name, marker=".", linewidth=1)
    if len(set(times)) == 1:
        # One point in time: matplotlib widens a date axis it cannot scale by two years
        # each side (a one-minute capture's timeline spanned 2025 to 2029).
        ax.set_xlim(times[0] - SINGLE_POINT_SPAN, times[0] + SINGLE_POINT_SPAN)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.autofmt_xdate()
    return fig


__all__ = ["HtmlReport", "bar_chart", "pyplot", "time_chart"]
