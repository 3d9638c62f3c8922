"""The bundled webchat page in Chromium with a long conversation: what it costs to open,
scroll and stream into.

A real webchat connector (SQLite in a temporary folder, a static token) holds one conversation
of `--messages` replies (each tenth a long Markdown one, as in tests/webchat/test_browser_long.py);
Debian's Chromium (Playwright, `/usr/bin/chromium`) opens it and reports:

- open: milliseconds from the `history` frame's arrival until the page has drawn it (two
  animation frames), and the main thread's long tasks (> 50 ms) meanwhile;
- the elements in the document then (`document.getElementsByTagName('*').length`) and the
  messages (`.msg`);
- scroll: the reader scrolls up to the top page after page (`--scrolls` wheel turns, each
  waiting for what it brings), then the same figures; and one more wheel turn's time to draw;
- stream: a reply of `--deltas` pieces streamed into the conversation, milliseconds of main-
  thread work per piece (the sum of long tasks and the per-frame time in the page).

    .venv/bin/python benchmarks/webchat_page.py [--messages 20000] [--history-limit 20000]
        [--scrolls 20] [--deltas 200]

Absolute milliseconds depend on the machine: compare runs made on the same one. Nothing here is
a test; tests/webchat/test_browser_long.py asserts the behaviour.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # talkbridge from this checkout, as core.py does

from playwright.async_api import async_playwright  # noqa: E402

from talkbridge.config import WebchatConfig  # noqa: E402
from talkbridge.connectors.base import ConnectorContext  # noqa: E402
from talkbridge.message import OutboundMessage  # noqa: E402
from talkbridge.store import SqliteStore  # noqa: E402
from talkbridge.webchat import WebchatConnector  # noqa: E402

TOKEN = "benchmark-token-0123456789"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
MARKDOWN = (
    "## A long answer\n\n"
    + (
        "Some **bold**, `code` and a [link](https://example.com/).\n\n- one\n- two\n\n"
        "```\nprint('a block')\n```\n\n"
    )
    * 4
)

# Before the page's own script: long tasks are counted, and the time each `history` frame
# takes to reach the screen (handled, then two animation frames) is kept.
PROBE = """
window.__long = [];
new PerformanceObserver(list => {
    for (const e of list.getEntries()) window.__long.push(e.duration);
}).observe({ type: 'longtask', buffered: true });
window.__drawn = [];
const Real = WebSocket;
window.WebSocket = class extends Real {
    constructor(...args) {
        super(...args);
        this.addEventListener('message', event => {
            if (!event.data.startsWith('{"type":"history"')) return;
            const start = performance.now();
            requestAnimationFrame(() => requestAnimationFrame(() => {
                window.__drawn.push(performance.now() - start);
            }));
        });
    }
};
"""
FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
COUNTS = """() => ({
    elements: document.getElementsByTagName('*').length,
    messages: document.querySelectorAll('.msg').length,
})"""


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        await store.open()
        config = WebchatConfig(host="127.0.0.1", port=0, history_limit=args.history_limit)
        context = ConnectorContext(store, logging.getLogger("bench.webchat"))
        connector = WebchatConnector(config, context, [TOKEN], lambda: {})

        class Up:
            def up(self) -> None: ...
            def degraded(self, reason: str) -> None: ...

        task = asyncio.create_task(connector.run(Up()))
        await connector.ready.wait()
        url = f"http://127.0.0.1:{connector.port}/?token={quote(TOKEN)}"
        try:
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page_context = await browser.new_context(viewport={"width": 1100, "height": 800})
                page_context.set_default_timeout(600_000)
                await page_context.add_init_script(PROBE)
                page = await page_context.new_page()
                await page.goto(url)
                await page.wait_for_selector("#status[data-state=online]")
                thread_id = await page.evaluate("localStorage.getItem('talkbridge.active')")
                await page.close()
                started = time.perf_counter()
                for n in range(1, args.messages + 1):
                    text = MARKDOWN if n % 10 == 0 else f"m{n}"
                    await connector.send(OutboundMessage(thread_id=thread_id, text=text))
                print(f"stored {args.messages} messages in {time.perf_counter() - started:.1f} s")
                await report(page_context, url, thread_id, connector, args)
                await browser.close()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await store.close()


async def report(
    context: Any, url: str, thread_id: str, connector: WebchatConnector, args: argparse.Namespace
) -> None:
    page = await context.new_page()
    await page.goto(url)
    await page.wait_for_function("() => window.__drawn.length > 0")
    await page.evaluate(FRAMES)
    opened = await page.evaluate(f"async () => ({{ ...({COUNTS})(), drawn: window.__drawn[0] }})")
    long_tasks = await page.evaluate("window.__long.reduce((a, b) => a + b, 0)")
    print(
        f"open:   {opened['drawn']:7.0f} ms to draw the history; long tasks {long_tasks:.0f} ms; "
        f"{opened['elements']} elements, {opened['messages']} messages in the document"
    )

    box = page.locator("#messages")
    await box.hover()
    await page.evaluate("window.__long = []")
    started = time.perf_counter()
    for _ in range(args.scrolls):
        await page.mouse.wheel(0, -100_000)
        await page.evaluate(FRAMES)
        await page.wait_for_function(
            "() => !document.querySelector('.earlier')?.disabled", polling="raf"
        )
        await page.evaluate(FRAMES)
    scrolled = time.perf_counter() - started
    counts = await page.evaluate(COUNTS)
    long_tasks = await page.evaluate("window.__long.reduce((a, b) => a + b, 0)")
    turn = await page.evaluate(
        """async () => {
            const box = document.getElementById('messages');
            const start = performance.now();
            box.scrollTop = box.scrollHeight / 2;
            await new Promise(d => requestAnimationFrame(() => requestAnimationFrame(d)));
            return performance.now() - start;
        }"""
    )
    print(
        f"scroll: {args.scrolls} wheel turns up in {scrolled * 1000:.0f} ms; long tasks "
        f"{long_tasks:.0f} ms; {counts['elements']} elements, {counts['messages']} messages; "
        f"a jump to the middle draws in {turn:.0f} ms"
    )

    await page.evaluate("document.getElementById('messages').scrollTop = 1e9")
    await page.evaluate(FRAMES)
    await page.evaluate("window.__long = []")
    started = time.perf_counter()
    piece = "Some **bold** words, `code`, and [a link](https://example.com/) "
    for _ in range(args.deltas):
        await connector._publish_delta(thread_id, "bench", piece)
    final = OutboundMessage(
        thread_id=thread_id, text=piece * args.deltas, meta={"stream_id": "bench"}
    )
    await connector.send(final)
    await page.wait_for_function("() => !document.querySelector('.msg.streaming')")
    await page.evaluate(FRAMES)
    streamed = time.perf_counter() - started
    long_tasks = await page.evaluate("window.__long.reduce((a, b) => a + b, 0)")
    print(
        f"stream: {args.deltas} pieces shown in {streamed * 1000:.0f} ms "
        f"({streamed * 1000 / args.deltas:.1f} ms a piece); long tasks {long_tasks:.0f} ms"
    )
    await page.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--history-limit", type=int, default=20_000)
    parser.add_argument("--scrolls", type=int, default=20)
    parser.add_argument("--deltas", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
