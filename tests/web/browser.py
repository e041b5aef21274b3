"""Headless Chromium for the console's browser tests: Debian's `chromium` driven through its
`chromedriver` by Selenium (neither downloads a browser or a driver of its own)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
HOW_TO_GET = ("headless Chromium not found: install Debian's `chromium` and `chromium-driver` "
              "(apt-get install -y chromium chromium-driver; .ci/run does this in CI) to run the "
              "web console's browser tests")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--disable-extensions", "--window-size=1400,1000")


def find() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None."""
    browser = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def start(profile: Path | None = None):  # -> selenium WebDriver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find()
    if found is None:
        raise RuntimeError(HOW_TO_GET)
    browser, driver = found
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile or tempfile.mkdtemp(prefix='duetime-chromium-')}")
    d = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    d.set_page_load_timeout(30)
    return d
