"""A page opened in a real browser: headless Chromium driven over its DevTools protocol on a pipe
(--remote-debugging-pipe: commands on fd 3, answers and events on fd 4, each message ending in a NUL byte), no
port, no package beyond the standard library. What a test wants to know of a page:

  - every request the page made (a self-contained page makes none but its own file and its data: images);
  - each <img>: loaded (complete, with a natural width), and its alt text;
  - the text of the elements the test names by id (the claim sentence);
  - a screenshot (PNG), and whether it is blank: one colour, or nothing but the background.

find_chromium() says where the browser is, or None; open_page() raises BrowserError when the browser cannot be
started or does not answer in time."""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ANSWER_SECONDS = 60          # a page of this project renders in well under a second; a cold browser starts in a few
PAGE_WIDTH, PAGE_HEIGHT = 1280, 900   # the screenshot's viewport: what a laptop shows first


class BrowserError(RuntimeError):
    pass


def find_chromium() -> Optional[str]:
    """The Chromium to drive: $TRAINBENCH_CHROMIUM, else the first of NAMES on PATH; None where there is none."""
    named = os.environ.get("TRAINBENCH_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Image:
    src_kind: str      # "data", "file" or the scheme it was loaded by
    alt: str
    loaded: bool       # complete and with a natural width: the browser decoded it
    width: int
    height: int


@dataclass
class PageSeen:
    requests: List[str] = field(default_factory=list)   # every URL the page asked for, its own included
    images: List[Image] = field(default_factory=list)
    text_by_id: Dict[str, str] = field(default_factory=dict)
    title: str = ""
    screenshot_png: bytes = b""
    console_errors: List[str] = field(default_factory=list)

    def outside_requests(self, page_url: str) -> List[str]:
        """The requests for anything but the page itself and its inline data."""
        return [u for u in self.requests if u != page_url and not u.startswith("data:")]


class _Pipe:
    """The DevTools protocol over the two pipes: send a command, read messages until its answer, keeping the
    events that came meanwhile."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int):
        self.proc, self.to_browser, self.from_browser = proc, to_browser, from_browser
        self.next_id = 0
        self.buffer = b""
        self.events: List[dict] = []

    def call(self, method: str, session: Optional[str] = None, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + ANSWER_SECONDS
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message', answer['error'])}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, event: str, deadline: float) -> dict:
        for i, e in enumerate(self.events):
            if e.get("method") == event:
                return self.events.pop(i)
        while True:
            message = self._read(deadline)
            if message.get("method") == event:
                return message
            self.events.append(message)

    def _read(self, deadline: float) -> dict:
        import select
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"the browser did not answer within {ANSWER_SECONDS} s")
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.from_browser, 1 << 16)
            if not chunk:
                raise BrowserError(f"the browser ended (exit status {self.proc.poll()})")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)


# Read in the page once it has loaded: its images, the text of each element with an id, its title.
_INSPECT = """JSON.stringify({
  title: document.title,
  images: Array.from(document.images).map(i => ({
    src: i.currentSrc || i.src, alt: i.getAttribute('alt') || '',
    loaded: i.complete && i.naturalWidth > 0, width: i.naturalWidth, height: i.naturalHeight})),
  ids: Object.fromEntries(Array.from(document.querySelectorAll('[id]')).map(e => [e.id, e.innerText]))
})"""


def open_page(path: str, chromium: Optional[str] = None, full_page: bool = False) -> PageSeen:
    """`path` opened in headless Chromium: what it requested, its images, its text by id, a screenshot (of the first
    screen, or with `full_page` of the whole page)."""
    chromium = chromium or find_chromium()
    if not chromium:
        raise BrowserError("no Chromium found (scripts/install-deps installs Debian's chromium)")
    url = "file://" + os.path.abspath(path)
    profile = tempfile.mkdtemp(prefix="trainbench-chromium.")
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    # The browser reads commands on its fd 3 and writes on its fd 4 (moved above 4 first, so that neither end
    # overwrites the other).
    def child_fds():
        import fcntl
        commands, answers = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        os.dup2(commands, 3)
        os.dup2(answers, 4)
    args = [chromium, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
            "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
            f"--window-size={PAGE_WIDTH},{PAGE_HEIGHT}", "about:blank"]
    proc = subprocess.Popen(args, close_fds=False, preexec_fn=child_fds,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_browser_r)
    os.close(from_browser_w)
    pipe = _Pipe(proc, to_browser_w, from_browser_r)
    try:
        target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
        session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            pipe.call(f"{domain}.enable", session)
        pipe.call("Page.navigate", session, url=url)
        pipe.wait_for("Page.loadEventFired", time.monotonic() + ANSWER_SECONDS)
        seen = PageSeen()
        inspected = json.loads(pipe.call("Runtime.evaluate", session, expression=_INSPECT,
                                         returnByValue=True)["result"]["value"])
        seen.title = inspected["title"]
        seen.text_by_id = {k: (v or "").strip() for k, v in inspected["ids"].items()}
        for i in inspected["images"]:
            kind = i["src"].split(":", 1)[0] if ":" in i["src"] else ""
            seen.images.append(Image(kind, i["alt"], bool(i["loaded"]), int(i["width"]), int(i["height"])))
        if full_page:
            size = pipe.call("Page.getLayoutMetrics", session)["cssContentSize"]
            shot = pipe.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True,
                             clip={"x": 0, "y": 0, "width": PAGE_WIDTH, "height": size["height"], "scale": 1})
        else:
            shot = pipe.call("Page.captureScreenshot", session, format="png")
        seen.screenshot_png = base64.b64decode(shot["data"])
        for e in pipe.events:
            if e.get("method") == "Network.requestWillBeSent":
                seen.requests.append(e["params"]["request"]["url"])
            elif e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error":
                seen.console_errors.append(e["params"]["entry"].get("text", ""))
        return seen
    finally:
        try:
            pipe.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_browser_w)
        os.close(from_browser_r)
        shutil.rmtree(profile, ignore_errors=True)


def png_rows(png: bytes):
    """The rows of an 8-bit RGB or RGBA PNG (what Chromium's screenshots are) as lists of pixel tuples."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        length = int.from_bytes(png[pos:pos + 4], "big")
        kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = (int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big"),
                                            body[8], body[9])
            if depth != 8 or colour not in (2, 6):
                raise ValueError(f"a PNG of depth {depth}, colour type {colour}: only 8-bit RGB(A) is read")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            up_left = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                predictor = left if pa <= pb and pa <= pc else (up if pb <= pc else up_left)
                line[x] = (line[x] + predictor) & 0xFF
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, channels)])
        previous = line
    return rows


def blank_share(png: bytes) -> float:
    """The share of the screenshot's pixels that are its most common colour (the background): 1.0 is blank."""
    counts: Dict[tuple, int] = {}
    total = 0
    for row in png_rows(png)[::4]:          # every 4th row and column: enough to tell a page from a blank
        for pixel in row[::4]:
            counts[pixel] = counts.get(pixel, 0) + 1
            total += 1
    return max(counts.values()) / total if total else 1.0
