"""The dashboard served by uvicorn in a thread, and Debian's headless Chromium driven by Selenium.

Used by the browser tests and by ``scripts/dashboard_screenshots.py``. Chromium and chromedriver
are Debian's (``apt-get install chromium chromium-driver``, done by ``scripts/test.sh``):
Selenium is pointed at both, so its Selenium Manager never downloads a browser or a driver.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing_browser() -> str | None:
    """Why the browser cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt-get install {package}; scripts/test.sh does)"
    return None


def chromium(width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium WebDriver (Debian's browser and driver, nothing downloaded)."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never reach the network
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", f"--window-size={width},{height}",
                     "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve *app* with uvicorn in a thread on a free port of 127.0.0.1; yield its base URL."""
    import uvicorn

    from sqlqueue_orm.cli.dashboard import listen

    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
