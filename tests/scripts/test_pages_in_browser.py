"""The pages opened in a real browser (headless Chromium, tests/scripts/browser.py): the tune page (scripts/tune-page,
autotune --report), a benchsuite run's page (scripts/run-page) and the nightly report (scripts/report). Each is
opened, screenshotted and checked: not blank, every image loaded with an alt text, the claim sentence there, and
nothing asked of the network. The checks are seen failing on a page built to break them. Without Chromium
(scripts/install-deps installs Debian's) the tests skip and say so."""

import html
import json
import os
import subprocess
import sys

import pytest

import browser
import synth
from conftest import FIXTURES, built_tool
from trainbench.pages import tune as tune_page

CHROMIUM = browser.find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (scripts/install-deps "
                                                             "installs Debian's chromium)")
BLANK_SHARE = 0.985          # a screenshot with more of its background colour than this shows nothing
TUNE_FIXTURES = [("tune_page_tiny.json", "tune_page_tiny.jsonl"),
                 ("tune_page_entry_dataloader.json", "tune_page_entry_dataloader.jsonl"),
                 ("tune_page_ranks2.json", "tune_page_ranks2.jsonl"),
                 ("tune_page_ranks2_readme.json", "tune_page_ranks2_readme.jsonl"),
                 ("tune_page_my_train.json", "tune_page_my_train.jsonl"),
                 ("tune_page_small_gpt.json", "tune_page_small_gpt.jsonl"),
                 ("tuned_entry_ranks2_ddp.yaml", None)]
SHOTS = os.environ.get("TRAINBENCH_SCREENSHOTS")   # a folder to keep the screenshots in (docs/), else tmp_path


def page_problems(seen: browser.PageSeen, page: str, claim_id: str = "claim") -> list:
    """What is wrong with a page as the browser saw it: [] for a good one."""
    folder = "file://" + os.path.dirname(os.path.abspath(page)) + "/"
    problems = []
    share = browser.blank_share(seen.screenshot_png)
    if share > BLANK_SHARE:
        problems.append(f"blank: {share:.1%} of the screenshot is one colour")
    if not seen.images:
        problems.append("no image")
    for i, image in enumerate(seen.images):
        if not image.loaded:
            problems.append(f"image {i} did not load ({image.src_kind})")
        if not image.alt.strip():
            problems.append(f"image {i} has no alt text")
    if claim_id and not seen.text_by_id.get(claim_id):
        problems.append(f"no #{claim_id} text")
    outside = [u for u in seen.requests if not u.startswith("data:") and not u.startswith(folder)]
    if outside:
        problems.append(f"asked for {outside}")
    return problems


def keep_screenshot(seen: browser.PageSeen, name: str, tmp_path) -> str:
    folder = SHOTS or str(tmp_path)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(seen.screenshot_png)
    return path


@pytest.mark.python_only
@needs_chromium
@pytest.mark.parametrize("tuned,journal", TUNE_FIXTURES)
def test_a_tune_page_renders_with_its_claim_and_every_image(tmp_path, tuned, journal):
    page = str(tmp_path / "tune.html")
    args = [os.path.join(FIXTURES, tuned), "--out", page]
    if journal:
        args += ["--journal", os.path.join(FIXTURES, journal)]
    assert tune_page.main(args) == 0
    seen = browser.open_page(page, CHROMIUM)
    assert page_problems(seen, page) == []
    # The claim the browser shows is the sentence the tuned file makes (read back from the page's HTML source).
    loaded = tune_page.load_tuned(os.path.join(FIXTURES, tuned))
    lines = tune_page.load_journal(os.path.join(FIXTURES, journal)) if journal else None
    assert seen.text_by_id["claim"] in html.unescape(tune_page.tune_page(loaded, lines))
    assert seen.text_by_id["claim"].startswith(("Chosen", "Kept", "No configuration"))
    keep_screenshot(seen, f"tune-page-{tuned.split('.')[0]}.png", tmp_path)


