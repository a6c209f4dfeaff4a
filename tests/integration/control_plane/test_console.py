"""The console in a real headless Chromium against `keg up`'s parts: the control plane
(store, REST API, xDS), its real ext_proc child, a real Envoy and a real Kafka broker.

The browser signs in with an API token, edits a rule, and sees the new version ACKed
by the ext_proc process (Versions and Fleet pages); the decisions and audit pages show
what real producers did; a draft is dry-run on samples taken from that traffic.
Screenshots of every page are kept in test-artifacts/console/ (gitignored).
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import ApiOptions, Gateway
from keg.paths import REPO_ROOT
from tests.browser import Browser, needs_chromium
from tests.integration.conftest import create_topic, gateway_settings, rule_dir

pytestmark = [pytest.mark.integration, needs_chromium]

ARTIFACTS = REPO_ROOT / "test-artifacts" / "console"
TOKEN = "console-token-0123456789abcdef"
RULES = """\
rules:
  - id: no-frozen-writes
    match: {apis: [Produce], topics: {prefix: [frozen.]}}
    action: {deny: {error: TOPIC_AUTHORIZATION_FAILED}}
"""


class Console:
    def __init__(self, gateway: Gateway, browser: Browser) -> None:
        assert gateway.app is not None and gateway.app.api_server is not None
        self.gateway, self.browser = gateway, browser
        self.api = f"http://127.0.0.1:{gateway.app.api_server.port}"

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        request = urllib.request.Request(
            f"{self.api}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                     **headers})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def page(self, name: str) -> None:
        """Show a page (again, if it is showing: a fresh read of the API)."""
        self.browser.evaluate(f"""(async () => {{
            delete document.body.dataset.ready;
            if (location.hash === '#/{name}') await route(); else location.hash = '#/{name}';
        }})()""")
        self.browser.wait_for(f"document.body.dataset.ready === '{name}'")

    def sign_in(self) -> None:
        """The console open and signed in with the test's token (from the start, or from
        where an earlier test left it)."""
        if not self.browser.evaluate("location.href.includes('/console')"):
            self.browser.goto(f"{self.api}/console")
            self.browser.wait_for("document.body.dataset.ready !== undefined")
        if self.browser.evaluate("document.body.dataset.signedIn") != "yes":
            self.browser.evaluate(f"""document.getElementById('token').value = {json.dumps(TOKEN)};
                document.getElementById('sign-in').click()""")
            self.browser.wait_for("document.body.dataset.signedIn === 'yes'")

    def until(self, name: str, expression: str, timeout: float = 60) -> Any:
        """Re-read page `name` until `expression` holds there."""
        deadline = time.monotonic() + timeout
        while True:
            self.page(name)
            value = self.browser.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.browser.evaluate("document.body.innerText")
                raise AssertionError(f"never true on {name}: {expression}\n{text[:3000]}")
            time.sleep(0.5)

    def shot(self, name: str) -> Path:
        return self.browser.screenshot(ARTIFACTS / f"{name}.png")


@pytest.fixture(scope="module")
def console(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    base = tmp_path_factory.mktemp("console")
    rules = rule_dir(base / "rules", {"rules.yaml": RULES})
    (base / "tokens").write_text(f"console-user:{TOKEN}\n")
    settings = gateway_settings(
        kafka, base / "work", rules_dir=rules, audit_log=base / "audit.jsonl", metrics_port=0,
        api=ApiOptions(data_dir=base / "store", port=0, tokens_file=base / "tokens"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Gateway(settings) as gateway, Browser() as browser:
        yield Console(gateway, browser)


def produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "console-test",
                         "retries": 0, "message.timeout.ms": 20000})
    producer.produce(topic, b'{"amount": 5}')
    producer.flush(30)


def test_sign_in_edit_a_rule_and_see_it_acked_by_the_ext_proc_process(
        console: Console, kafka: EmbeddedKafka) -> None:
    browser = console.browser
    # A rule written through REST (a directory owns the other one: read-only here).
    console.call("PUT", "/v1/rules/watch-orders", {
        "id": "watch-orders", "match": {"apis": ["Produce"], "topics": {"exact": ["orders"]}},
        "action": {"observe": {}}}, **{"If-None-Match": "*", "X-Keg-Reason": "test setup"})
    orders = create_topic(kafka.bootstrap, name=f"orders-{uuid.uuid4().hex[:6]}")
    produce(console.gateway.bootstrap, f"frozen.{uuid.uuid4().hex[:6]}")
    produce(console.gateway.bootstrap, orders)

    browser.goto(f"{console.api}/console")
    browser.wait_for("document.body.dataset.ready === 'rules'")
    assert browser.evaluate("!!document.getElementById('sign-in-needed')")
    console.shot("0-signed-out")

    console.sign_in()
    browser.wait_for("!!document.querySelector('tr[data-rule-id=\"watch-orders\"]')")
    rows = browser.evaluate("[...document.querySelectorAll('tr[data-rule-id]')]"
                            ".map(r => r.dataset.ruleId)")
    assert set(rows) == {"no-frozen-writes", "watch-orders"}
    console.shot("1-rules")

    # Edit: watch a second topic too, and save with a reason.
    browser.evaluate("document.querySelector('tr[data-rule-id=\"watch-orders\"] button').click()")
    browser.wait_for("!!document.getElementById('rule-json')")
    edited = json.loads(browser.evaluate("document.getElementById('rule-json').value"))
    edited["match"]["topics"]["exact"].append(orders)
    browser.evaluate(f"""document.getElementById('rule-json').value = {json.dumps(
        json.dumps(edited, indent=2))};
        document.getElementById('rule-reason').value = 'watch the new orders topic';""")
    console.shot("2-rule-editor")
    browser.evaluate("document.getElementById('save-rule').click()")
    saved = browser.wait_for("document.getElementById('message').textContent.startsWith("
                             "'Saved') && document.getElementById('message').textContent")
    assert saved.startswith("Saved: version "), saved
    version = int(saved.removeprefix("Saved: version ").split()[0])

    # The new version: written by the token's name, then ACKed by the real ext_proc.
    row = f"tr[data-version=\"{version}\"]"
    console.until("versions", f"document.querySelector('{row}')?.dataset.status === 'applied'")
    info = console.call("GET", f"/v1/versions/{version}")["info"]
    assert (info["author"], info["reason"], info["status"]) == (
        "console-user", "watch the new orders topic", "applied")
    browser.evaluate(f"document.querySelector('{row} button.diff').click()")
    diff = browser.wait_for("document.getElementById('unified-diff')?.textContent")
    assert f"+      - {orders}" in diff
    console.shot("3-versions-and-diff")

    applied = console.until("fleet", "document.querySelector('tr[data-role=\"ext_proc\"] "
                                     "[data-type=\"keg.v1.RuleSet\"]')?.dataset.applied")
    assert applied == str(version)
    assert browser.evaluate("document.querySelector('tr[data-role=\"ext_proc\"]').textContent"
                            ".includes('ACK')")
    console.shot("4-fleet")
    assert browser.console_errors() == []


def test_a_page_left_before_it_loaded_never_replaces_the_page_shown_after(
        console: Console) -> None:
    """Leaving a page before its data arrived: the page navigated to stays (the rules
    page, read slowly, replaced the versions page a user had opened meanwhile; seen as
    this suite's versions page never showing under load)."""
    browser = console.browser
    console.sign_in()
    console.page("fleet")
    browser.evaluate("""(() => {
        const fetched = window.fetch;
        window.fetch = (url, init) => String(url).endsWith('/v1/rules')
            ? new Promise(wait => setTimeout(wait, 1500)).then(() => fetched(url, init))
            : fetched(url, init);
        delete document.body.dataset.ready;
        location.hash = '#/rules';
        setTimeout(() => { location.hash = '#/versions'; }, 100);
    })()""")
    browser.wait_for("document.body.dataset.ready === 'versions'")
    time.sleep(2.5)  # the rules page's read has long come back
    try:
        assert browser.evaluate("document.body.dataset.ready") == "versions"
        assert browser.evaluate("document.querySelector('#page > section').dataset.page") \
            == "versions"
        assert browser.evaluate("location.hash") == "#/versions"
    finally:
        browser.evaluate("location.reload()")
        browser.wait_for("document.readyState === 'complete' && "
                         "document.body.dataset.ready !== undefined")


def test_decisions_audit_and_a_dry_run_of_recent_traffic(console: Console) -> None:
    browser = console.browser
    produce(console.gateway.bootstrap, f"frozen.{uuid.uuid4().hex[:6]}")
    total = console.until("decisions", "document.querySelector("
                                       "'tr[data-rule=\"no-frozen-writes\"]')?.dataset.total")
    assert float(total) >= 1
    console.shot("5-decisions")

    console.until("audit", "!!document.querySelector('tr[data-rule=\"no-frozen-writes\"]')")
    console.shot("6-audit")

    console.page("dry-run")
    browser.evaluate("document.getElementById('recent-traffic').click()")
    samples = json.loads(browser.wait_for(
        "document.getElementById('samples').value.includes('frozen.') && "
        "document.getElementById('samples').value"))
    assert samples["requests"] and all(r["api"] == "Produce" for r in samples["requests"])
    browser.evaluate("""document.getElementById('draft').value =
        'rules:\\n  - id: freeze-all\\n    match: {apis: [Produce]}\\n    action: {deny: {}}\\n';
        document.getElementById('run-dry-run').click()""")
    verdicts = browser.wait_for(
        "[...document.querySelectorAll('#dry-run-results tr[data-verdict]')]"
        ".map(r => r.dataset.verdict).join(',')")
    assert set(verdicts.split(",")) == {"answer"}  # the draft would refuse them all
    console.shot("7-dry-run")
    assert browser.console_errors() == []
