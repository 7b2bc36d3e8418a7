"""The playground and dashboard of `specdec serve`: the live series, the routes, and a real browser.

The browser test drives Debian's chromium headless through Playwright. Where no
chromium is on the machine it tries ``apt-get install chromium`` (as root), and
skips with a notice saying why when that cannot work.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from specdec.llm import LLM
from specdec.server.app import create_app
from specdec.server.live import LiveSeries
from tests.test_server import API_KEY, AUTH, running_server

LOOPING_PROMPT = "héllo wörld 你好 🙂 x"  # the bigram tiny model loops on it: drafts get accepted


# -- the live series ---------------------------------------------------------------------------------
class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_live_series_buckets_by_second():
    clock = Clock(1000.2)
    live = LiveSeries(clock)
    live.record_result("ngram", 4, 2, 3)
    live.record_result(None, 0, 0, 1)  # a sequence that drafted nothing
    live.record_step(2, 0.1, 0.01, 0.08)
    live.record_waiting(3)
    live.record_waiting(1)
    clock.t = 1002.7  # a quiet second, then another step
    live.record_result("suffix", 2, 2, 3)
    live.record_step(1, 0.05, 0.0, 0.05)
    snap = live.snapshot(window=10)
    assert snap["t"] == list(range(993, 1003))
    assert snap["tokens"][-3:] == [4, 0, 3]
    assert snap["passes"][-3:] == [2, 0, 1]
    assert (snap["drafted"][-3], snap["accepted"][-3]) == (4, 2)
    assert snap["waiting"][-3] == 3  # the most seen in that second
    assert snap["batch"][-3] == 2 and snap["steps"][-3] == 1
    assert snap["drafters"]["ngram"][-3:] == [[4, 2], [0, 0], [0, 0]]
    assert snap["drafters"]["suffix"][-1] == [2, 2]
    totals = snap["totals"]
    assert (totals["drafted"], totals["accepted"]) == (6, 4)
    assert totals["drafted_per_pos"] == [2, 2, 1, 1] and totals["accepted_per_pos"] == [2, 2]
    assert totals["by_drafter"]["ngram"]["acceptance_rate"] == 0.5
    clock.t = 2000.0  # long after: the window holds only idle seconds, the totals remain
    later = live.snapshot(window=10)
    assert sum(later["tokens"]) == 0 and later["drafters"] == {} and later["totals"]["drafted"] == 6


# -- routes ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def web(tiny_model_factory):
    """(base URL, LLM) of a bigram tiny model served with the n-gram and suffix drafters and an API key."""
    llm = LLM(str(tiny_model_factory("llama", bigram=True)), spec="ngram,suffix", max_model_len=512, max_num_seqs=4,
              plan_drafts=False)
    with running_server(create_app(llm, api_key=API_KEY)) as url:
        yield url, llm


def test_pages_and_static_files_are_served(web):
    url, _ = web
    for path, marker in (("/", "playground.js"), ("/dashboard", "dashboard.js")):
        r = httpx.get(url + path)  # pages are public: they hold no data
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html") and marker in r.text
    for name in ("playground.js", "dashboard.js", "charts.js", "common.js", "style.css"):
        r = httpx.get(f"{url}/static/{name}")
        assert r.status_code == 200 and r.text, name
        assert "http://" not in r.text.replace("http://www.w3.org/2000/svg", "")  # nothing from the network
    missing = httpx.get(url + "/static/nope.js")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    denied = httpx.get(url + "/playground/config")  # it names the model (maybe a path): behind the key
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    config = httpx.get(url + "/playground/config", headers=AUTH).json()
    assert config["drafters"] == ["ngram", "suffix"] and config["api_key_required"] is True


def test_live_endpoint_needs_the_key_and_moves(web):
    url, llm = web
    denied = httpx.get(url + "/metrics/live")
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    bad = httpx.get(url + "/metrics/live?window=5", headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "query.window"
    before = httpx.get(url + "/metrics/live?window=60", headers=AUTH).json()
    r = httpx.post(url + "/v1/completions", headers=AUTH, json={"prompt": LOOPING_PROMPT, "max_tokens": 30,
                                                                 "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    after = httpx.get(url + "/metrics/live?window=60", headers=AUTH).json()
    assert len(after["t"]) == 60 and set(after) >= {"tokens", "passes", "drafted", "accepted", "step_seconds",
                                                     "draft_seconds", "verify_seconds", "batch", "waiting"}
    assert sum(after["tokens"]) - sum(before["tokens"]) == 30
    gained = after["totals"]["accepted"] - before["totals"]["accepted"]
    assert gained == r.json()["spec_decode"]["accepted"] > 0
    metrics = httpx.get(url + "/metrics", headers=AUTH).text  # with a key, /metrics takes it
    assert 'specdec:spec_decode_drafter_tokens_total{drafter="ngram",outcome="accepted"}' in metrics


# -- a real browser ------------------------------------------------------------------------------------
def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    """The path of a chromium binary, installing Debian's package when none is there; else skip."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="NOTICE: browser test skipped: "
                                   "playwright is not installed (pip install -e '.[dev]')")
    del sync_api
    path = find_chromium()
    if path is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
            except subprocess.TimeoutExpired:
                break
            if done.returncode != 0:
                break
        path = find_chromium()
    if path is None:
        pytest.skip("NOTICE: browser test skipped: no chromium on this machine and `apt-get install chromium` "
                    "was not possible (needs root and Debian's package lists)")
    return path


