"""What the pages draw: the SVG depth chart and the hex view of a body, as plain text."""

from __future__ import annotations

import html
from collections.abc import Sequence

from sqlqueue_orm.contrib.dashboard.sampling import WINDOW, Sample

#: Bytes per line of the hex view.
HEX_WIDTH = 16


def depth_chart(samples: Sequence[Sample], now: float, width: int = 240, height: int = 48) -> str:
    """An inline SVG of *samples* over the hour before *now* (drawn by the server: no script)."""
    if not samples:
        return (
            f'<svg class="chart" width="{width}" height="{height}" role="img" '
            'aria-label="no readings yet"><text x="4" y="28">no readings yet</text></svg>'
        )
    top = max(max(sample.depth for sample in samples), 1)
    points = " ".join(
        f"{(sample.at - (now - WINDOW)) / WINDOW * width:.1f},"
        f"{height - 2 - sample.depth / top * (height - 4):.1f}"
        for sample in samples
    )
    label = html.escape(
        f"depth over the last hour: {len(samples)} readings, highest {top}, last "
        f"{samples[-1].depth}"
    )
    return (
        f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{label}">'
        f"<title>{label}</title>"
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
