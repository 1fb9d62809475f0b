"""One episode as a self-contained HTML page: agents as lanes on the derived clock.

    html = render_episode(events, title="group0_rollout1")   # `python -m avalon.tools.view`

The header says how the episode ended (`outcome`): the collective reward, the end reason, the
failed tool calls, and what the environment recorded at the end (its `env_metrics`, and of
its ground truth `env_record` how many builds, defective ones and ships), then task, budget,
derived latency and critical-path share.

Every event is placed at its agent's derived clock (`avalon/org/latency.py`), drawn on a time
axis of that clock: model calls and tool calls as bars from start to end, hires, fires, waits,
wakes, compactions, stops and rewards as marks, and each delivered message as an arrow from the
sender's clock at the send to the receiver's clock at the delivery; a legend names every colour
and mark. A failed tool call (a tool error) is drawn in the error colour, at least
`FAILED_MIN_PX` wide and above the lane's other bars, so a call that took no time still shows.
Hovering shows an event's text (a turn's output, a tool call's arguments and result, a
message's text); clicking shows every field of the event. Zoom (buttons, Ctrl + wheel, or
`#zoom=4` in the URL) widens the clock; the chart scrolls; at 1x (fit) the whole episode fills
the chart's box. "Fit events" (or `#fit=events`) draws every idle stretch of the clock (longer
than `IDLE_SHARE` of the episode, where no event starts or ends: a long build, a long wait) as
a short break marked with its length, so the turns and messages around it fill the chart. The
page holds its data as JSON and draws itself with a small inline script (SVG); it loads nothing
from anywhere.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence

from avalon.analysis.logs import reward_of
from avalon.org.events import EventKind
from avalon.org.latency import ClockReplay

HOVER_CHARS = 400  # text shown on hover (a click shows every field in full)
FAILED_MIN_PX = 6  # a failed call's least width on screen
IDLE_SHARE = 0.05  # "fit events": idle stretches longer than this share of the episode break


def _hover(e: Mapping, kind: str) -> str:
    """What hovering an event shows: its text, a tool call's arguments and result, a hire's
    title, a message's text."""
    if kind == EventKind.MODEL_CALL.value:
        text = f"turn {e.get('turn', '')}: {e.get('text', '(text not logged)')}"
    elif kind == EventKind.TOOL_CALL.value:
        args = json.dumps(e.get("args", {}), sort_keys=True)
        result = e.get("result", "(result not logged)")
        text = f"{e.get('tool')}({args}) -> {result}"
        if e.get("error"):
            text += f"  [error: {e['error']}]" if isinstance(e["error"], str) else "  [error]"
    elif kind == EventKind.HIRE.value:
        text = f"hire {e.get('new_agent')}: {e.get('title', '')} - {e.get('role', '')}"
    elif kind == EventKind.SEND.value:
        text = e.get("text", "(text not logged)")
    else:
        fields = {k: v for k, v in e.items() if k not in ("seq", "agent", "kind", "cause")}
        text = f"{kind} {json.dumps(fields, sort_keys=True, default=str)}"
    return text if len(text) <= HOVER_CHARS else text[:HOVER_CHARS - 3] + "..."