@needs_chromium
def test_autotune_report_writes_a_page_the_browser_shows(tmp_path):
    """autotune --report on a short tune, then --report --from its tuned file: both pages open, with the claim the
    tuned file makes."""
    autotune = built_tool("TRAINBENCH_AUTOTUNE", "tuner", "autotune")
    if autotune is None:
        pytest.skip("autotune is not built")
    tuned, page, again = tmp_path / "tuned.json", tmp_path / "tune.html", tmp_path / "again.html"
    done = subprocess.run([autotune, "--gpu", "cpu", "--workload", "tiny", "--budget", "12", "--format", "json",
                           "--out", str(tuned), "--report", str(page)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "the tune's page: " + str(page) in done.stderr
    document = json.loads(tuned.read_text())["trainbench_autotune"]
    assert document["command"].startswith("autotune ") and "--report" in document["command"]
    assert os.path.isfile(document["journal"])
    seen = browser.open_page(str(page), CHROMIUM)
    assert page_problems(seen, str(page)) == []
    assert seen.text_by_id["command"] == document["command"]
    done = subprocess.run([autotune, "--from", str(tuned), "--report", str(again)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert browser.open_page(str(again), CHROMIUM).text_by_id["claim"] == seen.text_by_id["claim"]


@pytest.mark.python_only
@needs_chromium
def test_the_run_page_renders(tmp_path):
    from trainbench.pages import run as run_page
    page = str(tmp_path / "run.html")
    assert run_page.main([os.path.join(FIXTURES, "run_page_cpu_quick.json"), "--out", page]) == 0
    seen = browser.open_page(page, CHROMIUM)
    assert page_problems(seen, page) == []
    keep_screenshot(seen, "run-page.png", tmp_path)


@pytest.mark.python_only
@needs_chromium
def test_the_nightly_report_renders(cli, tmp_path):
    folder = tmp_path / synth.GPU_KEY
    synth.history(str(folder), 12, seed=3, backend="cuda", target="adamw", step_at=9, step=0.2)
    rc, _, err = cli("report", folder, "--out", tmp_path / "rep")
    assert rc == 0, err
    page = str(tmp_path / "rep" / "index.html")
    seen = browser.open_page(page, CHROMIUM)
    assert page_problems(seen, page, claim_id="") == []
    assert "regression" in seen.title.lower() or "nightly" in seen.title.lower()


@pytest.mark.python_only
@needs_chromium
def test_the_checks_fail_a_broken_page(tmp_path):
    """A page with an image that does not decode, one without alt text, one fetched over the network and no claim:
    each is found (the checks above can fail)."""
    good = tmp_path / "good.html"
    assert tune_page.main([os.path.join(FIXTURES, "tune_page_tiny.json"), "--out", str(good)]) == 0
    text = good.read_text()
    broken = tmp_path / "broken.html"
    broken.write_text(text.replace('id="claim"', 'id="not-the-claim"', 1)
                      .replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1)
                      .replace("</body>", '<img src="http://127.0.0.1:9/x.png" alt=""></body>'))
    problems = page_problems(browser.open_page(str(broken), CHROMIUM), str(broken))
    assert any(p.startswith("image 0 did not load") for p in problems), problems
    assert any("has no alt text" in p for p in problems), problems
    assert "no #claim text" in problems, problems
    assert any(p.startswith("asked for ['http://127.0.0.1:9/x.png']") for p in problems), problems
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><html><head><title>t</title></head><body></body></html>")
    problems = page_problems(browser.open_page(str(blank), CHROMIUM), str(blank))
    assert any(p.startswith("blank: ") for p in problems) and "no image" in problems, problems


@pytest.mark.python_only
def test_a_page_without_chromium_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINBENCH_CHROMIUM", str(tmp_path / "no-such-browser"))
    assert browser.find_chromium() is None
    with pytest.raises(browser.BrowserError, match="no Chromium found"):
        browser.open_page(str(tmp_path / "page.html"))
