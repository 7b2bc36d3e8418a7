"""Retake docs/playground.png and docs/dashboard.png: `python docs/screenshots.py` (about two minutes on a CPU).

Starts `specdec serve` on the default model with the n-gram and suffix drafters,
asks the playground two questions whose answers repeat the prompt (so drafts get
accepted), keeps a few requests running for the dashboard's charts, and takes
both pages' pictures with headless chromium (Debian's, via Playwright).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

DOCS = Path(__file__).parent
QUESTIONS = [
    "Add type hints and a docstring to this function, and show the whole function:\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative size')\n"
    "    return width * height",
    "Now do the same for: def perimeter(width, height): return 2 * (width + height)",
]
LOAD_PROMPTS = ["List the planets of the solar system, one per line, with one fact each.",
                "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
                "Write a haiku about the sea.",
                "Explain what a hash table is in two sentences.",
                "Translate to French: The cat sleeps on the warm windowsill.",
                "Write a Python function that reverses a string, with a docstring."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--spec-type", "ngram,suffix", "--port", str(port),
           "--max-batch-size", "4", "--max-model-len", "2048"]
    server = subprocess.Popen(cmd)
    deadline = time.time() + 300
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.time() > deadline:
            raise SystemExit("specdec serve did not start")
        time.sleep(1)


def background_load(url: str, stop: threading.Event, first: int) -> None:
    i = first
    while not stop.is_set():
        body = {"messages": [{"role": "user", "content": LOAD_PROMPTS[i % len(LOAD_PROMPTS)]}], "max_tokens": 96,
                "temperature": 0.7}  # sampled: repeated prompts do not simply replay a cached answer
        httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        i += 1


def main() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(port)
    stop = threading.Event()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url + "/")
            page.wait_for_selector("body[data-ready='1']")
            page.fill("#max-tokens", "160")
            for n, question in enumerate(QUESTIONS):
                page.fill("#prompt", question)
                page.click("#send")
                page.wait_for_selector(f".msg.assistant >> nth={n} >> .stats", timeout=300_000)
            page.screenshot(path=str(DOCS / "playground.png"), full_page=True)

            loaders = [threading.Thread(target=background_load, args=(url, stop, k)) for k in range(3)]
            for t in loaders:
                t.start()
            page.goto(url + "/dashboard")
            page.select_option("#window", "60")
            time.sleep(45)
            page.screenshot(path=str(DOCS / "dashboard.png"), full_page=True)
            stop.set()
            browser.close()
    finally:
        stop.set()
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