def episode_data(events: Sequence[Mapping]) -> dict:
    """What the page draws: lanes, timed items, message arrows (all JSON)."""
    clocks = ClockReplay()
    agents: dict[str, str] = {}  # id -> title, in order of appearance
    items, arrows = [], []
    sends: dict[str, tuple[str, float, int, Mapping]] = {}
    for e in events:
        agent = e["agent"]
        before = clocks.clock(agent)
        clocks.apply(e)
        after = clocks.clock_at(e["seq"])
        kind = e["kind"]
        if agent not in agents:
            agents[agent] = "CEO" if agent == "ceo" else agent
        if kind == EventKind.HIRE.value:
            agents[e["new_agent"]] = e["title"]
        if kind in (EventKind.MODEL_CALL.value, EventKind.TOOL_CALL.value):
            if kind == EventKind.TOOL_CALL.value:
                start = after - float(e["duration_s"])
            else:
                start = before
            label = (e["tool"] if kind == EventKind.TOOL_CALL.value
                     else f"turn {e.get('turn', '')}")
            items.append({"seq": e["seq"], "agent": agent, "kind": kind, "t0": start,
                          "t1": after, "label": label, "hover": _hover(e, kind),
                          "error": bool(e.get("error") or e.get("malformed")),
                          "reward": sum(float(r["value"]) for r in e.get("rewards", ()))
                          if not e.get("late") else 0.0})
        elif kind == EventKind.SEND.value:
            sends[e["message_id"]] = (agent, after, e["seq"], e)
        elif kind == EventKind.DELIVER.value:
            src = sends.get(e["message_id"])
            if src is not None:
                arrows.append({"message": e["message_id"], "from": src[0], "to": agent,
                               "t0": src[1], "t1": after, "seq": src[2],
                               "deliver_seq": e["seq"],
                               "hover": f"{e['message_id']} {src[0]} -> {agent}: "
                                        f"{_hover(src[3], EventKind.SEND.value)}"})
        else:
            items.append({"seq": e["seq"], "agent": agent, "kind": kind, "t0": after,
                          "t1": after, "label": kind, "hover": _hover(e, kind), "error": False,
                          "reward": sum(float(r["value"]) for r in e.get("rewards", ()))})
    messages = sorted({e["message_id"] for e in events if e["kind"] == EventKind.SEND.value})
    report = clocks.report()
    return {"agents": [{"id": a, "title": t} for a, t in agents.items()], "items": items,
            "arrows": arrows, "messages": messages, "events": list(events),
            "latency_s": report.task_latency_s,
            "critical_path": report.critical_path,
            "critical_token_share": report.critical_token_share,
            "outcome": outcome(events), "failed_min_px": FAILED_MIN_PX,
            "idle_share": IDLE_SHARE}


def outcome(events: Sequence[Mapping]) -> dict:
    """How the episode ended: `reward` (the collective reward, `logs.reward_of`), `end_reason`
    (None: the log has no end event), `tool_calls`, `failed_calls`, `env_metrics` (the
    environment's end record, {} when it keeps none) and from its ground truth `env_record`
    the numbers of `builds`, `defective_builds` and `shipped` (None without one)."""
    end = next((e for e in reversed(events) if e["kind"] == EventKind.END.value), None)
    calls = [e for e in events if e["kind"] == EventKind.TOOL_CALL.value]
    record = (end or {}).get("env_record") or {}
    builds = record.get("builds")
    return {"reward": reward_of(events), "end_reason": (end or {}).get("reason"),
            "tool_calls": len(calls), "failed_calls": sum(bool(e.get("error")) for e in calls),
            "env_metrics": dict((end or {}).get("env_metrics") or {}),
            "builds": len(builds) if builds is not None else None,
            "defective_builds": sum(bool(b.get("defective")) for b in builds)
            if builds is not None else None,
            "shipped": len(record["shipped"]) if "shipped" in record else None}


