"""What the pages draw: the SVG depth chart and the hex view of a body, as plain text."""

from __future__ import annotations

import html
from collections.abc import Sequence

from sqlqueue_orm.contrib.dashboard.sampling import WINDOW, Sample

#: Shortest time axis of the chart, in seconds.
MINIMUM_SPAN = 10.0
#: Bytes per line of the hex view.
HEX_WIDTH = 16


def depth_chart(
    samples: Sequence[Sample],
    now: float,
    width: int = 240,
    height: int = 48,
    *,
    label: str = "depth",
    window: float = WINDOW,
) -> str:
    """An inline SVG of *samples* up to *now* (drawn by the server: no script).

    The time axis spans the *window* (an hour) before *now*, or less while the history is
    shorter (from the first reading, at least 10 s), so a new chart is not a sliver at the edge.
    *label* names what is charted in the chart's accessible name.
    """
    if not samples:
        return (
            f'<svg class="chart" width="{width}" height="{height}" role="img" '
            'aria-label="no readings yet"><text x="4" y="28">no readings yet</text></svg>'
        )
    start = max(now - window, min(samples[0].at, now - MINIMUM_SPAN))
    span = max(now - start, 1.0)
    top = max(max(sample.depth for sample in samples), 1)
    points = " ".join(
        f"{(sample.at - start) / span * width:.1f},"
        f"{height - 2 - sample.depth / top * (height - 14):.1f}"
        for sample in samples
    )
    shown = (
        f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min" if span < 7200
        else f"{span / 3600:.0f} h"
    )
    top_text, last_text = f"{top:g}", f"{samples[-1].depth:g}"
    label = html.escape(
        f"{label} over the last {shown}: {len(samples)} readings, highest {top_text}, "
        f"last {last_text}"
    )
    return (
        f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{label}">'
        f"<title>{label}</title>"
        f'<line x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}" stroke="#d1d5db"/>'
        f'<text x="2" y="9" font-size="9" fill="#6b7280">{top_text}</text>'
        f'<text x="{width - 2}" y="9" font-size="9" fill="#6b7280" text-anchor="end">'
        f"{shown}</text>"
        f'<polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="{points}"/></svg>'
    )


def hex_view(data: bytes) -> str:
    """*data* as ``offset  hex bytes  |ascii|`` lines, as ``hexdump -C`` shows it."""
    lines = []
    for offset in range(0, len(data), HEX_WIDTH):
        chunk = data[offset : offset + HEX_WIDTH]
        hexes = " ".join(f"{byte:02x}" for byte in chunk)
        text = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"{offset:08x}  {hexes:<{HEX_WIDTH * 3 - 1}}  |{text}|")
    return "\n".join(lines)


def utf8_text(data: bytes) -> str | None:
    """*data* decoded as UTF-8, or ``None`` when it is not valid UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
