// The report's own behaviour: sort the outcome grids, open an episode's transcript. Episodes are stored gzipped
// (base64) in #report-data and inflated with the browser's DecompressionStream only when opened, so a large
// evaluation stays small on disk and quick to open. Text goes in with textContent, never as HTML.
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const COLORS = DATA.outcome_colors;

  async function inflate(b64) {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function json(value) {
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function pretty(value) {
    return typeof value === "string" ? value : JSON.stringify(value, null, 1);
  }

  function fact(parent, label, value) {
    if (value === undefined || value === null || value === "") return;
    const f = el("span", "fact");
    f.append(el("b", null, label + " "), document.createTextNode(String(value)));
    parent.append(f);
  }

  function fmt(x, digits) {
    return typeof x === "number" ? x.toFixed(digits) : x;
  }

  async function render(key) {
    const [runIndex, domain, taskId, sample] = key.split("|");
    const episode = await inflate(DATA.episodes[key]);
    const viewer = document.getElementById("viewer");
    document.getElementById("viewer-kicker").textContent =
      DATA.runs[runIndex] + " \u00b7 sample " + sample;
    document.getElementById("viewer-title").textContent = "task " + domain + "/" + taskId;
    const body = document.getElementById("viewer-body");
    body.replaceChildren();
    body.dataset.episode = key;

    const facts = el("div", "facts");
    const pill = el("span", "pill", episode.outcome);
    pill.style.background = COLORS[episode.outcome] || "#666";
    facts.append(pill);
    fact(facts, "task", domain + "/" + taskId);
    fact(facts, "reward", episode.reward === null ? "none" : fmt(episode.reward, 3));
    fact(facts, "termination", episode.termination);
    fact(facts, "cut by", episode.truncated_by);
    fact(facts, "turns", episode.turns);
    fact(facts, "tokens", episode.tokens);
    fact(facts, "wall", episode.wall_s === null ? null : fmt(episode.wall_s, 1) + " s");
    body.append(facts);
    if (episode.error) body.append(el("div", "turn error", episode.error));

    body.append(el("h3", null, "Conversation"));
    const prompt = systemPrompt(Number(runIndex), domain + "/" + taskId);
    const details = el("details", "system");
    details.append(el("summary", null, "System prompt (" + (prompt === null ? "not recorded" : prompt.length + " characters") + ")"));
    details.append(el("pre", "sys", prompt === null ? "This run did not record its system prompts." : prompt));
    body.append(details);
    const whoOf = { user: "user", assistant: "agent", system: "system", developer: "developer",
      call: "tool call", output: "tool answer", reasoning: "reasoning" };
    for (const item of episode.items) {
      const turn = el("div", "turn " + item.kind);
      turn.append(el("div", "who", whoOf[item.kind] || item.kind));
      if (item.kind === "call") {
        turn.append(document.createTextNode(item.name + "(" + json(item.args) + ")"));
      } else {
        turn.append(document.createTextNode(item.text));
      }
      body.append(turn);
    }
    if (!episode.items.length) body.append(el("p", "muted", "No transcript (an infrastructure error, or eval.keep_transcripts=false)."));

    body.append(el("h3", null, "Reward breakdown"));
    const table = el("table", "data");
    const head = el("tr");
    head.append(el("th", null, "component"), el("th", null, "score"), el("th", null, "counts toward reward"));
    table.append(head);
    const basis = episode.reward_basis || [];
    for (const [name, score] of Object.entries(episode.components)) {
      const row = el("tr");
      row.append(el("td", null, name), el("td", null, fmt(score, 2)), el("td", null, basis.length ? (basis.includes(name) ? "yes" : "no") : "?"));
      table.append(row);
    }
    body.append(table);
    for (const [name, value] of Object.entries(episode.checks)) {
      const d = el("details", "system");
      d.append(el("summary", null, name), el("pre", "sys", pretty(value)));
      body.append(d);
    }

    body.append(el("h3", null, "Gold actions and the agent's tool calls"));
    const actions = el("div", "actions");
    const gold = el("div");
    gold.append(el("div", "muted", "gold (tau2's expected actions)"));
    const goldList = el("ol");
    for (const a of episode.gold) {
      goldList.append(el("li", a.matched ? "hit" : "miss", (a.matched ? "\u2713 " : "\u2717 ") + a.name + "(" + json(a.args) + ")"));
    }
    if (!episode.gold.length) goldList.append(el("li", "muted", "none recorded"));
    gold.append(goldList);
    const actual = el("div");
    actual.append(el("div", "muted", "actual (in order)"));
    const actualList = el("ol");
    for (const item of episode.items.filter((i) => i.kind === "call")) {
      actualList.append(el("li", null, item.name + "(" + json(item.args) + ")"));
    }
    actual.append(actualList);
    actions.append(gold, actual);
    body.append(actions);
    if (episode.contiguity_breaks.length) {
      body.append(el("h3", null, "Token-contiguity breaks"));
      for (const b of episode.contiguity_breaks) body.append(el("div", "turn error", b));
    }
    viewer.hidden = false;
    viewer.dataset.open = key;
    body.scrollTop = 0;
  }

  let promptCache = {};
  function systemPrompt(runIndex, task) {
    const index = (DATA.prompts[runIndex] || {})[task];
    if (index === undefined) return null;
    if (!(index in promptCache)) promptCache[index] = DATA.prompt_texts[index];
    return promptCache[index];
  }

  function open(key) {
    if (!(key in DATA.episodes)) return;
    render(key).catch((e) => console.warn("could not open episode", key, e));
  }

  function sortGrid(runIndex, order, button) {
    const range = Bokeh.documents[0].get_model_by_name("grid_rows_" + runIndex);
    range.factors = DATA.orders[runIndex][order];
    for (const b of button.parentElement.querySelectorAll("button")) b.classList.toggle("active", b === button);
  }

  window.nemoReport = {
    open: open,
    openFromSource: function (source) {
      const index = source.selected.indices[0];
      if (index !== undefined) open(source.data.key[index]);
    },
    sortGrid: sortGrid,
  };
  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-sort]");
    if (button) sortGrid(button.dataset.run, button.dataset.sort, button);
    const link = event.target.closest("[data-episode]");
    if (link && link.tagName === "A") { event.preventDefault(); open(link.dataset.episode); }
  });
  document.getElementById("viewer-close").addEventListener("click", () => { document.getElementById("viewer").hidden = true; });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") document.getElementById("viewer").hidden = true; });
})();
