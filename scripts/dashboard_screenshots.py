"""Screenshots of the dashboard's main pages on the demo, for docs/ and the README.

Runs the demo (``python -m sqlqueue_orm.demo``) into a temporary directory, serves the dashboard
on it with uvicorn on a free port of 127.0.0.1 and photographs the pages with Debian's headless
Chromium through Selenium (the same setup as the browser tests: ``tests/browser.py``)::

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs]
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

from sqlqueue_orm import OutgoingMessage, Transport, demo  # noqa: E402
from sqlqueue_orm.contrib.dashboard import create_app  # noqa: E402
from tests import browser  # noqa: E402


def main() -> int:
    """Take the screenshots; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="where the PNG files go")
    args = parser.parse_args()
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
                    shots = {
                        "dashboard-queues.png": "/",
                        "dashboard-errors.png": "/errors",
                        "dashboard-outbox.png": "/outbox",
                    }
                    for name, path in shots.items():
                        driver.get(base + path)
                        driver.save_screenshot(str(out / name))
                        print(out / name)
                    driver.get(base + "/errors")
                    first = driver.find_element("css selector", "#failed tr[data-id] a")
                    first.click()
                    time.sleep(0.3)
                    driver.save_screenshot(str(out / "dashboard-message.png"))
                    print(out / "dashboard-message.png")
                    driver.get(base + "/errors")
                    for box in driver.find_elements("css selector", "#failed input")[:2]:
                        box.click()
                    driver.find_element("id", "retry-chosen").click()
                    time.sleep(0.3)
                    driver.save_screenshot(str(out / "dashboard-confirm.png"))
                    print(out / "dashboard-confirm.png")
            finally:
                driver.quit()
                app.state.dashboard.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
