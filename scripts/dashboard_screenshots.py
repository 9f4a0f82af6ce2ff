"""Screenshots of the dashboard's main pages on the demo, for docs/ and the README.

Runs the demo (``python -m sqlqueue_orm.demo``) into a temporary directory, serves the dashboard
on it with uvicorn on a free port of 127.0.0.1 and photographs the pages with Debian's headless
Chromium through Selenium (the same setup as the browser tests: ``testsupport/browser.py``)::

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs] [--only dashboard-control.png]

A page is added by a line in :data:`PAGES` (file name, path); ``--only`` takes some of them (and
of the two clicked-through shots, :data:`CLICKED`), so a new page is shot without retaking the
others.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pydantic  # noqa: E402

from sqlqueue_orm import (  # noqa: E402
    Endpoint,
    OutgoingMessage,
    Transport,
    UnitOfWork,
    control,
    demo,
)
from sqlqueue_orm.contrib.dashboard import create_app  # noqa: E402
from sqlqueue_orm.sending import Outbox  # noqa: E402
from testsupport import browser  # noqa: E402

#: The pages photographed as they load: (file name under --out, path of the page).
PAGES = [
    ("dashboard-queues.png", "/"),
    ("dashboard-errors.png", "/errors"),
    ("dashboard-outbox.png", "/outbox"),
    ("dashboard-control.png", "/control"),
    ("dashboard-groups.png", "/errors/groups"),
    ("dashboard-endpoints.png", "/endpoints"),
    ("dashboard-queue.png", "/queue?name=shipping"),
    ("dashboard-delayed.png", "/delayed"),
]
#: The shots taken after clicking through the errors page.
CLICKED = ("dashboard-message.png", "dashboard-confirm.png")


class Shipment(pydantic.BaseModel):
    """What the photographed endpoint handles."""

    order: int


def main() -> int:
    """Take the screenshots; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="where the PNG files go")
    names = [name for name, _path in PAGES] + list(CLICKED)
    parser.add_argument("--only", type=lambda text: text.split(","), default=names,
                        help=f"comma-separated file names (default all: {', '.join(names)})")
    args = parser.parse_args()
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        parser.error(f"unknown screenshot {', '.join(unknown)} (choose from {', '.join(names)})")
    missing = browser.missing_browser()
    if missing:
        print(f"cannot take screenshots: {missing}", file=sys.stderr)
        return 1
    out = pathlib.Path(args.out)
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{directory}/demo.db"
        with contextlib.redirect_stdout(io.StringIO()):
            demo.run(url, audit_messages=2000)
        with Transport(url) as transport:
            app = create_app(transport, allow_changes=True, sample_interval=0.5)
            driver = browser.chromium(1280, 760)
            try:
                with browser.served(app) as base:
                    # A few seconds of traffic so the chart has something to draw.
                    transport.create_queue("sales")
                    for n in range(16):
                        transport.send_many("sales", [OutgoingMessage(f"order {n}-{i}")
                                                      for i in range(40)])
                        time.sleep(0.25)
                    for _ in range(16):
                        transport.receive("sales", 30)
                        time.sleep(0.25)
                    # a running endpoint for the endpoints page and the queue's metrics
                    shipping = Endpoint("shipping", transport, peek_delay=0.2,
                                        heartbeat_interval=0.5, metrics_interval=0.5)
                    shipping.handle(Shipment, lambda shipment, context: time.sleep(0.02))
                    shipping.start()
                    for n in range(12):
                        transport.send_many("shipping", [OutgoingMessage(Shipment(order=n * 50 + i))
                                                         for i in range(50)])
                        transport.send("shipping", OutgoingMessage(Shipment(order=n)),
                                       delay=3600.0)
                        time.sleep(0.3)
                    # the outbox page: records stored by units of work, not yet dispatched
                    outbox = Outbox(transport)
                    outbox.create_table()
                    for n in range(6):
                        with UnitOfWork(transport, mode="outbox", outbox=outbox,
                                        dispatch_inline=False) as unit:
                            unit.send("sales", OutgoingMessage(f"invoice {n}"))
                    # the control page: one endpoint paused, one resized, in the log
                    control.set_concurrency(transport, "sales", 8)
                    control.pause(transport, "sales")
                    for name, path in PAGES:
                        if name in args.only:
                            driver.get(base + path)
                            driver.save_screenshot(str(out / name))
                            print(out / name)
                    if "dashboard-message.png" in args.only:
                        driver.get(base + "/errors")
                        first = driver.find_element("css selector", "#failed tr[data-id] a")
                        first.click()
                        time.sleep(0.3)
                        driver.save_screenshot(str(out / "dashboard-message.png"))
                        print(out / "dashboard-message.png")
                    if "dashboard-confirm.png" in args.only:
                        driver.get(base + "/errors")
                        for box in driver.find_elements("css selector", "#failed input")[:2]:
                            box.click()
                        driver.find_element("id", "retry-chosen").click()
                        time.sleep(0.3)
                        driver.save_screenshot(str(out / "dashboard-confirm.png"))
                        print(out / "dashboard-confirm.png")
                    shipping.stop()
            finally:
                driver.quit()
                app.state.dashboard.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