def _number(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def outcome_lines(o: Mapping) -> tuple[str, str]:
    """The header's two lines: the ending, and what the environment recorded."""
    ending = (f"reward {o['reward']:g} · end: {o['end_reason'] or 'no end event'} · failed "
              f"tool calls {o['failed_calls']} of {o['tool_calls']}")
    recorded = ", ".join(f"{k} {_number(v)}" for k, v in sorted(o["env_metrics"].items()))
    truth = ""
    if o["builds"] is not None:
        truth = (f"; ground truth: {o['builds']} builds ({o['defective_builds']} defective), "
                 f"{o['shipped']} shipped")
    env = (f"the environment recorded: {recorded or 'nothing'}{truth}"
           if recorded or truth else "the environment keeps no end record")
    return ending, env


# (class, what it is) for the legend; the classes are the ones the script draws with.
LEGEND = (("model_call", "model call (a turn)"), ("tool_call", "tool call"),
          ("err", "failed tool call or malformed turn"), ("crit", "on the critical path"),
          ("hire", "hire"), ("fire", "fire"), ("compaction", "compaction"),
          ("end", "end of the episode"), ("mark", "other event (wait, wake, stop, ...)"),
          ("msg", "message, send -> delivery"), ("reward", "reward"),
          ("idle", "idle stretch drawn as a break (fit events)"))


def _legend_html() -> str:
    keys = []
    for cls, text in LEGEND:
        if cls in ("model_call", "tool_call", "err", "crit", "idle"):
            shape = (f'<rect x="1" y="2" width="18" height="8" class="'
                     f'{"model_call " + cls if cls == "crit" else cls}"/>')
        elif cls == "msg":
            shape = '<path d="M1,6 L17,6" class="msg"/>'
        elif cls == "reward":
            shape = '<text x="1" y="10" class="reward">+1</text>'
        else:
            shape = f'<circle cx="10" cy="6" r="4" class="{cls}"/>'
        keys.append(f'<span class="key" data-legend="{cls}"><svg width="20" height="12">'
                    f'{shape}</svg>{html.escape(text)}</span>')
    return ('<div id="legend"><b>Legend</b> ' + " ".join(keys)
            + ' <span class="key">x axis: the derived clock (s); hover for text, click for '
              'every field; zoom with the buttons or Ctrl + wheel</span></div>')


_STYLE = """
body{font:13px sans-serif;margin:12px;color:#222}
#toolbar{margin:6px 0}#toolbar button{min-width:2.2em}
#legend{margin:6px 0;line-height:20px}.key{margin-right:12px;white-space:nowrap}
.key svg{vertical-align:middle;margin-right:3px}
#wrap{display:flex;gap:12px}
#chart{flex:3;overflow-x:auto;border:1px solid #ccc}
#detail{flex:2;max-height:85vh;overflow:auto;border:1px solid #ccc;padding:8px;
white-space:pre-wrap;font:12px monospace}
.lane-label{font-weight:bold}
.model_call{fill:#6a9fd8}.tool_call{fill:#7fbf7f}.err{fill:#e06666}
.crit{stroke:#000;stroke-width:1.5}
.mark{fill:#999}.hire{fill:#8e44ad}.fire{fill:#c0392b}.compaction{fill:#e67e22}
.end{fill:#000}.reward{fill:#d4ac0d;font-size:11px}
.msg{stroke:#555;stroke-width:1;fill:none;marker-end:url(#arrow)}
.msg:hover,.sel{stroke:#d00;stroke-width:2}
.axis{stroke:#888}.grid{stroke:#eee}.tick-label{font-size:10px;fill:#555}
.idle{fill:#f4f4f4;stroke:#bbb;stroke-dasharray:3,3}
rect.err{fill:#e06666;stroke:#900;stroke-width:1}
.axis-title{font-size:11px;fill:#555}
"""

_SCRIPT = r"""
(function () {
  const data = JSON.parse(document.getElementById('episode-data').textContent);
  const NS = 'http://www.w3.org/2000/svg';
  const laneH = 36, left = 150, top = 40, minWidth = 600, breakPx = 28;
  const span = Math.max(data.latency_s, 1e-9);
  const bySeq = {};
  data.events.forEach(e => { bySeq[e.seq] = e; });
  const crit = new Set(data.critical_path);
  const lane = {};
  data.agents.forEach((a, i) => { lane[a.id] = top + i * laneH; });
  let zoom = 1, events = false;
  const fromHash = /zoom=([0-9.]+)/.exec(window.location.hash);
  if (fromHash) zoom = Math.min(64, Math.max(1, parseFloat(fromHash[1])));
  if (/fit=events/.test(window.location.hash)) events = true;

  // "Fit events": the clock's idle stretches (no item or arrow starts or ends inside, longer
  // than idle_share of the episode) become breaks of breakPx pixels.
  const idle = (function () {
    const ts = [0, span];
    data.items.forEach(it => { ts.push(it.t0, it.t1); });
    data.arrows.forEach(a => { ts.push(a.t0, a.t1); });
    ts.sort((a, b) => a - b);
    const out = [];
    for (let i = 1; i < ts.length; i++) {
      if (ts[i] - ts[i - 1] > data.idle_share * span) out.push([ts[i - 1], ts[i]]);
    }
    return out;
  })();

  function show(seqs) {
    const out = seqs.map(s => JSON.stringify(bySeq[s], null, 1)).join('\n\n');
    document.getElementById('detail').textContent = out;
  }
  function niceStep(raw) {  // 1, 2 or 5 x 10^k seconds
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  function clockText(t) {
    if (span < 120) return (Math.round(t * 100) / 100) + ' s';
    const m = Math.floor(t / 60), s = Math.round(t - 60 * m);
    return m + 'm' + (s < 10 ? '0' : '') + s + 's';
  }
  function scale(width) {  // the clock -> pixels, linear or with idle stretches as breaks
    const px = width - left - 20;
    const gaps = events ? idle : [];
    const active = span - gaps.reduce((a, g) => a + g[1] - g[0], 0);
    const perS = Math.max(px - breakPx * gaps.length, px / 4) / Math.max(active, 1e-9);
    return function (t) {
      let x = left, from = 0;
      for (const g of gaps) {
        if (t <= g[0]) break;
        x += (g[0] - from) * perS;
        if (t < g[1]) return x + breakPx * (t - g[0]) / (g[1] - g[0]);
        x += breakPx;
        from = g[1];
      }
      return x + (t - from) * perS;
    };
  }

  function draw() {
    // 1x fits the whole episode in the chart's box (the page's width less the detail pane)
    const base = Math.max(minWidth, document.getElementById('chart').clientWidth - 4);
    const width = left + (base - left) * zoom;
    const x = scale(width);
    const height = top + data.agents.length * laneH + 20;
    const old = document.querySelector('#chart svg');
    if (old) old.remove();
    const svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('width', width);
    svg.setAttribute('height', height);
    svg.innerHTML = '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" ' +
      'markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0L10,5L0,10z" ' +
      'fill="#555"/></marker></defs>';
    function el(name, attrs, text) {
      const n = document.createElementNS(NS, name);
      for (const k in attrs) n.setAttribute(k, attrs[k]);
      if (text !== undefined) n.textContent = text;
      svg.appendChild(n);
      return n;
    }
    function hover(n, text) {
      const title = document.createElementNS(NS, 'title');
      title.textContent = text;
      n.appendChild(title);
    }
    el('line', {x1: left, x2: x(span), y1: top - 8, y2: top - 8, class: 'axis'});
    el('text', {x: 4, y: top - 22, class: 'axis-title'}, 'derived clock');
    function tick(t) {
      el('line', {x1: x(t), x2: x(t), y1: top - 8, y2: height - 20, class: 'grid'});
      el('line', {x1: x(t), x2: x(t), y1: top - 12, y2: top - 4, class: 'axis tick',
                  'data-tick': t.toFixed(3)});
      const end = x(t) > width - 60;  // the last label ends at its tick, inside the chart
      el('text', {x: end ? x(t) - 2 : x(t) + 2, y: top - 16, class: 'tick-label',
                  'text-anchor': end ? 'end' : 'start'}, clockText(t));
    }
    if (!events) {
      // The time axis: the derived clock, ticks every 1, 2 or 5 x 10^k seconds.
      const step = niceStep(span / Math.max(4, Math.round(10 * zoom)));
      for (let t = 0; t <= span + 1e-9; t += step) tick(t);
    } else {
      // A tick at each end of every stretch drawn to scale, a break mark over every gap.
      const ends = [0];
      idle.forEach(g => { ends.push(g[0], g[1]); });
      ends.push(span);
      let last = -Infinity;
      ends.forEach(t => { if (x(t) - last > 40) { tick(t); last = x(t); } });
      idle.forEach(g => {
        const x0 = x(g[0]), x1 = x(g[1]);
        el('rect', {x: x0, y: top - 8, width: x1 - x0, height: height - top - 12,
                    class: 'idle', 'data-idle': (g[1] - g[0]).toFixed(3)});
        el('text', {x: x0 + 1, y: height - 8, class: 'tick-label'},
           '+' + clockText(g[1] - g[0]));
      });
    }
    data.agents.forEach(a => {
      el('line', {x1: left, x2: width - 10, y1: lane[a.id] + laneH / 2,
                  y2: lane[a.id] + laneH / 2, stroke: '#eee'});
      const t = el('text', {x: 4, y: lane[a.id] + laneH / 2 + 4, class: 'lane-label',
                            'data-agent': a.id}, a.id + ' ' + a.title);
      t.addEventListener('click', () => show([]));
    });
    // Bars first, failed calls last: a call that took no time sits where the agent's next
    // turn starts, and would be hidden under it.
    const failed = it => it.kind === 'tool_call' && it.error;
    const order = data.items.filter(it => !failed(it)).concat(data.items.filter(failed));
    order.forEach(it => {
      const y = lane[it.agent];
      let n;
      if (it.kind === 'model_call' || it.kind === 'tool_call') {
        let x0 = x(it.t0), w = Math.max(x(it.t1) - x0, 2);
        const cls = it.kind + (it.error ? ' err' : '') + (crit.has(it.seq) ? ' crit' : '');
        let h = it.kind === 'model_call' ? 14 : 10;
        if (failed(it)) {  // at least failed_min_px wide, centred, taller than a turn
          if (w < data.failed_min_px) {
            x0 -= (data.failed_min_px - w) / 2;
            w = data.failed_min_px;
          }
          h = 20;
        }
        n = el('rect', {x: x0, y: y + (laneH - h) / 2, width: w, height: h, class: cls,
                        'data-seq': it.seq});
      } else {
        const cls = ['hire', 'fire', 'compaction', 'end'].includes(it.kind) ? it.kind : 'mark';
        n = el('circle', {cx: x(it.t0), cy: y + laneH / 2, r: it.kind === 'end' ? 5 : 4,
                          class: cls, 'data-seq': it.seq});
      }
      hover(n, it.label + ' @' + clockText(it.t0) + '\n' + it.hover);
      n.addEventListener('click', () => show([it.seq]));
      if (it.reward) {
        el('text', {x: x(it.t1) + 2, y: y + 10, class: 'reward'}, '+' + it.reward);
      }
    });
    data.arrows.forEach(a => {
      const y0 = lane[a.from] + laneH / 2, y1 = lane[a.to] + laneH / 2;
      const p = el('path', {d: `M${x(a.t0)},${y0} L${x(a.t1)},${y1}`, class: 'msg',
                            'data-message': a.message});
      hover(p, a.hover);
      p.addEventListener('click', () => { show([a.seq, a.deliver_seq]); });
    });
    document.getElementById('chart').appendChild(svg);
    document.getElementById('zoom-level').textContent = zoom + 'x' +
      (events ? ', idle stretches as breaks' : '');
  }

  function setZoom(z, anchor) {  // keep the point under `anchor` (chart px) in place
    const chart = document.getElementById('chart');
    const before = (chart.scrollLeft + (anchor || 0) - left) / zoom;
    zoom = Math.min(64, Math.max(1, z));
    draw();
    chart.scrollLeft = Math.max(0, before * zoom + left - (anchor || 0));
  }
  document.getElementById('zoom-in').addEventListener('click', () => setZoom(zoom * 2));
  document.getElementById('zoom-out').addEventListener('click', () => setZoom(zoom / 2));
  document.getElementById('zoom-fit').addEventListener('click', () => {
    events = false; setZoom(1);
  });
  document.getElementById('fit-events').addEventListener('click', () => {
    events = true; setZoom(1);
  });
  document.getElementById('chart').addEventListener('wheel', ev => {
    if (!ev.ctrlKey) return;
    ev.preventDefault();
    const box = document.getElementById('chart').getBoundingClientRect();
    setZoom(ev.deltaY < 0 ? zoom * 1.25 : zoom / 1.25, ev.clientX - box.left);
  }, {passive: false});
  window.addEventListener('resize', () => setZoom(zoom));
  draw();

  const list = document.getElementById('messages');
  data.messages.forEach(m => {
    const li = document.createElement('li');
    li.setAttribute('data-message-item', m);
    const send = data.events.find(e => e.kind === 'send' && e.message_id === m);
    li.textContent = m + ' ' + send.agent + ' -> ' + (send.to.join(', ') || '(nobody)') +
      ': ' + (send.text || '');
    li.addEventListener('click', () => show([send.seq]));
    list.appendChild(li);
  });
  document.getElementById('status').textContent = 'drawn ' + data.items.length + ' events';
})();
"""


def render_episode(events: Sequence[Mapping], title: str = "episode") -> str:
    """The page (see the module docstring)."""
    if not events:
        raise ValueError("render_episode: no events")
    data = episode_data(events)
    # `</` inside a JSON string would end the script element; `<\/` is the same JSON string.
    payload = json.dumps(data, sort_keys=True, ensure_ascii=True).replace("</", "<\\/")
    start = events[0]
    ending, env = outcome_lines(data["outcome"])
    head = (f"task {start.get('task_id', '?')} · budget {start.get('budget', '?')} · "
            f"latency {data['latency_s']:.1f} s · critical-path token share "
            f"{data['critical_token_share']:.2f}")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h2>{html.escape(title)}</h2>"
        f"<p id=\"outcome\"><b>{html.escape(ending)}</b><br>{html.escape(env)}</p>"
        f"<p>{html.escape(head)}</p>"
        "<p id=\"status\">loading</p>"
        "<div id=\"toolbar\">zoom <button id=\"zoom-out\" title=\"zoom out\">&minus;</button>"
        "<button id=\"zoom-in\" title=\"zoom in\">+</button>"
        "<button id=\"zoom-fit\" title=\"the whole episode\">fit</button> "
        "<button id=\"fit-events\" title=\"idle stretches of the clock drawn as short breaks\">"
        "fit events</button> "
        "<span id=\"zoom-level\"></span></div>"
        f"{_legend_html()}"
        "<div id=\"wrap\"><div id=\"chart\"></div>"
        "<div id=\"detail\">click a bar, mark or arrow</div></div>"
        "<h3>Messages</h3><ul id=\"messages\"></ul>"
        f"<script type=\"application/json\" id=\"episode-data\">{payload}</script>"
        f"<script>{_SCRIPT}</script></body></html>\n")
