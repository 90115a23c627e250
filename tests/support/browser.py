"""Headless Chromium for the page's end-to-end tests: Debian's /usr/bin/chromium, driven by playwright.

No browser is downloaded (never `playwright install`): playwright is pointed at
the system's Chromium. Without it the tests skip with a message, or fail with
CI=true (`.ci/run` installs it when missing).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.databases import unavailable

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched headless Chromium (a playwright Browser)."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ModuleNotFoundError as error:
        unavailable("the playwright package (pip install 'quotagate[e2e]')", error)
    if not CHROMIUM.exists() and shutil.which("chromium") is None:
        unavailable("Debian's chromium (apt-get install -y chromium)",
                    FileNotFoundError(str(CHROMIUM)))
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        except Error as error:
            unavailable("headless chromium", error)
        try:
            yield browser
        finally:
            browser.close()


def collect_page_errors(page: Any) -> list[str]:
    """Script errors and failed loads of the page, for a test to assert there were none."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda message: errors.append(f"console: {message.text}")
            if message.type == "error" and "401" not in message.text and "404" not in message.text
            and "403" not in message.text else None)
    return errors


__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "DESKTOP", "PHONE", "chromium", "collect_page_errors"]
