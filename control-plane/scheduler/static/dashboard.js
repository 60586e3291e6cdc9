// The Corral dashboard: plain JavaScript, no build step, no dependencies.
//
// Everything shown comes from the scheduler's JSON API. The page reads the event
// stream (GET /events) and reloads what it shows when an event concerns it (at most
// once a second); while the stream is open it polls only every SAFETY_POLL_MS, and
// while it is down every POLL_MS (each poll starts when the previous one has
// finished). Routes live in the URL
// hash: "#/" (with filters, "#/?status=failed&node_id=n1&submitted_by=alice"), "#/jobs/job-12",
// "#/nodes/node-1" and "#/schedules/nightly-etl" (names URL-encoded); the pages of
// users, teams, personal tokens and the audit log are "#/users", "#/teams", "#/tokens"
// and "#/audit" (with filters), usage is "#/usage" (with its range and filters). Who the token stands for (GET /whoami) decides which
// of those the header offers; the API decides what each call may do, and a refusal is
// shown as its message.
// The charts are SVG drawn here from GET /stats/history and GET /usage (no chart library).
// Data (names are user input) is written with textContent only, never as HTML.
"use strict";

(function () {
  const POLL_MS = 1500;           // while the event stream is down
  const SAFETY_POLL_MS = 5000;    // while it is open: what no event announces (the charts' samples)
  const REFRESH_MIN_MS = 1000;    // the most often events reload the page
  const RETRY_MS = 3000;          // after a failed poll
  const STREAM_RETRY_MAX_MS = 30000;
  const TOKEN_KEY = "corral.token";  // a personal token or the operator token
  const WHO_MAX_AGE_MS = 30000;   // GET /whoami again after this (a membership may change)
  const REFUSED_AGAIN_MS = 60000; // a part the token may not read is asked for again after this
  const STATUSES = ["pending", "running", "done", "failed", "cancelled"];
  const JOB_TYPES = ["run", "service"];
  // The scheduler's pending reasons (GET /jobs?pending_reason=...).
  const REASON_CODES = ["placed", "no_healthy_node", "constraints_unmet", "no_capacity", "pinned_node_unavailable",
                        "scheduled", "backoff", "dependency", "array_throttle", "concurrency_limit", "draining",
                        "node_refusing_work"];
  const PAGE = 100;               // newest jobs shown on the overview
  // The API lives beside /ui (the directory it is in), also behind a path prefix.
  const API_ROOT = new URL(".", window.location.href);

  const $ = (id) => document.getElementById(id);

  class AuthNeeded extends Error {}

  // A refusal or failure the API answered: its one-line message and HTTP status.
  class ApiError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  // ---- the API ---------------------------------------------------------------

  let waitingForToken = false;

  async function api(path, method = "GET", body = undefined) {
    const headers = authHeaders("application/json");
    const token = headers.Authorization;
    // The server takes state-changing requests only with this header (no other site
    // can send it), a body-less cancel or retry too.
    if (method !== "GET") headers["Content-Type"] = "application/json";
    const init = {method, headers, cache: "no-store"};
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await fetch(new URL(path, API_ROOT), init);
    if (response.status === 401) {
      if (token) sessionStorage.removeItem(TOKEN_KEY);
      askForToken(token ? "That token was refused." : "");
      throw new AuthNeeded("a token is needed");
    }
    const text = await response.text();
    let answer = null;
    try {
      answer = text ? JSON.parse(text) : null;
    } catch (err) {
      answer = null;
    }
    if (!response.ok) {
      throw new ApiError((answer && answer.error) || `${method} ${path}: ${response.status} ${response.statusText}`,
                         response.status);
    }
    return answer;
  }

  function authHeaders(accept) {
    const headers = {Accept: accept};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;  // a header, never the URL
    return headers;
  }

  function askForToken(message) {
    waitingForToken = true;
    $("token-error").textContent = message;
    $("token-form").hidden = false;
    $("forget-token").hidden = true;
    forgetWho();
    setLive(false, "waiting for your token");
    $("token-input").focus();
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    $("token-form").hidden = true;
    waitingForToken = false;
    poll();
  });

  $("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    poll();
  });

  // ---- who is signed in --------------------------------------------------------------

  // GET /whoami for the token in use: read again after WHO_MAX_AGE_MS, when the token
  // changes, and after a change made here (a membership or a role may be the caller's).
  const session = {token: null, who: null, at: 0};

  async function loadWho() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (session.who && session.token === token && Date.now() - session.at < WHO_MAX_AGE_MS) return session.who;
    const who = await api("whoami");
    Object.assign(session, {token, who, at: Date.now()});
    drawWho(who);
    return who;
  }

  function forgetWho() {
    Object.assign(session, {who: null, at: 0});
    $("whoami").hidden = true;
    $("nav").hidden = true;
  }

  // What a user may see and change, as the API decides it (docs/security.md): cluster
  // admins everything, cluster readers see everything, a team's admins change its members
  // and read its audit entries. A read-only token changes nothing.
  const seesEveryTeam = (who) => who.cluster_role === "admin" || who.cluster_role === "reader";
  const isClusterAdmin = (who) => who.cluster_role === "admin" && !who.read_only;
  const leadsTeams = (who) => who.teams.some((t) => t.role === "admin");
  const administers = (who, team) => !who.read_only && (who.cluster_role === "admin"
    || who.teams.some((t) => t.team === team && t.role === "admin"));

  // "ml (admin)" or "ml".
  function teamRoleText(membership) {
    return membership.role === "admin" ? `${membership.team} (admin)` : membership.team;
  }

  // The header: who the token stands for, and the pages it may use.
  function drawWho(who) {
    const user = el("strong", who.user);
    user.id = "whoami-user";
    const role = el("span", who.cluster_role ? `cluster ${who.cluster_role}` : "no cluster role");
    role.id = "whoami-role";
    const teams = el("span", who.teams.length ? "teams: " + who.teams.map(teamRoleText).join(", ") : "in no team");
    teams.id = "whoami-teams";
    const box = $("whoami");
    box.replaceChildren(user, " · ", role, " · ", teams);
    if (who.read_only) box.append(" · ", el("span", "read-only", "read-only"));
    box.title = who.token_id ? `signed in with personal token ${who.token_id}` : "signed in with a bootstrap token";
    box.hidden = false;
    $("nav").hidden = false;
    $("nav-users").hidden = !seesEveryTeam(who);
    $("nav-teams").hidden = $("nav-audit").hidden = !(seesEveryTeam(who) || leadsTeams(who));
  }

  // ---- small helpers -------------------------------------------------------------

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function link(href, text) {
    const a = el("a", text);
    a.href = href;
    return a;
  }

  function badge(status) {
    return el("span", status, "status " + status);
  }

  // A healthy node whose agent takes no new work (short of disk space) says so; the
  // agent's reason is the tooltip.
  function healthCell(node) {
    if (node.status !== "healthy" || !node.refusing_work) return badge(node.status);
    const cell = el("span", "healthy, no new work", "status refusing");
    cell.title = node.refusing_work;
    return cell;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cell === null || cell === undefined ? "—" : String(cell);
      tr.appendChild(td);
    }
    return tr;
  }

  // Each cell of a row gets its class, in order (for the style and for tests to find it).
  function cellClasses(tr, names) {
    names.forEach((name, i) => {
      tr.cells[i].className = name;
    });
  }

  function ago(iso) {
    if (!iso) return "—";
    const secs = Math.round((Date.now() - Date.parse(iso)) / 1000);
    const abs = Math.abs(secs);
    const text = abs < 60 ? `${abs}s` : abs < 3600 ? `${Math.floor(abs / 60)}m`
      : abs < 86400 ? `${Math.floor(abs / 3600)}h` : `${Math.floor(abs / 86400)}d`;
    return secs >= 0 ? `${text} ago` : `in ${text}`;
  }

  function timeCell(iso) {
    const span = el("span", ago(iso));
    if (iso) span.title = iso;
    return span;
  }

  // An instant as the API gives it (UTC), then how far off it is: "2026-12-24T01:30:00.000Z (in 3h)".
  function whenText(iso) {
    return iso ? `${iso} (${ago(iso)})` : null;
  }

  // ---- scheduling: reasons, constraints, resources -------------------------------

  function number(n) {
    return Number(n).toLocaleString("en-US");
  }

  const known = (value) => value !== null && value !== undefined;

  // As the scheduler words them in its messages: "zone = a", "gpu in [a100, h100]", "ssd exists".
  function constraintText(c) {
    if (!known(c.value)) return `${c.label} ${c.op}`;
    const value = Array.isArray(c.value) ? `[${c.value.join(", ")}]` : c.value;
    return `${c.label} ${c.op} ${value}`;
  }

  // A pending job's reason in the job list: the code (a link to the jobs that wait for the
  // same reason), the message under it and as its tooltip.
  function reasonCell(reason, filters) {
    if (!reason) return null;
    const cell = el("span", null, "reason");
    cell.title = reason.message;
    const code = link(overviewHash({...filters, pending_reason: reason.code}), reason.code);
    code.className = "reason-code";
    cell.append(code, el("span", reason.message, "reason-message"));
    return cell;
  }

  // "reserved 3,072 of 16,384 MB" and "reserved 100% of 400%", then what is used when the
  // agent has said. `each` follows every figure, `tail` the line.
  function resourceCell(node, part, each, tail) {
    const reserved = node.reserved ? node.reserved[part] : null;
    const allocatable = node.allocatable ? node.allocatable[part] : null;
    const used = node.used ? node.used[part] : null;
    const cell = el("span", null, "resource");
    const of = known(allocatable) ? ` of ${number(allocatable)}${each}` : " (allocatable unknown)";
    cell.append(el("span", `reserved ${number(reserved || 0)}${each}${of}${tail}`, "resource-reserved"));
    if (known(used)) cell.append(el("span", `used ${number(used)}${each}${tail}`, "resource-used"));
    return cell;
  }

  function labelsCell(labels) {
    const names = Object.keys(labels || {}).sort();
    if (!names.length) return null;
    const cell = el("span", null, "labels");
    cell.append(...names.map((name) => el("span", `${name}=${labels[name]}`, "label")));
    return cell;
  }

  function resourcesText(resources) {
    if (!resources) return null;
    const parts = [];
    if (known(resources.memory_mb)) parts.push(`${number(resources.memory_mb)} MB`);
    if (known(resources.cpu_percent)) parts.push(`${number(resources.cpu_percent)}% CPU`);
    return parts.join(", ") || null;
  }

  // ---- GPUs and other countable resources ---------------------------------------

  const heldGpus = (node) => (node.gpus || []).filter((gpu) => gpu.job_id).length;

  // A node's devices by model and memory, in the order listed: [[model, memory_mb, count]].
  function gpuModels(gpus) {
    const models = new Map();
    for (const gpu of gpus) {
      const key = JSON.stringify([gpu.model, gpu.memory_mb]);
      const seen = models.get(key);
      if (seen) seen[2] += 1;
      else models.set(key, [gpu.model, gpu.memory_mb, 1]);
    }
    return [...models.values()];
  }

  // The node list's GPU cell: "2 in use, 6 free", then "8 × NVIDIA A100-SXM4-80GB (81,920 MB)" a
  // line per model; each device and the job it is reserved for as the tooltip.
  function gpusCell(node) {
    const gpus = node.gpus || [];
    if (!gpus.length) return null;
    const held = heldGpus(node);
    const cell = el("span", null, "gpus-summary");
    cell.dataset.held = held;
    cell.dataset.count = gpus.length;
    cell.append(el("span", `${held} in use, ${gpus.length - held} free`, "gpu-count"),
                ...gpuModels(gpus).map(([model, memory, count]) => el(
                  "span", `${count} × ${model} (${number(memory)} MB)`, "gpu-model")));
    cell.title = gpus.map((gpu) => `${gpu.index} ${gpu.uuid}: ${gpu.job_id || "free"}`).join("\n");
    return cell;
  }

  // Each countable resource a node declares or its jobs reserve: [[name, declared, reserved]].
  function nodeResources(node) {
    const declared = node.resources || {};
    const reserved = node.resources_reserved || {};
    const names = [...new Set([...Object.keys(declared), ...Object.keys(reserved)])].sort();
    return names.map((name) => [name, declared[name] || 0, reserved[name] || 0]);
  }

  // "fpga: 1 of 2 reserved", a line per resource; null without any.
  function nodeResourcesCell(node) {
    const resources = nodeResources(node);
    if (!resources.length) return null;
    const cell = el("span", null, "countables");
    cell.append(...resources.map(([name, declared, reserved]) => {
      const line = el("span", `${name}: ${number(reserved)} of ${number(declared)} reserved`, "countable");
      line.dataset.resource = name;
      return line;
    }));
    return cell;
  }

  // What a job asks for: "2, model contains a100, at least 40,960 MB each"; null for none.
  function gpusAsked(job) {
    if (!job.gpus) return null;
    const parts = [String(job.gpus)];
    if (job.gpu_model) parts.push(`model contains ${job.gpu_model}`);
    if (known(job.gpu_memory_mb)) parts.push(`at least ${number(job.gpu_memory_mb)} MB each`);
    return parts.join(", ");
  }

  // "fpga: 1, licence: 2"; null for none.
  function countsText(counts) {
    const names = Object.keys(counts || {}).sort();
    return names.length ? names.map((name) => `${name}: ${number(counts[name])}`).join(", ") : null;
  }

  // The devices reserved for a job, a UUID a line; null while it holds none.
  function assignedCell(job) {
    if (!job.gpus_assigned || !job.gpus_assigned.length) return null;
    const cell = el("span", null, "gpus-assigned");
    cell.append(...job.gpus_assigned.map((uuid) => el("span", uuid, "gpu-uuid")));
    return cell;
  }

  // One detail of a pending reason, as text or a node (a job it waits for links to that job).
  function reasonDetail(name, value) {
    if (name === "job_id") return link("#/jobs/" + value, value);
    if (name === "until") return whenText(value);
    if (name === "constraint") return constraintText(value);
    if (name === "constraints") return value.map(constraintText).join("; ");
    if (Array.isArray(value)) return value.join(", ");
    return fieldText(value);
  }

  function definitions(list, pairs, idPrefix) {
    list.replaceChildren(...pairs.flatMap(([name, value]) => {
      const dd = el("dd");
      if (value instanceof Node) dd.appendChild(value);
      else dd.textContent = known(value) ? String(value) : "—";
      dd.id = idPrefix + name;
      return [el("dt", name), dd];
    }));
  }

  function setLive(ok, message) {
    const live = $("live");
    live.classList.toggle("down", !ok);
    const how = stream.open ? "events" : "polling";
    live.textContent = ok ? `live (${how}) · updated ${new Date().toLocaleTimeString()}` : message;
    $("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY) || waitingForToken;
  }

  // One page of the shell at a time; none while a new route's data is on its way.
  const PAGES = ["overview", "job-page", "node-page", "schedule-page", "users-page", "teams-page", "tokens-page",
                 "audit-page", "usage-page"];
  const NAV = {"overview": "nav-jobs", "users-page": "nav-users", "teams-page": "nav-teams",
               "tokens-page": "nav-tokens", "audit-page": "nav-audit", "usage-page": "nav-usage"};

  function showPage(id) {
    for (const page of PAGES) $(page).hidden = page !== id;
    for (const a of $("nav").querySelectorAll("a")) a.classList.toggle("active", a.id === NAV[id]);
  }

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
  }

  // Replace a select's options only when they change, so an open list is not reset.
  function setOptions(select, options, value) {
    const key = JSON.stringify(options);
    if (select.dataset.key !== key) {
      select.replaceChildren(...options.map(([optionValue, label]) => {
        const option = el("option", label);
        option.value = optionValue;
        return option;
      }));
      select.dataset.key = key;
    }
    select.value = value;
  }

  // ---- routes --------------------------------------------------------------------

  const JOB_FILTERS = ["status", "node_id", "job_type", "pending_reason", "team", "submitted_by"];
  const AUDIT_FILTERS = ["user", "team", "action", "before"];
  const USAGE_FILTERS = ["from", "to", "team", "user", "group_by"];

  function route() {
    const hash = window.location.hash.replace(/^#/, "") || "/";
    const admin = hash.match(/^\/(users|teams|tokens)$/);
    if (admin) return {page: admin[1]};
    const audit = hash.match(/^\/audit(?:\?(.*))?$/);
    if (audit) return {page: "audit", filters: queryFilters(audit[1] || "", AUDIT_FILTERS)};
    const usage = hash.match(/^\/usage(?:\?(.*))?$/);
    if (usage) return {page: "usage", filters: queryFilters(usage[1] || "", USAGE_FILTERS)};
    const job = hash.match(/^\/jobs\/(job-[0-9]+)$/);
    if (job) return {page: "job", jobId: job[1]};
    const schedule = hash.match(/^\/schedules\/([^/?]+)$/);
    if (schedule) return {page: "schedule", name: decoded(schedule[1])};
    const node = hash.match(/^\/nodes\/([^/?]+)$/);
    if (node) return {page: "node", nodeId: decoded(node[1])};
    const query = hash.includes("?") ? hash.slice(hash.indexOf("?") + 1) : "";
    return {page: "overview", filters: queryFilters(query, JOB_FILTERS)};
  }

  function queryFilters(query, names) {
    const params = new URLSearchParams(query);
    return Object.fromEntries(names.map((name) => [name, params.get(name) || ""]));
  }

  function decoded(part) {
    try {
      return decodeURIComponent(part);
    } catch (err) {
      return part;  // not valid percent-encoding: the API says whether such a schedule exists
    }
  }

  function scheduleHash(name) {
    return "#/schedules/" + encodeURIComponent(name);
  }

  function nodeHash(nodeId) {
    return "#/nodes/" + encodeURIComponent(nodeId);
  }

  // "#/" or "#/audit", with the filters that have a value.
  function pageHash(path, filters) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(filters)) if (value) params.set(name, value);
    const query = params.toString();
    return query ? `#${path}?${query}` : "#" + path;
  }

  function overviewHash(filters) {
    return pageHash("/", filters);
  }

  // ---- the overview: counts, nodes, schedules, jobs --------------------------------

  // Parts of a page the token may not read (a team member's: the cluster's counts, charts
  // and nodes) answer 403: the refusal stands in for the part, and it is asked for again
  // after REFUSED_AGAIN_MS, or at once with another token.
  const refusals = new Map();  // path -> {token, message, at}

  async function unlessRefused(path, load = () => api(path)) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const earlier = refusals.get(path);
    if (earlier && earlier.token === token && Date.now() - earlier.at < REFUSED_AGAIN_MS) {
      return {refused: earlier.message};
    }
    try {
      return await load();
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 403) throw err;
      refusals.set(path, {token, message: err.message, at: Date.now()});
      return {refused: err.message};
    }
  }

  async function loadOverview(filters, who) {
    // Newest first. `order=desc` also keeps node + pending filters off the agents' poll,
    // which answers only as many jobs as the node has free slots.
    const params = new URLSearchParams({order: "desc", limit: String(PAGE)});
    for (const [name, value] of Object.entries(filters)) if (value) params.set(name, value);
    const [stats, nodes, schedules, jobs, history, teams] = await Promise.all([
      unlessRefused("stats"), unlessRefused("nodes"), unlessRefused("schedules"), api("jobs?" + params),
      unlessRefused("stats/history", () => loadHistory("nodes=none")),
      seesEveryTeam(who) ? api("teams") : who.teams.map((t) => ({name: t.team}))]);
    return {stats, nodes, schedules, jobs, history, teams: teams.map((t) => t.name)};
  }

  // The overview's parts that a token may be refused, and the section each fills.
  const OVERVIEW_PARTS = [["stats", "counts", "counts"], ["history", "activity", "charts"],
                          ["nodes", "nodes-section", "nodes"], ["schedules", "schedules-section", "schedules"]];

  function drawOverview(filters, data, who) {
    showPage("overview");
    const refused = OVERVIEW_PARTS.filter(([part]) => data[part].refused);
    for (const [part, section] of OVERVIEW_PARTS) $(section).hidden = Boolean(data[part].refused);
    const messages = [...new Set(refused.map(([part]) => data[part].refused))];
    $("overview-refused").hidden = !refused.length;
    $("overview-refused").textContent = refused.length
      ? `Not shown (${refused.map((p) => p[2]).join(", ")}): ${messages.join("; ")}` : "";

    const nodes = data.nodes.refused ? [] : data.nodes;
    if (!data.history.refused) {
      drawActivity(data.history);
      drawNodeUsage(nodes);
    }
    if (!data.stats.refused) drawCounts(filters, data.stats);
    if (!data.nodes.refused) drawNodes(nodes);
    if (!data.schedules.refused) drawSchedules(data.schedules);
    drawJobFilters(filters, nodes, data.teams, who);
    drawJobs(filters, data.jobs);
  }

  function drawCounts(filters, stats) {
    const total = STATUSES.reduce((sum, status) => sum + (stats.jobs[status] || 0), 0);
    $("counts").replaceChildren(...[["", "all", total], ...STATUSES.map((s) => [s, s, stats.jobs[s] || 0])]
      .map(([status, label, count]) => {
        const tile = link(overviewHash({...filters, status}), "");
        tile.id = "count-" + label;
        tile.className = filters.status === status ? "active" : "";
        tile.append(el("span", count, "count"), el("span", label, status ? "status " + status : ""));
        return tile;
      }));
  }

  function drawNodes(nodes) {
    $("nodes").tBodies[0].replaceChildren(...nodes.map((node) => {
      const tr = row([link(nodeHash(node.node_id), node.node_id), healthCell(node),
                      node.drained ? badge("drained") : "no", node.pool, labelsCell(node.labels),
                      `${node.slots_used} / ${node.capacity}`, resourceCell(node, "memory_mb", "", " MB"),
                      resourceCell(node, "cpu_percent", "%", ""), gpusCell(node), nodeResourcesCell(node),
                      timeCell(node.last_heartbeat), node.address]);
      tr.cells[3].className = "pool";
      tr.cells[6].className = "memory";
      tr.cells[7].className = "cpu";
      tr.cells[8].className = "gpus";
      tr.cells[9].className = "countables-cell";
      tr.dataset.nodeId = node.node_id;
      return tr;
    }));
    $("nodes-empty").hidden = nodes.length > 0;
  }

  // A value in the job list that is also a filter: a link to the jobs that share it.
  function filterLink(filters, name, value) {
    return value ? link(overviewHash({...filters, [name]: value}), value) : null;
  }

  function drawJobFilters(filters, nodes, teams, who) {
    setOptions($("filter-status"), [["", "any"], ...STATUSES.map((s) => [s, s])], filters.status);
    const nodeIds = nodes.map((node) => node.node_id);
    if (filters.node_id && !nodeIds.includes(filters.node_id)) nodeIds.push(filters.node_id);
    setOptions($("filter-node"), [["", "any"], ...nodeIds.map((id) => [id, id])], filters.node_id);
    setOptions($("filter-type"), [["", "any"], ...JOB_TYPES.map((t) => [t, t])], filters.job_type);
    setOptions($("filter-reason"), [["", "any"], ...REASON_CODES.map((c) => [c, c])], filters.pending_reason);
    if (filters.team && !teams.includes(filters.team)) teams = [...teams, filters.team];
    setOptions($("filter-team"), [["", "any"], ...teams.map((t) => [t, t])], filters.team);
    const submitter = $("filter-submitter");
    if (document.activeElement !== submitter) submitter.value = filters.submitted_by;  // not while typed in
    $("filter-mine").checked = Boolean(filters.submitted_by) && filters.submitted_by === who.user;
  }

  function drawJobs(filters, jobs) {
    $("jobs").tBodies[0].replaceChildren(...jobs.map((job) => {
      const tr = row([link("#/jobs/" + job.job_id, job.job_id), badge(job.status), reasonCell(job.pending_reason, filters),
                      job.job_type, filterLink(filters, "team", job.team),
                      filterLink(filters, "submitted_by", job.submitted_by), job.node_id,
                      job.command || job.deploy_url, job.attempt, job.exit_code, timeCell(job.created_at)]);
      tr.dataset.jobId = job.job_id;
      tr.dataset.status = job.status;
      tr.dataset.team = job.team;
      tr.dataset.submittedBy = job.submitted_by;
      if (job.pending_reason) tr.dataset.reason = job.pending_reason.code;
      tr.cells[2].className = "waiting";
      tr.cells[4].className = "team";
      tr.cells[5].className = "submitted-by";
      tr.cells[7].className = "command";
      tr.cells[7].title = job.command || job.deploy_url || "";
      return tr;
    }));
    $("jobs-empty").hidden = jobs.length > 0;
    $("jobs-note").textContent = jobs.length === PAGE ? `the newest ${PAGE} shown` : "";
  }

  // ---- charts: SVG drawn here from GET /stats/history ------------------------------

  const SVG_NS = document.querySelector("svg.chart").namespaceURI;  // the page's own charts say it
  const MINUTE_MS = 60 * 1000;
  const HOUR_MS = 60 * MINUTE_MS;
  const CHART = {width: 560, height: 170, left: 48, right: 10, top: 8, bottom: 22};
  const FINALS = ["done", "failed", "cancelled"];

  // The samples read so far and what they were read with: each poll asks only for the
  // samples taken since the newest one it has (`since`), and forgets those older than
  // the scheduler keeps. Another query (another page) starts again.
  const history = {query: null, samples: [], intervalSecs: 10, retentionSecs: 7200};

  const sampleMs = (sample) => Date.parse(sample.at);

  async function loadHistory(query) {
    if (history.query !== query) Object.assign(history, {query, samples: []});
    const newest = history.samples[history.samples.length - 1];
    const since = newest ? `&since=${sampleMs(newest) / 1000}` : "";
    const answer = await api(`stats/history?${query}${since}`);
    if (history.query !== query) return history;  // another page asked meanwhile; its poll is stale
    const seen = new Set(history.samples.map((s) => s.at));
    const samples = history.samples.concat(answer.samples.filter((s) => !seen.has(s.at)));
    const last = samples.length ? sampleMs(samples[samples.length - 1]) : 0;
    Object.assign(history, {
      samples: samples.filter((s) => sampleMs(s) >= last - answer.retention_secs * 1000),
      intervalSecs: answer.interval_secs, retentionSecs: answer.retention_secs,
    });
    return history;
  }

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // A round step for about `count` ticks from 0 to `max`: 1, 2 or 5 times a power of ten.
  function niceStep(max, count) {
    const raw = max / count;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= raw * 0.999);
  }

  function clockText(ms) {
    return new Date(ms).toLocaleTimeString("en-GB", {hour: "2-digit", minute: "2-digit"});
  }

  // A value on an axis or in a legend: seconds as ms or s, hours as h, counts and resources as numbers.
  function valueText(value, unit) {
    if (!known(value)) return "—";
    if (unit === "secs") return value < 1 ? `${number(Math.round(value * 1000))} ms` : `${number(+value.toFixed(2))} s`;
    if (unit === "h") return `${number(+Number(value).toPrecision(3))} h`;
    return number(+Number(value).toFixed(2)) + (unit === "%" ? "%" : "");
  }

  // Axes and grid for times `from`..`to` (ms) and values 0..`max` (rounded up); the
  // functions that place a time and a value. `xTicks(from, to)` gives the time axis'
  // labels as [ms, text] (default: the clock, for a span of hours).
  function frame(from, to, max, unit, xTicks = clockTicks) {
    const {width, height, left, right, top, bottom} = CHART;
    const fractional = unit === "secs" || unit === "h";
    const fine = niceStep(max > 0 ? max : (fractional ? 0.01 : 1), 4);
    const step = fractional ? fine : Math.max(1, fine);  // no half a job, slot or MB
    const ticks = Math.max(1, Math.ceil(max / step - 1e-9));
    const yMax = ticks * step;
    const x = (t) => left + (t - from) / Math.max(1, to - from) * (width - left - right);
    const y = (v) => top + (1 - v / yMax) * (height - top - bottom);
    const parts = [];
    for (let i = 0; i <= ticks; i++) {
      parts.push(svgEl("line", {x1: left, x2: width - right, y1: y(i * step), y2: y(i * step), class: "grid"}));
      parts.push(svgEl("text", {x: left - 5, y: y(i * step) + 4, class: "tick y"}, valueText(i * step, unit)));
    }
    for (const [t, text] of xTicks(from, to)) {
      parts.push(svgEl("text", {x: x(t), y: height - 6, class: "tick x"}, text));
    }
    return {x, y, parts};
  }

  function clockTicks(from, to) {
    const span = to - from;
    const every = span <= 15 * MINUTE_MS ? 2 * MINUTE_MS : span <= HOUR_MS ? 10 * MINUTE_MS
      : span <= 3 * HOUR_MS ? 30 * MINUTE_MS : 2 * HOUR_MS;
    const ticks = [];
    for (let t = Math.ceil(from / every) * every; t <= to; t += every) ticks.push([t, clockText(t)]);
    return ticks;
  }

  // The time span a chart shows: `span` ms up to the newest sample (the scheduler's clock,
  // not this browser's), or up to now when there is none.
  function timeSpan(samples, span) {
    const to = samples.length ? sampleMs(samples[samples.length - 1]) : Date.now();
    return {from: to - span, to};
  }

  // Lines over time. Each series: {name, cls, points: [[ms, value]]} (value null: none);
  // a line breaks where samples are further apart than `gapMs` (nobody sampled), and a
  // point on its own shows as a dot.
  function drawLines(svg, {from, to, gapMs, unit, series, floor = 0, xTicks = clockTicks}) {
    const values = series.flatMap((s) => s.points.filter((p) => p[0] >= from).map((p) => p[1])).filter(known);
    const f = frame(from, to, Math.max(floor, ...values), unit, xTicks);
    const paths = series.map((s) => {
      let d = "";
      let previous = null;
      let drawn = 0;
      for (const [t, value] of s.points) {
        if (t < from || !known(value)) {
          previous = null;
          continue;
        }
        const at = `${f.x(t).toFixed(1)},${f.y(value).toFixed(1)}`;
        d += previous === null || t - previous > gapMs ? `M${at}l0,0` : `L${at}`;
        previous = t;
        drawn++;
      }
      const path = svgEl("path", {d: d || "M0,0", class: "line " + s.cls, "data-series": s.name,
                                  "data-points": drawn});
      path.append(svgEl("title", {}, s.name));
      return path;
    });
    svg.setAttribute("viewBox", `0 0 ${CHART.width} ${CHART.height}`);
    svg.replaceChildren(...f.parts, ...paths);
  }

  // Under a chart: each series' name and latest value.
  function drawLegend(box, items) {
    box.replaceChildren(...items.map(([name, cls, value]) => {
      const item = el("span", null, "legend-item");
      item.dataset.series = name;
      item.append(el("span", null, "swatch " + cls), el("span", name, "legend-name"),
                  el("span", value, "legend-value"));
      return item;
    }));
  }

  const latest = (points) => {
    const last = points[points.length - 1];
    return last ? last[1] : null;
  };

  // Jobs finished per minute, by status: each sample's counts go to the minute it was
  // taken in (a sample covers the interval before it), stacked done, failed, cancelled.
  function drawFinished(samples) {
    const {from, to} = timeSpan(samples, HOUR_MS);
    const first = Math.floor(from / MINUTE_MS) + 1;
    const minutes = new Map();
    for (const sample of samples) {
      const minute = Math.floor(sampleMs(sample) / MINUTE_MS);
      if (minute < first) continue;
      const counts = minutes.get(minute) || {done: 0, failed: 0, cancelled: 0};
      for (const status of FINALS) counts[status] += sample.finished[status];
      minutes.set(minute, counts);
    }
    const totals = [...minutes.values()].map((c) => c.done + c.failed + c.cancelled);
    const f = frame(from, to, Math.max(1, ...totals), "count");
    const width = Math.max(1, f.x(MINUTE_MS) - f.x(0) - 1);
    const bars = [];
    for (const [minute, counts] of minutes) {
      let base = 0;
      const start = minute * MINUTE_MS;
      for (const status of FINALS) {
        if (!counts[status]) continue;
        const rect = svgEl("rect", {x: f.x(start).toFixed(1), width: width.toFixed(1),
                                    y: f.y(base + counts[status]).toFixed(1),
                                    height: (f.y(base) - f.y(base + counts[status])).toFixed(1),
                                    class: "bar " + status, "data-status": status, "data-count": counts[status],
                                    "data-minute": new Date(start).toISOString()});
        rect.append(svgEl("title", {}, `${clockText(start)}: ${counts[status]} ${status}`));
        bars.push(rect);
        base += counts[status];
      }
    }
    const svg = $("chart-finished");
    svg.setAttribute("viewBox", `0 0 ${CHART.width} ${CHART.height}`);
    svg.replaceChildren(...f.parts, ...bars);
    const hour = FINALS.map((status) => [status, status, String([...minutes.values()]
      .reduce((sum, c) => sum + c[status], 0))]);
    drawLegend($("legend-finished"), hour.map(([name, cls, total]) => [name, cls, `${total} in the hour`]));
  }

  function drawActivity(h) {
    const samples = h.samples;
    const gapMs = 2.5 * h.intervalSecs * 1000;
    const {from, to} = timeSpan(samples, HOUR_MS);
    const points = (value) => samples.map((s) => [sampleMs(s), value(s)]);
    $("activity-note").textContent = samples.length
      ? `(a sample every ${number(h.intervalSecs)} s; the newest ${ago(samples[samples.length - 1].at)})`
      : "(no samples yet)";
    drawFinished(samples);

    const queue = [{name: "pending", cls: "pending", points: points((s) => s.pending)},
                   {name: "running", cls: "running", points: points((s) => s.running)}];
    drawLines($("chart-queue"), {from, to, gapMs, unit: "count", series: queue, floor: 1});
    drawLegend($("legend-queue"), queue.map((s) => [s.name, s.cls, valueText(latest(s.points), "count")]));

    const latency = [{name: "p50", cls: "p50", points: points((s) => s.dispatch_latency.p50_secs)},
                     {name: "p95", cls: "p95", points: points((s) => s.dispatch_latency.p95_secs)}];
    drawLines($("chart-latency"), {from, to, gapMs, unit: "secs", series: latency});
    const started = samples.filter((s) => sampleMs(s) >= from).reduce((sum, s) => sum + s.started, 0);
    drawLegend($("legend-latency"), [
      ...latency.map((s) => [s.name, s.cls, valueText(latest(s.points.filter((p) => known(p[1]))), "secs")]),
      ["started", "started", `${number(started)} in the hour`]]);
  }

  // ---- node usage: bars of now, lines over time -------------------------------------

  const RESOURCES = [
    // name, label, unit, what is allocatable, reserved, used (of a node as GET /nodes or a sample shows it)
    ["slots", "slots", "", (n) => n.capacity, (n) => n.slots_used, () => null],
    ["memory", "memory", " MB", (n) => n.allocatable.memory_mb, (n) => n.reserved.memory_mb,
     (n) => n.used ? n.used.memory_mb : null],
    ["cpu", "CPU", "%", (n) => n.allocatable.cpu_percent, (n) => n.reserved.cpu_percent,
     (n) => n.used ? n.used.cpu_percent : null],
  ];
  // A node with GPUs has a bar of them too (now only: the samples do not count them).
  const GPU_BAR = ["gpus", "GPUs", "", (n) => n.gpus.length, heldGpus, () => null];
  const USAGE_ROW = 18;
  const MAX_NODE_BARS = 40;       // on the overview; every node has its page

  // A node's slots, memory, CPU (and GPUs) as bars: reserved (the bar) and used (a line) as
  // a share of what is allocatable, with the figures beside them.
  function usageBars(node) {
    const width = 480;
    const label = 56;
    const track = 200;
    const bars = node.gpus && node.gpus.length ? [...RESOURCES, GPU_BAR] : RESOURCES;
    const svg = svgEl("svg", {viewBox: `0 0 ${width} ${bars.length * USAGE_ROW}`, class: "usage",
                              role: "img", "aria-label": `usage of ${node.node_id}`});
    bars.forEach(([name, text, unit, allocatable, reserved, used], i) => {
      const of = allocatable(node);
      const held = reserved(node) || 0;
      const using = used(node);
      const share = (v) => (known(of) && of > 0 ? Math.min(1, v / of) : 0) * track;
      const top = i * USAGE_ROW;
      const group = svgEl("g", {class: "resource " + name, "data-resource": name, "data-reserved": held,
                                "data-used": known(using) ? using : "", "data-allocatable": known(of) ? of : ""});
      group.append(svgEl("text", {x: 0, y: top + 13, class: "usage-label"}, text),
                   svgEl("rect", {x: label, y: top + 3, width: track, height: USAGE_ROW - 6, class: "track"}),
                   svgEl("rect", {x: label, y: top + 3, width: share(held).toFixed(1), height: USAGE_ROW - 6,
                                  class: "reserved"}));
      if (known(using)) {
        const x = (label + share(using)).toFixed(1);
        group.append(svgEl("line", {x1: x, x2: x, y1: top + 1, y2: top + USAGE_ROW - 1, class: "used"}));
      }
      const figures = `${number(held)}${unit} of ${known(of) ? number(of) + unit : "?"}`
        + (known(using) ? ` · used ${number(using)}${unit}` : "");
      group.append(svgEl("text", {x: label + track + 8, y: top + 13, class: "usage-figures"}, figures));
      svg.append(group);
    });
    return svg;
  }

  function drawNodeUsage(nodes) {
    const shown = nodes.slice(0, MAX_NODE_BARS);
    $("chart-nodes").replaceChildren(...shown.map((node) => {
      const item = el("div", null, "node-usage-item");
      item.dataset.nodeId = node.node_id;
      item.append(link(nodeHash(node.node_id), node.node_id), usageBars(node));
      return item;
    }));
    $("chart-nodes-more").hidden = nodes.length <= shown.length;
    $("chart-nodes-more").textContent = `and ${nodes.length - shown.length} more nodes (each has its page)`;
    if (!nodes.length) $("chart-nodes").replaceChildren(el("p", "No nodes have registered.", "muted"));
  }

  // ---- the node page ----------------------------------------------------------------

  async function loadNode(nodeId) {
    const running = new URLSearchParams({node_id: nodeId, status: "running", order: "desc", limit: String(PAGE)});
    const [nodes, jobs, h] = await Promise.all([
      api("nodes"), api("jobs?" + running), loadHistory("node_id=" + encodeURIComponent(nodeId))]);
    const node = nodes.find((n) => n.node_id === nodeId);
    if (!node) throw new Error(`${nodeId} is not in the scheduler's node list`);
    return {node, jobs, history: h};
  }

  function drawNode({node, jobs, history: h}) {
    showPage("node-page");
    $("node-title").textContent = node.node_id;
    const health = node.drained ? "drained" : node.status;
    $("node-status").textContent = health;
    $("node-status").className = "status " + health;
    document.title = `${node.node_id} (${health}) · Corral`;
    $("node-jobs-link").href = overviewHash({node_id: node.node_id});
    definitions($("node-fields"), [
      ["address", node.address], ["kind", node.kind], ["pool", node.pool], ["labels", labelsCell(node.labels)],
      ["slots", `${node.slots_used} used of ${node.capacity} (advertises ${node.slots})`],
      ["max_memory_mb", node.max_memory_mb], ["max_cpu_percent", node.max_cpu_percent],
      ["gpus", node.gpus && node.gpus.length ? `${heldGpus(node)} reserved of ${node.gpus.length}` : "none"],
      ["resources", nodeResourcesCell(node) || "none"],
      ["last_heartbeat", whenText(node.last_heartbeat)], ["synced_at", whenText(node.synced_at)],
    ], "node-field-");
    $("node-usage-now").replaceChildren(usageBars(node));
    drawNodeDevices(node);

    const samples = h.samples;
    const gapMs = 2.5 * h.intervalSecs * 1000;
    // All the samples kept, at least ten minutes' worth of axis (a new cluster has few).
    const kept = samples.length ? sampleMs(samples[samples.length - 1]) - sampleMs(samples[0]) : 0;
    const {from, to} = timeSpan(samples, Math.min(h.retentionSecs * 1000, Math.max(10 * MINUTE_MS, kept)));
    $("node-history-note").textContent = samples.length
      ? `(a sample every ${number(h.intervalSecs)} s, kept ${number(h.retentionSecs / 60)} min)` : "(no samples yet)";
    for (const [name, , unit, allocatable, reserved, used] of RESOURCES) {
      const points = (value) => samples.map((s) => {
        const at = s.nodes.find((n) => n.node_id === node.node_id);
        return [sampleMs(s), at ? value(at) : null];
      });
      const series = [{name: "allocatable", cls: "allocatable", points: points(allocatable)},
                      {name: name === "slots" ? "used" : "reserved", cls: "reserved", points: points(reserved)}];
      if (name !== "slots") series.push({name: "used", cls: "used", points: points(used)});
      drawLines($("chart-node-" + name), {from, to, gapMs, unit: unit === "%" ? "%" : "count", series, floor: 1});
      drawLegend($("legend-node-" + name), series.map((s) => [s.name, s.cls, valueText(latest(s.points),
                                                                                         "count") + unit]));
    }

    $("node-jobs").tBodies[0].replaceChildren(...jobs.map((job) => {
      const tr = row([link("#/jobs/" + job.job_id, job.job_id), job.job_type, job.command || job.deploy_url,
                      job.attempt, resourcesText(job.reserved), assignedCell(job), timeCell(job.running_at)]);
      tr.dataset.jobId = job.job_id;
      tr.cells[2].className = "command";
      tr.cells[5].className = "gpus";
      return tr;
    }));
    $("node-jobs-empty").hidden = jobs.length > 0;
  }

  // Each GPU of a node with the job it is reserved for (a link) or "free"; each countable
  // resource declared, reserved and free.
  function drawNodeDevices(node) {
    const gpus = node.gpus || [];
    $("node-gpus").tBodies[0].replaceChildren(...gpus.map((gpu) => {
      const holder = gpu.job_id ? link("#/jobs/" + gpu.job_id, gpu.job_id) : el("span", "free", "free");
      const tr = row([gpu.index, gpu.model, `${number(gpu.memory_mb)} MB`, gpu.uuid, holder]);
      cellClasses(tr, ["index", "model", "memory", "uuid", "holder"]);
      tr.dataset.uuid = gpu.uuid;
      tr.dataset.index = gpu.index;
      if (gpu.job_id) tr.dataset.jobId = gpu.job_id;
      return tr;
    }));
    $("node-gpus").hidden = gpus.length === 0;
    $("node-gpus-empty").hidden = gpus.length > 0;
    const resources = nodeResources(node);
    $("node-resources").tBodies[0].replaceChildren(...resources.map(([name, declared, reserved]) => {
      const tr = row([name, number(declared), number(reserved), number(Math.max(0, declared - reserved))]);
      cellClasses(tr, ["name", "declared", "reserved", "free"]);
      tr.dataset.resource = name;
      return tr;
    }));
    $("node-resources").hidden = resources.length === 0;
    $("node-resources-empty").hidden = resources.length > 0;
  }

  // ---- schedules ------------------------------------------------------------------

  // "30 2 * * * (Europe/Berlin)" or "every 60 s".
  function scheduleWhen(schedule) {
    return schedule.cron ? `${schedule.cron} (${schedule.time_zone})` : `every ${number(schedule.interval_secs)} s`;
  }

  // A run's job as a link: its status as a badge, or its id when the job is gone (retention).
  function runJobLink(run) {
    const a = link("#/jobs/" + run.job_id, run.status ? null : run.job_id);
    if (run.status) a.append(badge(run.status));
    a.className = "run-job";
    return a;
  }

  // Relative, with the UTC instant as its tooltip; under it the same time in the schedule's zone.
  function nextRunCell(schedule) {
    if (!schedule.enabled || !schedule.next_run_at) return null;
    const cell = el("span");
    cell.append(timeCell(schedule.next_run_at), el("span", schedule.next_run_local, "local-time"));
    return cell;
  }

  // The latest slot, then the job's status (a link to the job) or why the slot made none.
  function lastRunCell(run) {
    if (!run) return null;
    const cell = el("span");
    cell.append(timeCell(run.slot), " ", run.job_id ? runJobLink(run) : el("span", run.skipped, "skipped"));
    return cell;
  }

  function drawSchedules(schedules) {
    $("schedules").tBodies[0].replaceChildren(...schedules.map((schedule) => {
      const tr = row([link(scheduleHash(schedule.name), schedule.name), scheduleWhen(schedule),
                      schedule.enabled ? "yes" : "no", nextRunCell(schedule), lastRunCell(schedule.last_run),
                      schedule.overlap]);
      cellClasses(tr, ["name", "when", "enabled", "next-run", "last-run", "overlap"]);
      tr.dataset.schedule = schedule.name;
      return tr;
    }));
    $("schedules-empty").hidden = schedules.length > 0;
  }

  async function loadSchedule(name) {
    const path = "schedules/" + encodeURIComponent(name);
    const [schedule, runs] = await Promise.all([api(path), api(path + "/runs?limit=100")]);
    return {schedule, runs};
  }

  function drawSchedule({schedule, runs}) {
    showPage("schedule-page");
    const state = schedule.enabled ? "enabled" : "disabled";
    $("schedule-title").textContent = schedule.name;
    $("schedule-state").textContent = state;
    $("schedule-state").className = "status " + state;
    document.title = `${schedule.name} (${state}) · Corral`;

    const timing = schedule.cron ? [["cron", schedule.cron]]
      : [["interval_secs", schedule.interval_secs], ["start_at", schedule.start_at]];
    definitions($("schedule-fields"), [
      ...timing, ["time_zone", schedule.time_zone], ["overlap", schedule.overlap], ["catch_up", schedule.catch_up],
      ["next_run_at", whenText(schedule.next_run_at)], ["next_run_local", schedule.next_run_local],
      ["created_at", schedule.created_at], ["updated_at", schedule.updated_at],
      ["job", JSON.stringify(schedule.job, null, 2)],
    ], "schedule-field-");

    $("schedule-runs").tBodies[0].replaceChildren(...runs.map((run) => {
      const tr = row([whenText(run.slot), run.job_id ? link("#/jobs/" + run.job_id, run.job_id) : null,
                      run.status ? badge(run.status) : null, run.skipped]);
      tr.dataset.slot = run.slot;
      if (run.job_id) tr.dataset.jobId = run.job_id;
      tr.cells[3].className = "skipped";
      return tr;
    }));
    $("schedule-runs-empty").hidden = runs.length > 0;
  }

  function setFilter(name, value) {
    const filters = route().filters || {};
    window.location.hash = overviewHash({...filters, [name]: value});
  }

  for (const [id, name] of [["filter-status", "status"], ["filter-node", "node_id"], ["filter-type", "job_type"],
                            ["filter-reason", "pending_reason"], ["filter-team", "team"]]) {
    $(id).addEventListener("change", (event) => setFilter(name, event.target.value));
  }
  $("filter-submitter").addEventListener("change", (event) => setFilter("submitted_by", event.target.value.trim()));
  $("filter-mine").addEventListener("change", (event) => {
    setFilter("submitted_by", event.target.checked && session.who ? session.who.user : "");
  });

  // ---- the job page ----------------------------------------------------------------

  const JOB_FIELDS = [
    "job_id", "name", "status", "team", "submitted_by", "job_type", "node_id", "instance_id", "command", "deploy_url",
    "deploy_sha256", "port", "health_path", "env_vars", "attempt", "retry_count", "max_retries", "next_attempt_at",
    "on_node_lost", "node_losses", "exit_code", "memory_mb", "cpu_percent", "gpus", "gpu_model", "gpu_memory_mb",
    "resources", "gpus_assigned", "limits_enforced", "limits", "oom_killed",
    "peak_memory_bytes", "cpu_seconds", "ended_by", "timeout_secs", "deadline", "signal_before_end", "kill_signal",
    "kill_grace_secs", "preemptible", "preemptions", "created_at", "placed_at", "running_at", "finished_at",
  ];

  async function loadJob(jobId) {
    const [job, events] = await Promise.all([api("jobs/" + jobId), api("jobs/" + jobId + "/events")]);
    return {job, events, why: await loadWhy(job)};
  }

  // The nodes closest to taking a pending job that has none yet. A job that stopped
  // waiting in between answers 409: that, like any other refusal, is shown in the
  // section and does not stop the page.
  async function loadWhy(job) {
    if (job.status !== "pending" || job.node_id || !job.pending_reason) return null;
    try {
      return await api("jobs/" + job.job_id + "/why");
    } catch (err) {
      if (err instanceof AuthNeeded) throw err;
      return {error: err.message};
    }
  }

  function drawWaiting(job, why) {
    const reason = job.pending_reason;
    $("job-waiting").hidden = !reason;
    if (!reason) return;
    $("job-reason-code").textContent = reason.code;
    $("job-reason-message").textContent = reason.message;
    const details = Object.entries(reason).filter(([name]) => name !== "code" && name !== "message");
    $("job-reason-details").hidden = details.length === 0;
    definitions($("job-reason-details"), details.map(([name, value]) => [name, reasonDetail(name, value)]),
                "reason-");

    $("job-why").hidden = !why;
    if (!why) return;
    const closest = why.closest_nodes || [];
    $("job-why-nodes").tBodies[0].replaceChildren(...closest.map((node) => {
      const lacks = el("ul", null, "lacks");
      lacks.append(...(node.lacks.length ? node.lacks : ["nothing now: it goes at the next placement"])
        .map((sentence) => el("li", sentence)));
      const tr = row([node.node_id, lacks]);
      tr.dataset.nodeId = node.node_id;
      return tr;
    }));
    $("job-why-nodes").hidden = closest.length === 0;
    const note = why.error ? `could not ask why: ${why.error}` : closest.length ? "" : "No node comes close.";
    $("job-why-note").hidden = !note;
    $("job-why-note").textContent = note;
  }

  function drawScheduling(job) {
    const constraints = job.constraints && job.constraints.length ? job.constraints.map(constraintText).join("; ")
      : null;
    definitions($("job-scheduling"), [
      ["priority", job.priority], ["pool", job.pool || "any"], ["constraints", constraints],
      ["run_at", whenText(job.run_at)],
      ["depends_on", dependsOn(job)],
      ["array", job.array_id ? `${job.array_id}, index ${job.array_index}` : null],
      ["concurrency_key", job.concurrency_key],
      ["schedule", scheduledBy(job)],
      ["reserved", job.reserved ? resourcesText(job.reserved)
        : job.status === "pending" ? "nothing (not placed)" : "nothing"],
      ["gpus", gpusAsked(job) || "none"],
      ["resources", countsText(job.resources) || "none"],
      ["gpus_assigned", assignedCell(job) || (job.gpus && job.status === "pending" && !job.node_id
        ? "none yet (not placed)" : "none")],
    ], "sched-");
  }

  // The jobs a job waits for, each a link with its condition; then what happens when one cannot hold.
  function dependsOn(job) {
    if (!job.depends_on || !job.depends_on.length) return null;
    const span = el("span");
    job.depends_on.forEach((d, i) => {
      if (i) span.append(", ");
      span.append(link("#/jobs/" + d.job_id, d.job_id), ` (${d.condition})`);
    });
    span.append(job.on_dependency_failure === "run" ? "; runs anyway if one cannot hold"
      : "; cancelled if one cannot hold");
    return span;
  }

  // The schedule whose slot made the job: its name, a link to its page, and the slot.
  function scheduledBy(job) {
    if (!job.schedule) return null;
    const span = el("span");
    span.append(link(scheduleHash(job.schedule), job.schedule), `, slot ${job.slot}`);
    return span;
  }

  function fieldText(value) {
    if (value === null || value === undefined) return "—";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  // Keep an output pane scrolled to the end while it is there, so growing output stays in view.
  function setOutput(pre, text) {
    if (pre.textContent === text) return;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }

  function drawJob({job, events, why}) {
    showPage("job-page");
    $("job-title").textContent = job.job_id;
    const status = $("job-status");
    status.textContent = job.status;
    status.className = "status " + job.status;
    document.title = `${job.job_id} (${job.status}) · Corral`;

    const cancel = $("cancel-job");
    const retry = $("retry-job");
    cancel.dataset.jobId = retry.dataset.jobId = job.job_id;
    cancel.disabled = !["pending", "running"].includes(job.status) || cancel.dataset.busy === "1";
    retry.disabled = job.status !== "failed" || retry.dataset.busy === "1";

    drawWaiting(job, why);
    drawScheduling(job);
    definitions($("job-fields"), JOB_FIELDS.map((name) => [name, fieldText(job[name])]), "field-");
    setOutput($("job-stdout"), job.stdout || "");
    setOutput($("job-stderr"), job.stderr || "");
    $("job-events").tBodies[0].replaceChildren(...events.map((event) => row([
      timeCell(event.at), event.from, event.to, event.attempt, event.node_id, event.reason])));
  }

  async function act(button, verb) {
    const jobId = button.dataset.jobId;
    if (!jobId) return;
    button.dataset.busy = "1";
    button.disabled = true;
    $("action-result").textContent = "";
    try {
      const job = await api(`jobs/${jobId}/${verb}`, "POST");
      $("action-result").textContent = `${verb}: ${job.job_id} is ${job.status}`;
    } catch (err) {
      if (!(err instanceof AuthNeeded)) $("action-result").textContent = `${verb} failed: ${err.message}`;
    } finally {
      delete button.dataset.busy;
    }
    poll();
  }

  $("cancel-job").addEventListener("click", (event) => act(event.currentTarget, "cancel"));
  $("retry-job").addEventListener("click", (event) => act(event.currentTarget, "retry"));

  // ---- users, teams and personal tokens -------------------------------------------------

  // Redraw a table's rows only when what they show changed (and once a minute, for the
  // times "ago"): a button is not replaced under the pointer.
  function setRows(table, data, rows) {
    const body = table.tBodies[0];
    const key = JSON.stringify([data, Math.floor(Date.now() / MINUTE_MS)]);
    if (body.dataset.key === key) return;
    body.replaceChildren(...rows());
    body.dataset.key = key;
  }

  function button(text, className, onClick) {
    const b = el("button", text, className);
    b.type = "button";
    b.addEventListener("click", onClick);
    return b;
  }

  // The same options in a datalist (suggestions for a text field), replaced when they change.
  function setSuggestions(list, values) {
    const key = JSON.stringify(values);
    if (list.dataset.key === key) return;
    list.replaceChildren(...values.map((value) => {
      const option = el("option");
      option.value = value;
      return option;
    }));
    list.dataset.key = key;
  }

  // A change made from a page: what it did, or the API's refusal as its one line, goes to
  // `result`; then the page is read again, and who is signed in (their role may be what changed).
  async function change(result, request, said) {
    result.textContent = "";
    result.classList.remove("error-text");
    try {
      result.textContent = said(await request());
    } catch (err) {
      if (err instanceof AuthNeeded) return;
      result.textContent = err.message;
      result.classList.add("error-text");
    }
    session.at = 0;
    poll();
  }

  const named = (part, name) => `${part}/${encodeURIComponent(name)}`;

  // The users and the teams: each page shows one and offers the other's names.
  async function loadAccounts() {
    const [users, teams] = await Promise.all([api("users"), api("teams")]);
    return {users, teams};
  }

  // -- users

  function drawUsers({users, teams}, who) {
    showPage("users-page");
    document.title = "Users · Corral";
    const admin = isClusterAdmin(who);
    $("user-form").hidden = !admin;
    if (admin) drawTeamPicks(teams.map((t) => t.name));
    setRows($("users"), {users, admin}, () => users.map((user) => {
      const remove = admin ? button("Delete", "delete", () => deleteUser(user.name)) : null;
      const tr = row([user.name, user.cluster_role || "none", user.teams.map(teamRoleText).join(", ") || null,
                      user.default_team, timeCell(user.created_at), remove]);
      cellClasses(tr, ["name", "cluster-role", "teams", "default-team", "created", "buttons"]);
      tr.dataset.user = user.name;
      return tr;
    }));
    $("users-empty").hidden = users.length > 0;
  }

  // The new user's teams: a box and a role for each team, rebuilt only when the teams change
  // (keeping what was picked); the default team is one of those picked.
  function drawTeamPicks(teams) {
    const box = $("user-teams");
    const key = JSON.stringify(teams);
    if (box.dataset.key !== key) {
      const before = pickedTeams();
      box.replaceChildren(el("legend", "teams"), ...teams.map((team) => {
        const pick = el("input");
        pick.type = "checkbox";
        pick.value = team;
        pick.checked = team in before;
        const role = el("select");
        setOptions(role, [["member", "member"], ["admin", "admin"]], before[team] || "member");
        const label = el("label", null, "team-pick");
        label.dataset.team = team;
        label.append(pick, " ", team, " ", role);
        return label;
      }));
      if (!teams.length) box.append(el("span", "No teams yet: make one on the teams page.", "muted"));
      box.dataset.key = key;
    }
    drawDefaultTeam();
  }

  function pickedTeams() {
    const picked = {};
    for (const label of $("user-teams").querySelectorAll(".team-pick")) {
      if (label.querySelector("input").checked) picked[label.dataset.team] = label.querySelector("select").value;
    }
    return picked;
  }

  function drawDefaultTeam() {
    const picked = Object.keys(pickedTeams());
    const select = $("user-default-team");
    const value = picked.includes(select.value) ? select.value : "";
    setOptions(select, [["", picked.length === 1 ? "their only team" : "none"], ...picked.map((t) => [t, t])], value);
  }

  $("user-teams").addEventListener("change", drawDefaultTeam);

  $("user-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const request = {name: $("user-name").value.trim(), cluster_role: $("user-role").value || null,
                     teams: pickedTeams(), default_team: $("user-default-team").value || null};
    change($("user-result"), () => api("users", "POST", request), (user) => {
      $("user-form").reset();
      drawDefaultTeam();
      return `made user ${user.name}`;
    });
  });

  function deleteUser(name) {
    if (!window.confirm(`Delete user ${name}? Their tokens are revoked; their jobs stay theirs.`)) return;
    change($("users-result"), () => api(named("users", name), "DELETE"), () => `deleted user ${name}`);
  }

  // -- teams

  // The accounts, and the quota and use of each team the caller may see (null: not shown to them).
  async function loadTeams() {
    const accounts = await loadAccounts();
    const quotas = await Promise.all(accounts.teams.map((team) => api(named("teams", team.name) + "/quota")
      .catch((err) => { if (err instanceof AuthNeeded) throw err; return null; })));
    return {...accounts, quotas: Object.fromEntries(accounts.teams.map((team, i) => [team.name, quotas[i]]))};
  }

  const QUOTA_RESOURCES = ["cpu_percent", "memory_mb", "gpus", "jobs"];

  // One line per resource a team has a quota of or uses: "jobs: uses 3 · guaranteed 2 · borrows up to 1 · lends all".
  function quotaList(quota) {
    const list = el("ul", null, "quota");
    if (!quota) return list;
    for (const resource of QUOTA_RESOURCES) {
      const set = ["guaranteed", "borrowing_limit", "lending_limit"].some((part) => resource in quota[part]);
      if (!set && !quota.used[resource]) continue;
      const limit = quota.borrowing_limit[resource], lend = quota.lending_limit[resource];
      const item = el("li", `${resource}: uses ${quota.used[resource]} · guaranteed ${quota.guaranteed[resource] ?? 0}`
        + ` · borrows ${limit === undefined ? "without limit" : "up to " + limit}`
        + ` · lends ${lend === undefined ? "all" : lend}`
        + (quota.borrowed[resource] ? ` · borrowing ${quota.borrowed[resource]} now` : ""));
      item.dataset.resource = resource;
      list.append(item);
    }
    if (!list.children.length) list.append(el("li", "no quota", "muted"));
    return list;
  }

  // RESOURCE=N,... as the CLI takes it; null when empty.
  function quotaAmounts(text, part) {
    const amounts = {};
    for (const item of text.split(",").map((x) => x.trim()).filter(Boolean)) {
      const [name, value] = item.split("=");
      if (!QUOTA_RESOURCES.includes(name) || !/^[0-9]+$/.test(value || "")) {
        throw new Error(`${part}: give RESOURCE=N,... with RESOURCE one of ${QUOTA_RESOURCES.join(", ")}`);
      }
      amounts[name] = Number(value);
    }
    return Object.keys(amounts).length ? amounts : null;
  }

  function drawTeams({teams, users, quotas}, who) {
    showPage("teams-page");
    document.title = "Teams · Corral";
    const admin = isClusterAdmin(who);
    // A team's admin sees the teams they lead; cluster admins and readers every team.
    const shown = seesEveryTeam(who) ? teams
      : teams.filter((team) => who.teams.some((t) => t.team === team.name && t.role === "admin"));
    const changeable = shown.map((team) => team.name).filter((team) => administers(who, team));
    $("team-form").hidden = !admin;
    $("quota-form").hidden = !admin;
    const quotaTeam = $("quota-team");
    setOptions(quotaTeam, teams.map((t) => [t.name, t.name]), quotaTeam.value || (teams[0] || {}).name);
    $("member-form").hidden = !changeable.length;
    const select = $("member-team");
    setOptions(select, changeable.map((t) => [t, t]), changeable.includes(select.value) ? select.value : changeable[0]);
    setSuggestions($("user-names"), users.map((user) => user.name));
    setRows($("teams"), {shown, changeable, admin, quotas}, () => shown.map((team) => {
      const members = el("ul", null, "members");
      const canChange = changeable.includes(team.name);
      members.append(...team.members.map((member) => memberItem(team.name, member, canChange)));
      if (!team.members.length) members.append(el("li", "no members", "muted"));
      const remove = admin ? button("Delete", "delete", () => deleteTeam(team.name)) : null;
      const tr = row([team.name, members, quotaList(quotas[team.name]), timeCell(team.created_at), remove]);
      cellClasses(tr, ["name", "members-cell", "quota-cell", "created", "buttons"]);
      tr.dataset.team = team.name;
      return tr;
    }));
    $("teams-empty").hidden = shown.length > 0;
  }

  // A member, their role, and (for who may change them) making them admin or member, and removing them.
  function memberItem(team, member, canChange) {
    const item = el("li", null, "member");
    item.dataset.user = member.user;
    item.dataset.role = member.role;
    item.append(el("span", member.user, "member-user"), " ", el("span", member.role, "role " + member.role));
    if (canChange) {
      const other = member.role === "admin" ? "member" : "admin";
      item.append(" ", button(`Make ${other}`, "make-" + other, () => setMember($("teams-result"), team, member.user,
                                                                                other)),
                  " ", button("Remove", "remove", () => removeMember(team, member.user)));
    }
    return item;
  }

  function setMember(result, team, user, role) {
    change(result, () => api(named(named("teams", team) + "/members", user), "PUT", {role}),
           () => `${user} is ${role === "admin" ? "an admin" : "a member"} of ${team}`);
  }

  function removeMember(team, user) {
    if (!window.confirm(`Take ${user} out of team ${team}?`)) return;
    change($("teams-result"), () => api(named(named("teams", team) + "/members", user), "DELETE"),
           () => `took ${user} out of ${team}`);
  }

  function deleteTeam(team) {
    if (!window.confirm(`Delete team ${team}?`)) return;
    change($("teams-result"), () => api(named("teams", team), "DELETE"), () => `deleted team ${team}`);
  }

  $("team-form").addEventListener("submit", (event) => {
    event.preventDefault();
    change($("team-result"), () => api("teams", "POST", {name: $("team-name").value.trim()}), (team) => {
      $("team-form").reset();
      return `made team ${team.name}`;
    });
  });

  $("quota-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const team = $("quota-team").value;
    change($("quota-result"), async () => {
      const body = {};
      for (const [part, id] of [["guaranteed", "quota-guaranteed"], ["borrowing_limit", "quota-borrowing"],
                                ["lending_limit", "quota-lending"]]) {
        const amounts = quotaAmounts($(id).value, part);
        if (amounts) body[part] = amounts;
      }
      return api(named("teams", team) + "/quota", "PUT", body);
    }, () => `set the quota of ${team}`);
  });

  $("quota-remove").addEventListener("click", () => {
    const team = $("quota-team").value;
    change($("quota-result"), () => api(named("teams", team) + "/quota", "DELETE"), () => `removed the quota of ${team}`);
  });

  $("member-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const user = $("member-user").value.trim();
    setMember($("member-result"), $("member-team").value, user, $("member-role").value);
    $("member-user").value = "";
  });

  // -- personal tokens

  async function loadTokens(who) {
    const [tokens, users] = await Promise.all([api("tokens"), isClusterAdmin(who) ? api("users") : []]);
    return {tokens, users};
  }

  function drawTokens({tokens, users}, who) {
    showPage("tokens-page");
    document.title = "Tokens · Corral";
    $("new-token-user-label").hidden = !isClusterAdmin(who);  // cluster admins make tokens for others
    setSuggestions($("token-user-names"), users.map((user) => user.name));
    setRows($("tokens"), {tokens, mine: who.token_id}, () => tokens.map((token) => {
      const created = el("span");
      created.append(timeCell(token.created_at), ` by ${token.created_by}`);
      const revoke = token.revoked_at ? null : button("Revoke", "revoke", () => revokeToken(token, who));
      const tr = row([token.token_id, token.user, token.name, token.scope, created,
                      token.expires_at ? timeCell(token.expires_at) : "never",
                      token.last_used_at ? timeCell(token.last_used_at) : "never",
                      token.revoked_at ? timeCell(token.revoked_at) : "no", revoke]);
      cellClasses(tr, ["token-id", "user", "name", "scope", "created", "expires", "last-used", "revoked", "buttons"]);
      tr.dataset.tokenId = token.token_id;
      tr.dataset.revoked = token.revoked_at ? "yes" : "no";
      if (token.token_id === who.token_id) tr.classList.add("in-use");
      return tr;
    }));
    $("tokens-empty").hidden = tokens.length > 0;
  }

  function revokeToken(token, who) {
    const yours = token.token_id === who.token_id ? " This page uses it: it will ask for another token." : "";
    if (!window.confirm(`Revoke ${token.token_id} (${token.name}, of ${token.user})?${yours}`)) return;
    change($("tokens-result"), () => api(named("tokens", token.token_id), "DELETE"),
           (revoked) => `revoked ${revoked.token_id}`);
  }

  $("token-create-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const request = {name: $("new-token-name").value.trim(), scope: $("new-token-scope").value};
    const days = $("new-token-days").value;
    if (days) request.expires_in_secs = Number(days) * 86400;
    const user = $("new-token-user").value.trim();
    if (user && !$("new-token-user-label").hidden) request.user = user;
    change($("token-create-result"), () => api("tokens", "POST", request), (token) => {
      showSecret(token);
      $("token-create-form").reset();
      return `made ${token.token_id} for ${token.user}`;
    });
  });

  // A new token's secret: shown here once (the API never answers it again), gone when
  // Done is clicked or the page is left.
  function showSecret(token) {
    $("new-token-secret").textContent = token.token;
    $("new-token-holder").textContent = token.user;
    $("copy-result").textContent = "";
    $("new-token").hidden = false;
  }

  function dropSecret() {
    $("new-token-secret").textContent = "";
    $("new-token").hidden = true;
  }

  $("dismiss-token").addEventListener("click", dropSecret);
  $("copy-token").addEventListener("click", async () => {
    const secret = $("new-token-secret");
    try {
      await navigator.clipboard.writeText(secret.textContent);
      $("copy-result").textContent = "copied";
    } catch (err) {
      // No clipboard for this page (served over plain HTTP from elsewhere than localhost):
      // the secret is selected, for a copy by hand.
      const range = document.createRange();
      range.selectNodeContents(secret);
      window.getSelection().removeAllRanges();
      window.getSelection().addRange(range);
      $("copy-result").textContent = "selected: copy it with Ctrl+C";
    }
  });

  // ---- the audit log ----------------------------------------------------------------

  // A page of GET /audit, newest first; "older" follows `next_before` (in the address,
  // as the filters are). Who may read which entries is the API's to say.
  const AUDIT_PAGE = 50;
  const auditActions = new Set();  // the actions seen so far: suggestions for the filter

  function auditHash(filters) {
    return pageHash("/audit", filters);
  }

  async function loadAudit(filters) {
    const params = new URLSearchParams({limit: String(AUDIT_PAGE)});
    for (const [name, value] of Object.entries(filters)) if (value) params.set(name, value);
    return api("audit?" + params);
  }

  // A value of an entry that is also a filter: a link to the entries that share it.
  function auditLink(filters, name, value) {
    return value ? link(auditHash({...filters, [name]: value, before: ""}), value) : null;
  }

  function drawAudit(filters, page) {
    showPage("audit-page");
    document.title = "Audit log · Corral";
    for (const name of ["user", "team", "action"]) {
      const field = $("audit-" + name);
      if (document.activeElement !== field) field.value = filters[name];  // not while typed in
    }
    for (const entry of page.events) auditActions.add(entry.action);
    setSuggestions($("audit-actions"), [...auditActions].sort());
    setRows($("audit"), {page, filters}, () => page.events.map((entry) => {
      // "2026-12-06 03:39:40" (UTC, as the column says); the instant and how long ago as its tooltip.
      const at = el("span", entry.at.replace("T", " ").replace(/(\.[0-9]+)?Z$/, ""));
      at.title = `${entry.at} (${ago(entry.at)})`;
      const answer = el("span", entry.status, entry.status >= 400 ? "refused" : "");
      const tr = row([at, auditLink(filters, "user", entry.user), auditLink(filters, "team", entry.team),
                      auditLink(filters, "action", entry.action), entry.target, `${entry.method} ${entry.path}`,
                      answer, entry.address, entry.token_id]);
      cellClasses(tr, ["at", "user", "team", "action", "target", "request", "answer", "address", "token-id"]);
      tr.dataset.id = entry.id;
      tr.dataset.action = entry.action;
      return tr;
    }));
    $("audit-empty").hidden = page.events.length > 0;
    $("audit-note").textContent = filters.before ? `older than entry ${filters.before}` : "";
    $("audit-newest").hidden = !filters.before;
    $("audit-newest").href = auditHash({...filters, before: ""});
    $("audit-older").hidden = page.next_before === null;
    $("audit-older").href = auditHash({...filters, before: page.next_before});
  }

  $("audit-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    window.location.hash = auditHash(Object.fromEntries(["user", "team", "action"].map((name) => [
      name, $("audit-" + name).value.trim()])));
  });

  // ---- usage ------------------------------------------------------------------------

  // GET /usage over a range of UTC days (default: the last 7, from today-6 to tomorrow):
  // a chart of CPU hours per team and day (GET /usage?group_by=day once per team, the
  // teams from group_by=team over the same range), and a table by the chosen grouping.
  // Which teams' usage a token sees is the API's to say; a refusal (a bad range) is
  // shown as its message in place of the chart and the table.
  const DAY_MS = 24 * HOUR_MS;
  const USAGE_GROUPS = ["day", "week", "user", "team"];
  const USAGE_SERIES_MAX = 12;    // teams in the chart, those with the most CPU first
  const USAGE_COLORS = 8;         // series-0 .. series-7 in the style sheet
  const usageTeams = new Set();   // the teams seen so far: suggestions for the filter

  function usageHash(filters) {
    return pageHash("/usage", filters);
  }

  // A UTC day as YYYY-MM-DD, `offset` days from today.
  function utcDay(offset) {
    const day = new Date();
    day.setUTCHours(0, 0, 0, 0);
    day.setUTCDate(day.getUTCDate() + offset);
    return day.toISOString().slice(0, 10);
  }

  // The filters with the defaults filled in: what the page asks for and shows.
  function usageQuery(filters) {
    return {from: filters.from || utcDay(-6), to: filters.to || utcDay(1), team: filters.team, user: filters.user,
            group_by: USAGE_GROUPS.includes(filters.group_by) ? filters.group_by : "day"};
  }

  function getUsage(query) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) if (value) params.set(name, value);
    return api("usage?" + params);
  }

  async function loadUsage(filters) {
    const query = usageQuery(filters);
    try {
      const [table, teams] = await Promise.all([
        getUsage(query), query.group_by === "team" ? null : getUsage({...query, group_by: "team"})]);
      const byTeam = teams || table;
      const charted = [...byTeam.rows].sort((a, b) => b.cpu_seconds - a.cpu_seconds || (a.group < b.group ? -1 : 1))
        .slice(0, USAGE_SERIES_MAX).map((r) => r.group).sort();
      const days = await Promise.all(charted.map((team) => getUsage({...query, team, group_by: "day"})));
      return {query, table, teams: byTeam.rows.map((r) => r.group),
              series: charted.map((team, i) => ({team, rows: days[i].rows}))};
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      return {query, refused: err.message};
    }
  }

  const hours = (secs) => (secs / 3600).toFixed(2);

  function drawUsage(filters, data) {
    showPage("usage-page");
    document.title = "Usage · Corral";
    const query = data.query;
    for (const name of ["from", "to", "team", "user"]) {
      const field = $("usage-" + name);
      if (document.activeElement !== field) field.value = query[name] || "";  // not while typed in
    }
    setOptions($("usage-group"), USAGE_GROUPS.map((g) => [g, g]), query.group_by);
    $("usage-refused").hidden = !data.refused;
    $("usage-refused").textContent = data.refused || "";
    $("usage-results").hidden = Boolean(data.refused);
    if (data.refused) return;
    for (const team of data.teams) usageTeams.add(team);
    setSuggestions($("usage-teams"), [...usageTeams].sort());
    $("usage-note").textContent = `(UTC, ${data.table.from_day} to the day before ${data.table.to_day})`;
    drawUsageChart(data);
    drawUsageTable(filters, data.table);
  }

  // CPU hours per team and day: a line per team, a day without usage at 0.
  function drawUsageChart({table, teams, series}) {
    const from = Date.parse(table.from_day + "T00:00:00Z");
    const to = Date.parse(table.to_day + "T00:00:00Z");
    const days = [];
    for (let t = from; t < to; t += DAY_MS) days.push(t);
    const lines = series.map(({team, rows}, i) => {
      const cpu = new Map(rows.map((r) => [r.group, r.cpu_seconds]));
      return {name: team, cls: "series-" + (i % USAGE_COLORS), total: rows.reduce((sum, r) => sum + r.cpu_seconds, 0),
              points: days.map((t) => [t + DAY_MS / 2, (cpu.get(new Date(t).toISOString().slice(0, 10)) || 0) / 3600])};
    });
    const every = Math.max(1, Math.ceil(days.length / 8));
    const dayTicks = () => days.filter((t, i) => i % every === 0).map((t) => [
      t + DAY_MS / 2, new Date(t).toISOString().slice(5, 10)]);
    drawLines($("chart-usage"), {from, to, gapMs: 1.5 * DAY_MS, unit: "h", series: lines, floor: 0.01,
                                 xTicks: dayTicks});
    drawLegend($("legend-usage"), lines.map((s) => [s.name, s.cls, `${hours(s.total)} h`]));
    $("usage-chart-empty").hidden = lines.length > 0;
    $("usage-chart-more").hidden = teams.length <= lines.length;
    $("usage-chart-more").textContent = `and ${teams.length - lines.length} more teams (the table has them all)`;
  }

  function drawUsageTable(filters, table) {
    const by = table.group_by;
    $("usage-group-name").textContent = by;
    setRows($("usage"), table, () => table.rows.map((r) => {
      // A user or a team is also a filter: the usage of that one alone.
      const group = by === "user" || by === "team" ? link(usageHash({...filters, [by]: r.group}), r.group) : r.group;
      const tr = row([group, number(r.attempts), hours(r.cpu_seconds), hours(r.wall_seconds),
                      hours(r.memory_mb_seconds / 1024), hours(r.gpu_seconds)]);
      cellClasses(tr, ["group", "attempts", "cpu-hours", "wall-hours", "memory-gb-hours", "gpu-hours"]);
      tr.dataset.group = r.group;
      return tr;
    }));
    $("usage-empty").hidden = table.rows.length > 0;
  }

  $("usage-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    window.location.hash = usageHash({
      ...Object.fromEntries(["from", "to", "team", "user"].map((name) => [name, $("usage-" + name).value.trim()])),
      group_by: $("usage-group").value});
  });
  $("usage-group").addEventListener("change", (event) => {
    window.location.hash = usageHash({...(route().filters || {}), group_by: event.target.value});
  });

  // ---- the event stream ----------------------------------------------------------------
  //
  // GET /events read with fetch() and a streaming parser: a browser's EventSource cannot
  // send the bearer token, and the token never goes into a URL. A dropped or ended stream
  // is reopened after its last event id (Last-Event-ID), so nothing in between is missed;
  // a refused one (503 when the scheduler process holds EVENTS_STREAMS_MAX streams, 429
  // when this token holds EVENTS_STREAMS_PER_CREDENTIAL of them, 404 from an older
  // scheduler) is tried again later while the page polls.

  const stream = {open: false, lastId: null, retryMs: 2000, failures: 0};

  function setStream(open) {
    stream.open = open;
    $("live").dataset.stream = open ? "open" : "down";
  }

  // Which events change what the page shows.
  function concerns(current, type, data) {
    if (current.page === "job") return data.job_id === current.jobId;
    if (current.page === "node") return type !== "log" && data.node_id === current.nodeId;
    if (current.page === "overview" || current.page === "schedule") return type !== "log";  // transitions, nodes
    return false;  // users, teams, tokens, the audit log, usage: read again by the poll
  }

  function onEvent(type, data) {
    if (type === "job" || type === "node" || type === "log") {
      if (concerns(route(), type, data)) requestRefresh("event");
    } else if (type === "missed") {
      requestRefresh("event");  // some events are gone: read everything again
    }
  }

  // The text of a stream, cut into events as it arrives (the WHATWG rules the server's
  // stream uses: fields, comments, a blank line ends an event, an id with no data still
  // moves the position).
  function sseParser(onFrame) {
    let buffer = "";
    let fields = {data: [], event: "", id: null};
    return (text) => {
      buffer += text;
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (fields.id !== null) stream.lastId = fields.id;
          if (fields.data.length) onFrame(fields.event || "message", fields.data.join("\n"));
          fields = {data: [], event: "", id: null};
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (name === "data") fields.data.push(value);
        else if (name === "event") fields.event = value;
        else if (name === "id" && !value.includes("\0")) fields.id = value;
        else if (name === "retry" && /^[0-9]+$/.test(value)) stream.retryMs = Number(value);
      }
    };
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function visible() {
    if (document.visibilityState !== "hidden") return Promise.resolve();
    return new Promise((resolve) => {
      const seen = () => {
        if (document.visibilityState === "hidden") return;
        document.removeEventListener("visibilitychange", seen);
        resolve();
      };
      document.addEventListener("visibilitychange", seen);
    });
  }

  async function readEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const feed = sseParser((type, text) => {
      let data = {};
      try {
        data = JSON.parse(text);
      } catch (err) {
        return;
      }
      onEvent(type, data);
    });
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      feed(decoder.decode(value, {stream: true}));
      if (document.visibilityState === "hidden") {  // a hidden tab holds no server thread
        reader.cancel();
        return;
      }
    }
  }

  async function followEvents() {
    for (;;) {
      await visible();
      if (waitingForToken) {
        await sleep(1000);
        continue;
      }
      const headers = authHeaders("text/event-stream");
      if (stream.lastId) headers["Last-Event-ID"] = stream.lastId;
      let wait = 0;
      try {
        const response = await fetch(new URL("events", API_ROOT), {headers, cache: "no-store"});
        if (response.ok && response.body) {
          setStream(true);
          stream.failures = 0;
          requestRefresh("open");  // what happened before the stream opened
          await readEvents(response);
          wait = stream.retryMs / 4;  // an ended stream (EVENTS_STREAM_MAX_SECS): back at once
        } else {
          const after = Number(response.headers.get("Retry-After"));
          wait = after > 0 ? after * 1000 : 0;
          stream.failures += 1;
        }
      } catch (err) {
        stream.failures += 1;  // a dropped connection, a scheduler going away
      }
      if (stream.open) {
        setStream(false);
        poll();  // back to polling until the stream is open again
      }
      if (stream.failures) {
        wait = Math.max(wait, Math.min(STREAM_RETRY_MAX_MS, stream.retryMs * 2 ** (stream.failures - 1)));
      }
      await sleep(wait);
    }
  }

  // ---- the poll loop -----------------------------------------------------------------

  // Each page of route(): what it reads from the API, and how it shows that.
  // A page offered to some users only (`for` whom) says so to the others; what it shows
  // and changes is still the API's to allow.
  const VIEWS = {
    overview: {load: (r, who) => loadOverview(r.filters, who),
               draw: (r, data, who) => drawOverview(r.filters, data, who)},
    job: {load: (r) => loadJob(r.jobId), draw: (r, data) => drawJob(data)},
    schedule: {load: (r) => loadSchedule(r.name), draw: (r, data) => drawSchedule(data)},
    node: {load: (r) => loadNode(r.nodeId), draw: (r, data) => drawNode(data)},
    users: {allowed: seesEveryTeam, for: "cluster admins and readers", load: loadAccounts,
            draw: (r, data, who) => drawUsers(data, who)},
    teams: {allowed: (who) => seesEveryTeam(who) || leadsTeams(who), for: "cluster admins and readers and team admins",
            load: loadTeams, draw: (r, data, who) => drawTeams(data, who)},
    tokens: {load: (r, who) => loadTokens(who), draw: (r, data, who) => drawTokens(data, who)},
    audit: {load: (r) => loadAudit(r.filters), draw: (r, data) => drawAudit(r.filters, data)},
    usage: {load: (r) => loadUsage(r.filters), draw: (r, data) => drawUsage(r.filters, data)},
  };

  let timer = null;
  let generation = 0;   // a newer poll (a route change) makes an older one's answer stale
  let inFlight = 0;     // the generation of the poll in flight, 0 for none
  let refreshTimer = null;
  let lastRefresh = 0;
  let wantedWhileInFlight = false;

  // An event asks for a reload: at most one every REFRESH_MIN_MS, and one poll in flight
  // is not cut short by another (a busy cluster would otherwise never finish one).
  function requestRefresh(why) {
    if (inFlight) {
      wantedWhileInFlight = true;
      return;
    }
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      lastRefresh = Date.now();
      poll(why);
    }, Math.max(0, lastRefresh + REFRESH_MIN_MS - Date.now()));
  }

  async function poll(why = "poll") {
    clearTimeout(timer);
    const mine = ++generation;
    if (waitingForToken) return;  // the token form starts the next poll
    let delay = stream.open ? SAFETY_POLL_MS : POLL_MS;
    if (document.visibilityState !== "hidden") {
      const current = route();
      inFlight = mine;
      try {
        const view = VIEWS[current.page];
        const who = await loadWho();
        if (view.allowed && !view.allowed(who)) {
          throw new Error(`the ${current.page} page is for ${view.for}: ${who.user} is none of them`);
        }
        const data = await view.load(current, who);
        if (mine !== generation) return;
        view.draw(current, data, who);
        $("live").dataset.refreshedBy = why;
        showError("");
        setLive(true);
      } catch (err) {
        if (mine !== generation) return;
        if (err instanceof AuthNeeded) return;
        showError(err.message);
        setLive(false, "not updating: " + err.message);
        delay = RETRY_MS;
      } finally {
        if (inFlight === mine) {
          inFlight = 0;
          if (wantedWhileInFlight) {
            wantedWhileInFlight = false;
            requestRefresh("event");
          }
        }
      }
    }
    if (mine === generation) timer = setTimeout(poll, delay);
  }

  window.addEventListener("hashchange", () => {
    $("action-result").textContent = "";
    dropSecret();
    showPage(null);  // until the new page's data is in
    poll("route");
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") poll();
  });
  setStream(false);
  poll("route");
  followEvents();
})();
