// keg console: one page, plain JavaScript, no build step, nothing loaded from elsewhere.
// Every read and write goes through the control plane's REST API (/v1/...) with the
// token signed in with (kept in this tab's sessionStorage, sent as a Bearer token).
"use strict";

const API = new URL("..", document.baseURI).pathname.replace(/\/$/, "");
const TOKEN_KEY = "keg-console-token";
const REFRESH_MS = 5000;
let refreshTimer = null;

// -- helpers -----------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(text, kind) {
  return el("span", { class: `badge ${kind || text}` }, text);
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function when(value) {
  return value ? new Date(value).toLocaleString() : "";
}

function say(text, kind = "ok") {
  const box = document.getElementById("message");
  box.replaceChildren(text ? el("div", { class: kind, id: `message-${kind}` }, text) : "");
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

class ApiError extends Error {
  constructor(status, problem) {
    const errors = (problem.errors || []).map((e) =>
      `${e.file || ""}${e.line ? ":" + e.line : ""} ${e.field || ""}: ${e.message}`);
    super([`${status} ${problem.title || ""}: ${problem.detail || ""}`, ...errors].join("\n"));
    this.status = status;
    this.problem = problem;
  }
}

async function api(method, path, { body, headers = {} } = {}) {
  const init = { method, headers: { Accept: "application/json", ...headers } };
  if (token()) init.headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch(API + path, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { detail: text }; }
  if (!response.ok) throw new ApiError(response.status, data || {});
  return { data, response };
}

function actionOf(rule) {
  const action = rule.action || {};
  return Object.keys(action)[0] || "";
}

// -- sign in -----------------------------------------------------------------------------

async function signIn(event) {
  event.preventDefault();
  const value = document.getElementById("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, value);
  try {
    await api("GET", "/v1/rules");
    document.getElementById("token").value = "";
    say("Signed in.");
  } catch (err) {
    sessionStorage.removeItem(TOKEN_KEY);
    say(`Sign-in refused: ${err.message}`, "error");
  }
  showLogin();
  route();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
  say("Signed out.");
  route();
}

function showLogin() {
  const signedIn = Boolean(token());
  document.getElementById("token").hidden = signedIn;
  document.getElementById("sign-in").hidden = signedIn;
  document.getElementById("sign-out").hidden = !signedIn;
  document.getElementById("who").textContent = signedIn ? "signed in" : "";
  document.body.dataset.signedIn = signedIn ? "yes" : "no";
}

// -- pages -------------------------------------------------------------------------------

const pages = {
  async rules(page) {
    const { data } = await api("GET", "/v1/rules");
    page.append(el("h2", {}, "Rules"),
      el("p", { id: "rules-summary" }, `Version ${data.version} (`, badge(data.status),
        `), live version ${data.live_version ?? "none"}. `,
        el("button", { id: "new-rule", onclick: () => editRule(page, null) }, "New rule")));
    const rows = data.rules.map((entry) => el("tr", { dataset: { ruleId: entry.id } },
      el("td", {}, entry.id), el("td", {}, actionOf(entry.rule)),
      el("td", {}, entry.rule.mode || "enforce"),
      el("td", {}, entry.owner || el("span", { class: "muted" }, "REST")),
      el("td", {}, entry.source ? `${entry.source.file}${entry.source.line ? ":" + entry.source.line : ""}` : ""),
      el("td", {}, el("button", { class: "edit", onclick: () => editRule(page, entry) },
        entry.owner ? "View" : "Edit"))));
    page.append(table(["id", "action", "mode", "owner", "source", ""], rows),
      el("div", { id: "editor" }));
  },

  async versions(page) {
    const { data } = await api("GET", "/v1/versions?limit=50");
    page.append(el("h2", {}, "Versions"));
    const rows = data.versions.map((v) => el("tr", {
      dataset: { version: v.number, status: v.status },
    }, el("td", {}, v.number), el("td", {}, when(v.created_at)), el("td", {}, v.author),
      el("td", {}, v.operation), el("td", {}, v.reason), el("td", {}, v.rule_count),
      el("td", {}, badge(v.status)), el("td", { class: "muted" }, v.status_detail || ""),
      el("td", {}, el("button", { class: "diff", onclick: () => showDiff(page, v) }, "Diff"))));
    page.append(table(["#", "when", "who", "operation", "why", "rules", "status", "detail", ""],
      rows), el("div", { id: "diff" }));
  },

  async "dry-run"(page) {
    const rules = el("textarea", { id: "draft", rows: 14 }, DRAFT_EXAMPLE);
    const samples = el("textarea", { id: "samples", rows: 14 },
      JSON.stringify(SAMPLES_EXAMPLE, null, 2));
    const results = el("div", { id: "dry-run-results" });
    const run = async () => {
      let parsed;
      try { parsed = JSON.parse(samples.value); } catch (err) {
        say(`The samples are not JSON: ${err.message}`, "error");
        return;
      }
      try {
        const { data } = await api("POST", "/v1/dry-run", {
          body: { rules: rules.value, requests: parsed.requests || [], records: parsed.records || [] },
        });
        showDryRun(results, data);
        say("Dry run done: nothing was changed.");
      } catch (err) { say(err.message, "error"); }
    };
    const recent = async () => {
      try {
        const { data } = await api("GET", "/v1/audit?limit=200");
        const requests = requestsFromAudit(data.events);
        samples.value = JSON.stringify({ requests, records: [] }, null, 2);
        say(`${requests.length} request(s) from the audit tail.`);
      } catch (err) { say(err.message, "error"); }
    };
    page.append(el("h2", {}, "Dry run of a draft"),
      el("p", { class: "muted" }, "A candidate rule file (YAML or JSON) applied to sample requests and records by the data path's own filters (POST /v1/dry-run). Nothing is written."),
      el("div", { class: "row" },
        el("div", {}, el("h3", {}, "Draft rules"), rules),
        el("div", {}, el("h3", {}, "Samples"), samples)),
      el("p", {}, el("button", { id: "run-dry-run", class: "primary", onclick: run }, "Dry run"),
        " ", el("button", { id: "recent-traffic", onclick: recent }, "Samples from recent traffic (audit tail)")),
      results);
  },

  async fleet(page) {
    const { data } = await api("GET", "/v1/fleet");
    page.append(el("h2", {}, "Fleet"));
    if (!data.available) {
      page.append(el("p", {}, "This control plane has no fleet view."));
      return;
    }
    const rows = data.nodes.map((node) => {
      const types = Object.entries(node.types).map(([type, state]) => el("div", {
        dataset: { type, applied: state.applied_version },
      }, `${type.split(".").pop()}: applied ${state.applied_version || "-"}`,
        state.applied_version !== state.sent_version ? ` (sent ${state.sent_version})` : "",
        " ", badge(state.last_nack ? "NACK" : "ACK", state.last_nack ? "nack" : "ack"),
        state.last_nack ? el("div", { class: "muted" },
          `${state.last_nack.version}: ${state.last_nack.error}`) : ""));
      return el("tr", { dataset: { node: node.node_id, role: node.role } },
        el("td", {}, node.node_id), el("td", {}, node.role), el("td", {}, node.cluster),
        el("td", {}, node.data_path || (node.role === "ext_proc" ? "ext_proc" : "")),
        el("td", {}, badge(node.connected ? "yes" : "no")), el("td", {}, types),
        el("td", {}, when(node.last_seen)));
    });
    page.append(table(["node", "role", "group", "data path", "connected", "versions (ACK/NACK)", "last seen"], rows));
  },

  async decisions(page) {
    const { data } = await api("GET", "/v1/decisions");
    const outcomes = [...new Set(data.rules.flatMap((r) => Object.keys(r.outcomes)))].sort();
    page.append(el("h2", {}, "Decisions per rule"),
      el("p", { class: "muted" }, `From ${data.source}, live (every ${REFRESH_MS / 1000} s); at ${when(data.at)}. `,
        data.targets.map((t) => el("span", {}, badge(t.ok ? "ok" : "down", t.ok ? "yes" : "no"), " ", t.url, t.error ? ` (${t.error})` : "", " "))),
      table(["rule", "action", "mode", ...outcomes, "total"], data.rules.map((r) =>
        el("tr", { dataset: { rule: r.rule, total: r.total } }, el("td", {}, r.rule),
          el("td", {}, r.action), el("td", {}, r.mode),
          outcomes.map((o) => el("td", {}, r.outcomes[o] ?? "")), el("td", {}, r.total)))));
    schedule();
  },

  async audit(page) {
    page.append(el("h2", {}, "Audit tail"));
    let data;
    try {
      ({ data } = await api("GET", "/v1/audit?limit=100"));
    } catch (err) {
      if (err.status === 404 || err.status === 503) {
        page.append(el("p", { id: "audit-unavailable" }, err.problem.detail));
        return;
      }
      throw err;
    }
    page.append(el("p", { class: "muted" }, `${data.source}, newest first, live (every ${REFRESH_MS / 1000} s).`),
      table(["time", "principal", "client", "api", "topic", "rule", "action", "mode", "outcome", "error", "reason"],
        data.events.map((e) => el("tr", { dataset: { rule: e.rule_id || "" } },
          el("td", {}, when(e.time || e.ts || e.timestamp)), el("td", {}, e.principal),
          el("td", {}, e.client_id), el("td", {}, e.api_name || e.api_key), el("td", {}, e.topic),
          el("td", {}, e.rule_id), el("td", {}, e.action), el("td", {}, e.mode),
          el("td", {}, e.outcome), el("td", {}, e.error_code ?? ""), el("td", {}, e.reason)))));
    schedule();
  },
};

const DRAFT_EXAMPLE = `rules:
  - id: payments-writers-only
    match:
      apis: [Produce]
      topics: {prefix: [payments.]}
      not: {principals: {exact: ["User:alice"]}}
    action: {deny: {error: TOPIC_AUTHORIZATION_FAILED}}
`;
const SAMPLES_EXAMPLE = {
  requests: [{ api: "Produce", version: 9, principal: "User:bob",
    body: { TopicData: [{ Name: "payments.eu", PartitionData: [{ Index: 0 }] }] } }],
  records: [{ topic: "payments.eu", value: "{\"card\": \"4111\", \"amount\": 5}" }],
};

// Recent traffic: the audit tail's events, as sample requests (Produce: their topic).
function requestsFromAudit(events) {
  const seen = new Set();
  const requests = [];
  for (const e of events) {
    if (e.api_name !== "Produce" || !e.topic) continue;
    const key = `${e.principal}|${e.client_id}|${e.topic}`;
    if (seen.has(key)) continue;
    seen.add(key);
    requests.push({ api: "Produce", version: e.api_version || 9, principal: e.principal || "",
      client_id: e.client_id || "", body: { TopicData: [{ Name: e.topic,
        PartitionData: [{ Index: e.partition ?? 0 }] }] } });
  }
  return requests;
}

function showDryRun(box, data) {
  box.replaceChildren(
    el("h3", {}, `Requests (${data.ruleset.source} rules ${data.ruleset.ruleset_hash.slice(0, 16)})`),
    table(["#", "verdict", "decisions"], data.requests.map((r, i) => el("tr", {
      dataset: { verdict: r.verdict },
    }, el("td", {}, i + 1), el("td", {}, r.verdict),
      el("td", {}, (r.decisions || []).map((d) => el("div", {},
        `${d.rule}: ${d.outcome}${d.topic ? " " + d.topic : ""}${d.error ? " " + d.error : ""}`)))))),
    el("h3", {}, "Records"),
    table(["#", "status", "steps"], data.records.map((r, i) => el("tr", { dataset: { status: r.status } },
      el("td", {}, i + 1), el("td", {}, r.status),
      el("td", {}, (r.steps || []).map((s) => el("div", {}, JSON.stringify(s))))))));
}

function editRule(page, entry) {
  const box = page.querySelector("#editor");
  const owned = entry && entry.owner;
  const text = el("textarea", { id: "rule-json", rows: 12, readonly: owned },
    JSON.stringify(entry ? entry.rule : { id: "new-rule", match: { apis: ["Produce"] },
      action: { observe: {} } }, null, 2));
  const reason = el("input", { id: "rule-reason", class: "reason", placeholder: "why (recorded with the version)" });
  const save = async () => {
    let rule;
    try { rule = JSON.parse(text.value); } catch (err) {
      say(`The rule is not JSON: ${err.message}`, "error");
      return;
    }
    const id = entry ? entry.id : rule.id;
    const headers = { "X-Keg-Reason": reason.value || "edited in the console" };
    if (entry) headers["If-Match"] = `"${entry.etag}"`; else headers["If-None-Match"] = "*";
    try {
      const { data } = await api("PUT", `/v1/rules/${encodeURIComponent(id)}`, { body: rule, headers });
      say(data.changed ? `Saved: version ${data.version} written; the fleet's answer shows under Versions.`
        : "No change: the rule was already so.");
      route();
    } catch (err) { say(err.message, "error"); }
  };
  const remove = async () => {
    if (button.dataset.armed !== "yes") {
      button.dataset.armed = "yes";
      button.textContent = "Really delete?";
      return;
    }
    try {
      const { data } = await api("DELETE", `/v1/rules/${encodeURIComponent(entry.id)}`, {
        headers: { "If-Match": `"${entry.etag}"`, "X-Keg-Reason": reason.value || "deleted in the console" } });
      say(`Deleted: version ${data.version} written.`);
      route();
    } catch (err) { say(err.message, "error"); }
  };
  const button = el("button", { id: "delete-rule", class: "danger", onclick: remove }, "Delete");
  box.replaceChildren(el("div", { class: "panel" },
    el("h3", {}, entry ? `Rule ${entry.id}` : "New rule"),
    owned ? el("p", { class: "muted" }, `Owned by ${entry.owner}: change it in its rule directory (GitOps).`) : "",
    text,
    owned ? "" : el("p", {}, reason, " ",
      el("button", { id: "save-rule", class: "primary", onclick: save }, "Save"), " ",
      entry ? button : "")));
}

async function showDiff(page, version) {
  const box = page.querySelector("#diff");
  try {
    const { data } = await api("GET", `/v1/versions/${version.number}/diff`);
    const lines = data.unified.split("\n").map((line) => el("span", {
      class: line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "",
    }, line + "\n"));
    const rollback = async () => {
      try {
        const { data: done } = await api("POST", `/v1/versions/${version.number}/rollback`, {
          headers: { "X-Keg-Reason": `rollback to ${version.number} from the console` } });
        say(`Rolled back: version ${done.version ?? ""} written.`);
        route();
      } catch (err) { say(err.message, "error"); }
    };
    box.replaceChildren(el("div", { class: "panel" },
      el("h3", {}, `Version ${version.number}: ${data.from} → ${data.to}`),
      el("p", {}, `added ${data.added.join(", ") || "-"}; removed ${data.removed.join(", ") || "-"}; changed ${data.changed.join(", ") || "-"}`),
      el("pre", { class: "diff", id: "unified-diff" }, lines),
      el("button", { id: "rollback", onclick: rollback }, `Roll back to version ${version.number}`)));
  } catch (err) { say(err.message, "error"); }
}

// -- routing -----------------------------------------------------------------------------

function schedule() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => route(true), REFRESH_MS);
}

// Each route() call's turn: only the newest one may show its page. A page whose read is
// slow would otherwise replace the page the user went to meanwhile.
let routeTurn = 0;

async function route(refreshing = false) {
  clearTimeout(refreshTimer);
  const turn = ++routeTurn;
  const name = (location.hash.replace(/^#\//, "") || "rules").split("?")[0];
  const render = pages[name] || pages.rules;
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.nav === name);
  }
  const page = el("section", { id: `page-${name}`, dataset: { page: name, loading: "yes" } });
  try {
    await render(page);
  } catch (err) {
    if (err.status === 401 || err.status === 403) {
      page.replaceChildren(el("p", { id: "sign-in-needed" }, "Sign in with an API token to read this page."));
    } else {
      page.replaceChildren(el("p", { class: "error" }, err.message));
    }
  }
  delete page.dataset.loading;
  if (turn !== routeTurn) return;
  if (refreshing && document.getElementById("page").firstChild?.dataset.page !== name) return;
  document.getElementById("page").replaceChildren(page);
  document.body.dataset.ready = name;
}

document.getElementById("login").addEventListener("submit", signIn);
document.getElementById("sign-out").addEventListener("click", signOut);
window.addEventListener("hashchange", () => { say(""); route(); });
showLogin();
route();
