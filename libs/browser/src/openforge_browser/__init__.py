"""A text-only browser harness: Playwright on Debian's Chromium, the page as an accessibility tree.

:mod:`openforge_browser.agent` is the agent loop (page → text tree → one Chat Completions call
through the proxy → tool calls executed in the browser, up to a step limit);
:mod:`openforge_browser.miniwob` writes the MiniWoB-style task family whose verifiers read the
final page state the harness leaves behind.
"""