@pytest.fixture
def page(chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        page.screenshot(path=str(tmp_path / "last.png"), full_page=True)  # for a look when it failed
        browser.close()
        assert not errors, errors


def test_browser_playground_and_dashboard(web, page):
    url, llm = web
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready='1']")
    assert "API key" in page.locator("#messages").inner_text()  # the settings are behind the key
    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")  # the settings are read again with the key
    page.wait_for_function("document.querySelector('#legend').innerText.includes('suffix')")
    assert page.locator("#legend").inner_text().split()[:2] == ["ngram", "suffix"]
    page.fill("#max-tokens", "40")
    # Twice the same question: the model (a bigram one) repeats its first answer, which the
    # drafters find in the context (n-gram) and in the answers seen before (suffix).
    for turn in (1, 2):
        page.fill("#prompt", LOOPING_PROMPT)
        page.click("#send")
        page.wait_for_selector(f".msg.assistant >> nth={turn - 1} >> .stats", timeout=60_000)
    answers = page.locator(".msg.assistant")
    first_text = "".join(answers.nth(0).locator(".tok").all_text_contents())
    want = httpx.post(url + "/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": LOOPING_PROMPT}], "max_tokens": 40, "temperature": 0}).json()
    assert first_text == want["choices"][0]["message"]["content"]  # what the page shows is the API's text
    second = answers.nth(1)
    drafted = second.locator(".tok.drafted")
    assert drafted.count() > 0  # coloured tokens
    assert {drafted.nth(i).get_attribute("data-origin") for i in range(drafted.count())} <= {"ngram", "suffix"}
    assert "background" in (drafted.first.get_attribute("style") or "")
    tau = float(second.locator("[data-stat=tau] b").inner_text())
    tps = float(second.locator("[data-stat=tps] b").inner_text())
    assert tau > 1 and tps > 0
    assert second.locator("[data-stat=acceptance] b").inner_text() != "–"
    assert "target" in second.locator("[data-stat=mix]").inner_text()

    # Compare: the answer decoded again without drafting; greedy, so the texts agree, and the
    # speedup is the plain decode time over the speculative one
    page.check("#compare")
    page.fill("#prompt", LOOPING_PROMPT)
    page.click("#send")
    third = answers.nth(2)
    third.locator(".stats.compare").wait_for(timeout=60_000)
    assert third.locator("[data-stat=same] b").inner_text() == "yes"
    plain_s, spec_s = (float(t.split()[0]) for t in third.locator("[data-stat=decode] b").inner_text().split("→"))
    speedup = float(third.locator("[data-stat=speedup] b").inner_text().rstrip("×"))
    # the page shows both times to 0.01 s (a spec decode under 5 ms, drafted from the earlier turns, reads
    # 0.00): the speedup lies within what that rounding allows
    assert (plain_s - 0.005) / (spec_s + 0.005) <= speedup + 0.005
    assert spec_s < 0.01 or speedup <= (plain_s + 0.005) / (spec_s - 0.005) + 0.005

    page.goto(url + "/dashboard")
    page.wait_for_function("Number(document.body.dataset.updates || 0) >= 1", timeout=20_000)
    updates = int(page.locator("#chart-tps").get_attribute("data-updates"))
    httpx.post(url + "/v1/completions", headers=AUTH, json={"prompt": LOOPING_PROMPT, "max_tokens": 20,
                                                             "temperature": 0, "ignore_eos": True})
    page.wait_for_function(f"Number(document.querySelector('#chart-tps').dataset.updates) > {updates + 1}",
                           timeout=20_000)
    assert float(page.locator("#chart-tps").get_attribute("data-max")) > 0  # tokens per second plotted
    assert float(page.locator("#chart-tau").get_attribute("data-max")) > 1
    assert page.locator("#chart-position rect").count() > 0  # acceptance by position
    assert "ngram" in page.locator("#chart-drafters").text_content()
    assert page.locator("#chart-tps path.line").count() == 1
    assert "updated" in page.locator("#status").inner_text()


def test_docs_screenshots_exist():
    docs = Path(__file__).parent.parent / "docs"
    for name in ("playground.png", "dashboard.png"):
        assert (docs / name).stat().st_size > 10_000, name
