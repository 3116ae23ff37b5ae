/* report/html/heapprof.js: the script of the page `heapprof html` writes (embedded in
 * it by report/html/embed.py; plain ES2017, no library).
 *
 * It reads the profile from the JSON element #hp-data (layout: report/html.c), then
 * shows a summary of the processes, a flame graph (an icicle: the root on top) of one
 * process and dump, the heap over time and the sites by growth (several dumps), and the
 * growth since a base trace (--diff).
 *
 * The flame graph's call tree is built from the stacks (leaf nodes of the trie of call
 * paths in the data) each time what it shows changes: frames merge by function, hidden
 * frames give their children to their parent, allocator wrappers at the leaf fold into
 * their caller, focus keeps the stacks through a matching frame. Each trie node maps to
 * its tree node once per build (memoised), so a build is linear in the trie. Only boxes
 * at least MIN_BOX_PX wide become elements, so 100 k stacks draw in a few thousand.
 *
 * Names come from the profiled program and are untrusted: they only ever reach the page
 * as text nodes (textContent), never as markup.
 */
'use strict';

(function () {
  const ROW_PX = 18;
  const MIN_BOX_PX = 1;
  const MAX_BOXES = 40000;
  const MIN_TEXT_PX = 12;
  const FRAME_FIELDS = 6; /* name, file, line, module, pc, flags */
  /* Allocator entry points and wrappers, folded into their callers by default. */
  const WRAPPERS = new RegExp(
    '^(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|' +
      'valloc|pvalloc|strdup|strndup|__libc_(malloc|calloc|realloc|memalign)|' +
      'operator new(\\[\\])?\\b.*|operator delete(\\[\\])?\\b.*|' +
      '__rust_(alloc|alloc_zeroed|realloc|dealloc)|__rdl_\\w+|__rg_\\w+|<?alloc::.*|' +
      '(std::|__gnu_cxx::)(__)?new_allocator<.*>::allocate\\b.*|' +
      'std::allocator_traits<.*>::allocate\\b.*)$');
  const OWN_MODULE = /(^|\/)libheapprof\.so/;

  const METRICS = {
    u: 'unreleased bytes',
    a: 'allocated bytes',
    uc: 'unreleased allocations',
    ac: 'allocations'
  };
  const DIFF_METRICS = {
    du: 'unreleased growth (bytes)',
    nu: 'unreleased shrink (bytes)',
    da: 'allocated growth (bytes)',
    dc: 'allocations growth'
  };

  /* ---- data ---- */

  const times = { start: performance.now() };
  window.heapprofTimes = times;
  const data = JSON.parse(document.getElementById('hp-data').textContent);
  times.parsed = performance.now();
  const S = data.strings;
  const F = data.frames;
  const nFrames = F.length / FRAME_FIELDS;
  const nNodes = data.np.length;
  const NP = new Int32Array(nNodes);
  const NF = new Int32Array(nNodes);
  for (let i = 0; i < nNodes; i++) {
    NP[i] = i - data.np[i];
    NF[i] = data.nf[i];
  }
  NP[0] = -1;
  const procs = data.processes;

  const fName = f => F[f * FRAME_FIELDS];
  const fFile = f => S[F[f * FRAME_FIELDS + 1]];
  const fLine = f => F[f * FRAME_FIELDS + 2];
  const fModule = f => S[F[f * FRAME_FIELDS + 3]];
  const fPc = f => F[f * FRAME_FIELDS + 4];
  const fInlined = f => (F[f * FRAME_FIELDS + 5] & 1) !== 0;

  /* "file:line", else "module+0xpc", as the text report shows a frame. */
  function fWhere(f) {
    const file = fFile(f);
    if (file) return file + ':' + fLine(f);
    return (fModule(f) || '?') + '+0x' + fPc(f).toString(16);
  }

  /* Per frame: whether its name matches @re (cached per regular expression). */
  const frameMatchCache = new Map();
  function framesMatching(re) {
    if (!re) return null;
    const key = re.source;
    let m = frameMatchCache.get(key);
    if (m) return m;
    const byName = new Map();
    m = new Uint8Array(nFrames);
    for (let f = 0; f < nFrames; f++) {
      const n = fName(f);
      let hit = byName.get(n);
      if (hit === undefined) {
        hit = re.test(S[n]) ? 1 : 0;
        byName.set(n, hit);
      }
      m[f] = hit;
    }
    frameMatchCache.set(key, m);
    return m;
  }

  let wrapperFrames = null;
  function isWrapperFrame() {
    if (!wrapperFrames) {
      wrapperFrames = new Uint8Array(nFrames);
      const byName = framesMatching(WRAPPERS);
      for (let f = 0; f < nFrames; f++)
        wrapperFrames[f] = byName[f] || OWN_MODULE.test(fModule(f)) ? 1 : 0;
    }
    return wrapperFrames;
  }

  /* ---- formatting ---- */

  function fmtBytes(b) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    const neg = b < 0;
    let v = Math.abs(b);
    if (v < 1024) return (neg ? '-' : '') + Math.round(v) + ' B';
    let u = 0;
    while (v >= 1024 && u + 1 < units.length) {
      v /= 1024;
      u++;
    }
    return (neg ? '-' : '') + v.toFixed(1) + ' ' + units[u];
  }
  function isBytes(metric) {
    return metric === 'u' || metric === 'a' || metric === 'du' || metric === 'nu' || metric === 'da';
  }
  function fmtValue(v, metric) {
    return isBytes(metric) ? fmtBytes(v) + ' (' + v + ' bytes)' : v + ' allocations';
  }
  function fmtShort(v, metric) {
    return isBytes(metric) ? fmtBytes(v) : String(v);
  }
  function fmtSigned(v) {
    return (v >= 0 ? '+' : '') + fmtBytes(v);
  }
  function pct(a, b) {
    return b > 0 ? (100 * a / b).toFixed(1) + '%' : '-';
  }
  function fmtSeconds(t) {
    return t === null || t === undefined ? '?' : t.toFixed(1) + ' s';
  }

  /* An element with attributes @attrs and children (strings become text nodes). */
  function el(tag, attrs) {
    const e = document.createElement(tag);
    if (attrs)
      for (const k of Object.keys(attrs)) {
        if (k === 'cls') e.className = attrs[k];
        else if (k === 'on') for (const ev of Object.keys(attrs.on)) e.addEventListener(ev, attrs.on[ev]);
        else e.setAttribute(k, attrs[k]);
      }
    for (let i = 2; i < arguments.length; i++) {
      const c = arguments[i];
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    }
    return e;
  }
  const SVG_NS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k of Object.keys(attrs || {})) e.setAttribute(k, attrs[k]);
    return e;
  }

  /* ---- per process ---- */

  const lossTexts = [
    ['dropped', 'for want of room in the shared buffer'],
    ['freeset_full', 'samples whose free the program could not watch (its set was full)'],
    ['reserve_failures', 'to contention on the shared buffer'],
    ['records_unread', 'left unread when the session ended'],
    ['records_lost_in_service', 'for want of memory in the service'],
    ['records_refused', 'refused by the bookkeeping (caps, memory)']
  ];
  const otherTexts = [
    ['stacks_truncated', 'stacks cut at the copy size (outer frames missing)'],
    ['unknown_stacks', "samples on stacks not the thread's own"],
    ['unknown_frees', 'frees of addresses not live'],
    ['seq_gaps', 'gaps in the record sequence'],
    ['map_reparses_deferred', 'waits for the rate limit of maps rereads'],
    ['unseen_call_slots', 'allocator call slots of the program not switched to the profiler ' +
      '(their calls are missing)']
  ];

  function losses(p) {
    const l = Object.assign({}, p.losses);
    l.dropped = l.records_dropped - Math.min(l.freeset_full, l.records_dropped);
    return l;
  }
  /* Records lost on their way to the dump. */
  function drops(p) {
    const l = losses(p);
    return lossTexts.reduce((s, t) => s + l[t[0]], 0);
  }

  /* The process's flags, worded as the text report words them: [text, is an error]. */
  function flagTexts(p) {
    const f = p.flags;
    const out = [];
    if (f.from_startup) out.push(['profiled from startup', false]);
    else {
      let t = 'attached while running';
      if (p.startedBefore !== null)
        t += ' (profiled from ' + (p.startedAfter !== null ? p.startedAfter.toFixed(1) +
          ' s after the process started, ' : '') + p.startedBefore.toFixed(1) +
          ' s before the dump shown; earlier allocations are not seen)';
      out.push([t, false]);
    }
    if (f.connection_lost && !f.connection_closed_by_program)
      out.push(['DISCONNECTED (not profiled after that)', true]);
    else if (f.disconnected) out.push(['disconnected: the process ended before the session did', false]);
    if (f.buffer_overran) out.push(['BUFFER OVERRAN (samples were dropped)', true]);
    if (f.buffer_corrupted) out.push(['BUFFER CORRUPTED', true]);
    if (f.hit_guardrail) out.push(['HIT GUARDRAIL', true]);
    if (f.client_error)
      out.push([f.buffer_overran ? 'CLIENT ERROR (stopped waiting for the service)' : 'CLIENT ERROR', true]);
    if (f.connection_closed_by_program)
      out.push(['CONNECTION CLOSED BY THE PROGRAM (not profiled after that)', true]);
    if (f.writer_stalled)
      out.push(['writer stalled (' + p.stats.writer_stalls + ' waits for a stopped thread, ' +
        p.stats.stalled_records_skipped + ' records of exited threads skipped)', true]);
    if (p.stats.frees_lost)
      out.push([p.stats.frees_lost + ' frees were lost on the way: unreleased bytes are ' +
        'overestimated', true]);
    return out;
  }

  function peakOf(p) {
    let best = -1;
    p.dumps.forEach((d, i) => {
      if (best < 0 || d.u > p.dumps[best].u) best = i;
    });
    return best;
  }

  function procName(p) {
    return p.cmd || '(unknown)';
  }

  /* ---- state ---- */

  const st = {
    proc: 0,
    view: 'dump', /* or 'diff' */
    dump: 0,
    metric: 'u',
    fold: true,
    search: null,
    hide: null,
    focus: null,
    only: -1, /* a trie leaf: show this stack only */
    zoom: 0
  };
  let tree = null;
  const ui = {};

  function proc() {
    return procs[st.proc];
  }

  /* The stacks and values the flame graph shows now. */
  function currentValues() {
    const p = proc();
    if (st.view === 'diff' && p.diff) {
      const d = p.diff;
      const src = st.metric === 'nu' ? d.du : d[st.metric];
      const sign = st.metric === 'nu' ? -1 : 1;
      return { s: d.s, v: src.map(x => Math.max(0, sign * x)) };
    }
    const dump = p.dumps[st.dump];
    if (!dump || !dump.v) return { s: [], v: [] };
    return { s: dump.v.s, v: dump.v[st.metric] };
  }

  /* ---- the call tree ---- */

  /* A growable column of the call tree. */
  function grow(a, n) {
    if (n < a.length) return a;
    const b = new a.constructor(Math.max(1024, a.length * 2));
    b.set(a);
    return b;
  }

  /* Builds the call tree of @sv ({s: leaves, v: values}) under the filters of st. The
   * children of a node are a linked list (first child, next sibling), searched in line;
   * a node with many children gets a Map. */
  function buildTree(sv) {
    const hideF = framesMatching(st.hide);
    const focusF = framesMatching(st.focus);
    const wrapF = isWrapperFrame();
    let parent = new Int32Array(1024);
    let key = new Int32Array(1024);
    let first = new Int32Array(1024);
    let next = new Int32Array(1024);
    let nkids = new Int32Array(1024);
    let self = new Float64Array(1024);
    let frame = new Int32Array(1024);
    const big = new Map();
    let n = 1;
    parent[0] = -1;
    key[0] = -1;
    first[0] = -1;
    frame[0] = -1;
    const dmap = new Int32Array(nNodes).fill(-1);
    dmap[0] = 0;
    const focusMemo = focusF ? new Int8Array(nNodes) : null;

    function child(d, f) {
      const k = fName(f) * 2 + (fInlined(f) ? 1 : 0);
      let c;
      if (nkids[d] > 8) {
        c = big.get(d).get(k);
        if (c !== undefined) return c;
      } else {
        for (c = first[d]; c >= 0; c = next[c]) if (key[c] === k) return c;
      }
      c = n++;
      if (c >= parent.length) {
        parent = grow(parent, c);
        key = grow(key, c);
        first = grow(first, c);
        next = grow(next, c);
        nkids = grow(nkids, c);
        self = grow(self, c);
        frame = grow(frame, c);
      }
      parent[c] = d;
      key[c] = k;
      frame[c] = f;
      first[c] = -1;
      next[c] = first[d];
      first[d] = c;
      nkids[d]++;
      if (nkids[d] === 9) {
        const m = new Map();
        for (let x = first[d]; x >= 0; x = next[x]) m.set(key[x], x);
        big.set(d, m);
      } else if (nkids[d] > 9) big.get(d).set(k, c);
      return c;
    }
    function disp(m) {
      if (dmap[m] >= 0) return dmap[m];
      const path = [];
      while (dmap[m] < 0) {
        path.push(m);
        m = NP[m];
      }
      let d = dmap[m];
      for (let k = path.length - 1; k >= 0; k--) {
        const x = path[k];
        if (!hideF || !hideF[NF[x]]) d = child(d, NF[x]);
        dmap[x] = d;
      }
      return d;
    }
    function throughFocus(m) {
      const path = [];
      let hit = 0;
      while (m > 0 && focusMemo[m] === 0) {
        path.push(m);
        if (focusF[NF[m]]) {
          hit = 2;
          break;
        }
        m = NP[m];
      }
      if (!hit) hit = m > 0 ? focusMemo[m] : 1;
      for (const x of path) focusMemo[x] = hit;
      return hit === 2;
    }

    for (let i = 0; i < sv.s.length; i++) {
      const v = sv.v[i];
      if (!(v > 0)) continue;
      const leaf = sv.s[i];
      if (st.only >= 0 && leaf !== st.only) continue;
      if (focusF && !throughFocus(leaf)) continue;
      let e = leaf;
      if (st.fold) while (e > 0 && wrapF[NF[e]]) e = NP[e];
      self[disp(e)] += v;
    }
    return finishTree(n, parent, key, frame, self, dmap);
  }

  /* The call tree of the @n nodes built: names, totals, children lists (compressed
   * rows, each sorted when first drawn). */
  function finishTree(n, parent, key, frame, self, dmap) {
    const t = {
      n: n, parent: parent, name: new Int32Array(n), inl: new Uint8Array(n), frame: frame,
      self: self, dmap: dmap
    };
    for (let i = 1; i < n; i++) {
      t.name[i] = key[i] >> 1;
      t.inl[i] = key[i] & 1;
    }
    t.name[0] = -1;
    t.total = Float64Array.from(self.subarray(0, n));
    for (let i = n - 1; i > 0; i--) t.total[parent[i]] += t.total[i];
    const count = new Int32Array(n + 1);
    for (let i = 1; i < n; i++) count[parent[i] + 1]++;
    for (let i = 0; i < n; i++) count[i + 1] += count[i];
    t.childStart = count;
    t.childList = new Int32Array(Math.max(n - 1, 0));
    const fill = Int32Array.from(count);
    for (let i = 1; i < n; i++) t.childList[fill[parent[i]]++] = i;
    t.sorted = new Uint8Array(n);
    return t;
  }

  /* The frames (distinct file:line) that make up tree node @n, at most @max. */
  function locationsOf(t, n, max) {
    const out = [t.frame[n]];
    for (let m = 1; m < nNodes && out.length < max; m++)
      if (t.dmap[m] === n && out.indexOf(NF[m]) < 0 && !fInlined(NF[m]) === !t.inl[n] &&
        fName(NF[m]) === t.name[n])
        out.push(NF[m]);
    return out;
  }

  function childrenOf(t, n) {
    const a = t.childStart[n];
    const b = t.childStart[n + 1];
    if (!t.sorted[n]) {
      const sub = Array.from(t.childList.subarray(a, b));
      sub.sort((x, y) => t.total[y] - t.total[x] || (S[t.name[x]] < S[t.name[y]] ? -1 : 1));
      t.childList.set(sub, a);
      t.sorted[n] = 1;
    }
    return t.childList.subarray(a, b);
  }

  function nodeName(t, n) {
    return n === 0 ? 'all' : S[t.name[n]];
  }

  /* Tree nodes whose names match st.search, and the sum of the outermost ones. */
  function searchTree(t) {
    if (!st.search) return null;
    const byName = new Map();
    const match = new Uint8Array(t.n);
    const under = new Uint8Array(t.n);
    let sum = 0;
    for (let i = 1; i < t.n; i++) {
      let hit = byName.get(t.name[i]);
      if (hit === undefined) {
        hit = st.search.test(S[t.name[i]]) ? 1 : 0;
        byName.set(t.name[i], hit);
      }
      match[i] = hit;
      const p = t.parent[i];
      under[i] = under[p] || match[p];
      if (hit && !under[i]) sum += t.total[i];
    }
    return { match: match, sum: sum };
  }

  /* ---- the flame graph ---- */

  /* A warm colour per function name, lighter for inlined frames (cached per name). */
  const colours = new Map();
  function colourOf(t, n) {
    const k = t.name[n] * 2 + t.inl[n];
    let c = colours.get(k);
    if (c === undefined) {
      const s = S[t.name[n]];
      let h = 0;
      for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
      h = Math.abs(h);
      c = 'hsl(' + (h % 50) + ',' + (65 + (h >> 8) % 25) + '%,' + (t.inl[n] ? 80 : 62 + (h >> 4) % 12) + '%)';
      colours.set(k, c);
    }
    return c;
  }

  function addBox(frag, t, n, x, w, row, cls, found) {
    const e = document.createElement('div');
    const hit = found && found.match[n];
    e.className = 'f' + (cls ? ' ' + cls : '') + (t.inl[n] ? ' inl' : '') + (hit ? ' match' : '');
    e.style.cssText = 'left:' + x + 'px;top:' + row * ROW_PX + 'px;width:' + Math.max(w, 1) + 'px' +
      (n !== 0 && !hit && !cls ? ';background:' + colourOf(t, n) : '');
    e.dataset.n = n;
    e.dataset.v = t.total[n];
    /* Text only where it can be read: a narrow box gets its name in the tooltip. */
    if (w >= MIN_TEXT_PX) e.textContent = nodeName(t, n);
    frag.appendChild(e);
  }

  function renderFlame() {
    const t = tree;
    const fg = ui.flame;
    const width = Math.max(fg.clientWidth, 200);
    if (st.zoom >= t.n) st.zoom = 0;
    const found = searchTree(t);
    const frag = document.createDocumentFragment();
    const path = [];
    for (let a = st.zoom; a >= 0; a = t.parent[a]) path.unshift(a);
    let row = 0;
    for (let i = 0; i + 1 < path.length; i++) addBox(frag, t, path[i], 0, width, row++, 'anc', found);
    let boxes = 0;
    let maxRow = row;
    const scale = t.total[st.zoom] > 0 ? width / t.total[st.zoom] : 0;
    const todo = [[st.zoom, 0, row]];
    while (todo.length && boxes < MAX_BOXES) {
      const item = todo.pop();
      const n = item[0];
      const w = t.total[n] * scale;
      if (n !== st.zoom && w < MIN_BOX_PX) continue;
      addBox(frag, t, n, item[1], w, item[2], n === 0 ? 'root' : '', found);
      boxes++;
      if (item[2] > maxRow) maxRow = item[2];
      let x = item[1];
      for (const c of childrenOf(t, n)) {
        const cw = t.total[c] * scale;
        if (cw < MIN_BOX_PX) break; /* sorted: the rest are narrower */
        todo.push([c, x, item[2] + 1]);
        x += cw;
      }
    }
    fg.textContent = '';
    fg.appendChild(frag);
    fg.style.height = (maxRow + 1) * ROW_PX + 'px';
    renderFlameInfo(found);
  }

  function renderFlameInfo(found) {
    const t = tree;
    const p = proc();
    const m = st.metric;
    let what;
    if (st.view === 'diff') what = DIFF_METRICS[m] + ' since ' + data.baseTitle;
    else if (!p.dumps.length) what = 'no complete dump in this trace';
    else {
      const d = p.dumps[st.dump];
      what = METRICS[m] + ' at dump ' + (st.dump + 1) + ' of ' + p.dumps.length +
        (d.t !== null ? ' (' + fmtSeconds(d.t) + ')' : '');
    }
    ui.flameTitle.textContent = 'Process ' + p.pid + ': ' + what + ': ' + fmtValue(t.total[0], m);
    ui.matchInfo.textContent = '';
    if (found) {
      ui.matchInfo.appendChild(el('span', { id: 'hp-match-sum', 'data-v': String(found.sum) },
        'Matched: ' + fmtValue(found.sum, m) + ', ' + pct(found.sum, t.total[0]) + ' of all'));
    }
    ui.onlyChip.style.display = st.only >= 0 ? '' : 'none';
  }

  function rebuild() {
    const t0 = performance.now();
    tree = buildTree(currentValues());
    times.build = performance.now() - t0;
    st.zoom = 0;
    renderFlame();
    times.render = performance.now() - t0 - times.build;
  }

  /* ---- tooltip ---- */

  function showTip(ev) {
    const box = ev.target.closest ? ev.target.closest('.f') : null;
    const tip = ui.tip;
    if (!box) {
      tip.style.display = 'none';
      return;
    }
    const t = tree;
    const n = +box.dataset.n;
    tip.textContent = '';
    tip.appendChild(el('div', { cls: 'tname' }, nodeName(t, n) + (t.inl[n] ? ' (inlined)' : '')));
    if (!t.locCache) t.locCache = new Map();
    let locs = t.locCache.get(n);
    if (!locs) {
      locs = n ? locationsOf(t, n, 8) : [];
      t.locCache.set(n, locs);
    }
    for (const f of locs) tip.appendChild(el('div', { cls: 'tloc' }, fWhere(f)));
    if (locs.length && fFile(locs[0])) tip.appendChild(el('div', { cls: 'tloc' }, fModule(locs[0])));
    const m = st.metric;
    tip.appendChild(el('div', null, fmtValue(t.total[n], m) + ', ' + pct(t.total[n], t.total[0]) +
      ' of all' + (st.zoom ? ', ' + pct(t.total[n], t.total[st.zoom]) + ' of the zoomed frame' : '')));
    if (t.self[n] > 0) tip.appendChild(el('div', null, 'self: ' + fmtValue(t.self[n], m)));
    const p = proc();
    if (isBytes(m) && p.interval > 1 && st.view === 'dump')
      tip.appendChild(el('div', { cls: 'tloc' }, 'sampled: ± ' +
        fmtBytes(Math.sqrt(p.interval * t.total[n])) + ' (one standard deviation)'));
    tip.style.display = 'block';
    const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = ev.clientY + 16 + tip.offsetHeight > window.innerHeight ? ev.clientY - tip.offsetHeight - 8 : ev.clientY + 16;
    tip.style.left = Math.max(0, x) + 'px';
    tip.style.top = Math.max(0, y) + 'px';
  }

  /* ---- controls ---- */

  /* A regular expression from an input, or null when empty; marks a bad one. */
  function regexOf(input) {
    const s = input.value;
    input.classList.remove('bad');
    input.title = '';
    if (!s) return null;
    try {
      return new RegExp(s);
    } catch (e) {
      input.classList.add('bad');
      input.title = String(e.message);
      return undefined;
    }
  }

  function fillSelect(sel, options, value) {
    sel.textContent = '';
    for (const o of options) {
      const opt = el('option', { value: o[0] }, o[1]);
      if (o[2]) opt.disabled = true;
      sel.appendChild(opt);
    }
    sel.value = value;
  }

  function refreshControls() {
    const p = proc();
    const views = p.dumps.map((d, i) => ['d' + i, 'dump ' + (i + 1) + (d.t !== null ? ' at ' + fmtSeconds(d.t) : '') +
      ': ' + fmtBytes(d.u) + ' unreleased' + (d.v ? '' : ' (values not in the page)'), !d.v]);
    if (p.diff) views.push(['diff', 'growth since ' + data.baseTitle]);
    fillSelect(ui.view, views, st.view === 'diff' ? 'diff' : 'd' + st.dump);
    const metrics = st.view === 'diff' ? DIFF_METRICS : METRICS;
    if (!(st.metric in metrics)) st.metric = Object.keys(metrics)[0];
    fillSelect(ui.metric, Object.keys(metrics).map(k => [k, metrics[k]]), st.metric);
    ui.proc.value = String(st.proc);
  }

  function selectProcess(i) {
    st.proc = i;
    const p = proc();
    st.view = 'dump';
    st.dump = p.sel < p.dumps.length ? p.sel : Math.max(0, p.dumps.length - 1);
    if (!p.dumps.length && p.diff) st.view = 'diff';
    st.only = -1;
    refreshControls();
    for (const r of ui.summaryRows) r.classList.toggle('sel', +r.dataset.proc === i);
    renderProcessDetail();
    renderGrowth();
    renderDiff();
    rebuild();
  }

  /* The flame graph shows the one stack @leaf in @view ('dump': the last dump). */
  function showStack(leaf, view) {
    const p = proc();
    st.view = view;
    if (view === 'dump') {
      st.dump = p.dumps.length - 1;
      st.metric = 'u';
    } else st.metric = 'du';
    st.only = leaf;
    refreshControls();
    rebuild();
    if (ui.flame.scrollIntoView) ui.flame.scrollIntoView({ block: 'nearest' });
  }

  function buildControls() {
    const c = el('div', { cls: 'controls' });
    ui.proc = el('select', { id: 'hp-proc', title: 'process' });
    procs.forEach((p, i) => ui.proc.appendChild(el('option', { value: String(i) },
      p.pid + ': ' + procName(p) + (p.heap && p.heap !== 'libc.malloc' ? ' [' + p.heap + ']' : ''))));
    ui.view = el('select', { id: 'hp-view', title: 'dump' });
    ui.metric = el('select', { id: 'hp-metric', title: 'value' });
    ui.fold = el('input', { type: 'checkbox', id: 'hp-fold' });
    ui.fold.checked = true;
    ui.search = el('input', { type: 'search', id: 'hp-search', placeholder: 'search (regex)' });
    ui.hide = el('input', { type: 'text', id: 'hp-hide', placeholder: 'hide (regex)' });
    ui.focus = el('input', { type: 'text', id: 'hp-focus', placeholder: 'focus (regex)' });
    ui.onlyChip = el('button', { id: 'hp-only', cls: 'chip', title: 'show every stack again' },
      'one stack \u2715');
    const reset = el('button', { id: 'hp-reset' }, 'reset');
    c.append(el('label', null, 'process ', ui.proc), el('label', null, 'show ', ui.view),
      el('label', null, 'value ', ui.metric),
      el('label', { title: 'allocator entry points and wrappers at the leaf count as their caller' },
        ui.fold, ' fold allocator wrappers'),
      ui.search, ui.hide, ui.focus, ui.onlyChip, reset);

    ui.proc.addEventListener('change', () => selectProcess(+ui.proc.value));
    ui.view.addEventListener('change', () => {
      const v = ui.view.value;
      if (v === 'diff') st.view = 'diff';
      else {
        st.view = 'dump';
        st.dump = +v.slice(1);
      }
      refreshControls();
      rebuild();
    });
    ui.metric.addEventListener('change', () => {
      st.metric = ui.metric.value;
      rebuild();
    });
    ui.fold.addEventListener('change', () => {
      st.fold = ui.fold.checked;
      rebuild();
    });
    let searchTimer = 0;
    const onSearch = () => {
      clearTimeout(searchTimer);
      const re = regexOf(ui.search);
      if (re !== undefined) {
        st.search = re;
        renderFlame();
      }
    };
    ui.search.addEventListener('change', onSearch);
    ui.search.addEventListener('input', () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(onSearch, 150);
    });
    for (const k of ['hide', 'focus']) {
      let timer = 0;
      const apply = () => {
        clearTimeout(timer);
        const re = regexOf(ui[k]);
        if (re !== undefined) {
          st[k] = re;
          rebuild();
        }
      };
      ui[k].addEventListener('change', apply);
      ui[k].addEventListener('input', () => {
        clearTimeout(timer);
        timer = setTimeout(apply, 300);
      });
    }
    ui.onlyChip.addEventListener('click', () => {
      st.only = -1;
      rebuild();
    });
    reset.addEventListener('click', () => {
      ui.search.value = ui.hide.value = ui.focus.value = '';
      st.search = st.hide = st.focus = null;
      st.only = -1;
      ui.fold.checked = st.fold = true;
      rebuild();
    });
    return c;
  }

  /* ---- summary ---- */

  function buildSummary() {
    const head = el('tr', null);
    for (const h of ['pid', 'program', 'heap', 'peak heap (when)', 'unreleased at the end',
      'allocated', 'samples', 'drops', 'flags'])
      head.appendChild(el('th', null, h));
    const body = el('tbody', null);
    ui.summaryRows = [];
    procs.forEach((p, i) => {
      const last = p.dumps[p.dumps.length - 1];
      const pk = peakOf(p);
      let peak = '-';
      if (pk >= 0) {
        const d = p.dumps[pk];
        peak = fmtBytes(d.u) + (d.t !== null ? ' at ' + fmtSeconds(d.t) : '') + ' (dump ' + (pk + 1) +
          ' of ' + p.dumps.length + ')';
        const tracked = p.dumps.reduce((m, x) => Math.max(m, x.peak), 0);
        if (tracked > d.u) peak += '; ' + fmtBytes(tracked) + ' at the peak the service tracked';
      }
      const flags = el('td', { cls: 'flags' });
      for (const f of flagTexts(p)) flags.appendChild(el('div', { cls: f[1] ? 'err' : '' }, f[0]));
      const row = el('tr', { 'data-proc': String(i), cls: 'proc' },
        el('td', null, String(p.pid) + (p.exec ? ' (exec ' + (p.exec + 1) + ')' : '')),
        el('td', { cls: 'cmd' }, procName(p)), el('td', null, p.heap || '(unnamed)'),
        el('td', null, peak), el('td', null, last ? fmtBytes(last.u) : '-'),
        el('td', null, last ? fmtBytes(last.a) : '-'), el('td', null, String(p.stats.samples)),
        el('td', { cls: drops(p) ? 'err' : '' }, String(drops(p))), flags);
      row.addEventListener('click', () => selectProcess(i));
      ui.summaryRows.push(row);
      body.appendChild(row);
    });
    return el('table', { id: 'hp-summary', cls: 'summary' }, el('thead', null, head), body);
  }

  function renderProcessDetail() {
    const p = proc();
    const box = ui.detail;
    box.textContent = '';
    box.appendChild(el('h2', null, 'Process ' + p.pid + ': ' + procName(p)));
    const d = p.dumps[p.sel];
    box.appendChild(el('div', null, 'heap ' + (p.heap || '(unnamed)') + ', sampling interval ' +
      p.interval + ' bytes, ' + p.nDumps + ' dump' + (p.nDumps === 1 ? '' : 's') +
      (d ? '; allocated ' + fmtBytes(d.a) + ', unreleased ' + fmtBytes(d.u) : '')));
    if (p.interval > 1)
      box.appendChild(el('div', { cls: 'note' }, 'Sampled: bytes and counts are estimates.'));
    const s = p.stats;
    box.appendChild(el('div', null, 'Stats: ' + s.samples + ' samples, ' + s.unwinding_errors +
      ' unwinding errors, ' + s.map_reparses + ' map reparses, ' + s.unwinding_us +
      ' us unwinding, ' + s.client_blocked_us + ' us client blocked on the ring'));
    const l = losses(p);
    for (const group of [['Records lost: ', lossTexts], ['Also: ', otherTexts]]) {
      const parts = group[1].filter(x => l[x[0]]).map(x => l[x[0]] + ' ' + x[1]);
      if (parts.length) box.appendChild(el('div', { cls: 'err' }, group[0] + parts.join(', ')));
    }
  }

  /* ---- heap over time, growth ---- */

  function leafFrame(leaf) {
    let e = leaf;
    const wrapF = isWrapperFrame();
    while (e > 0 && wrapF[NF[e]] && NP[e] > 0) e = NP[e];
    return e > 0 ? NF[e] : -1;
  }
  function siteCell(leaf) {
    const f = leafFrame(leaf);
    if (f < 0) return el('td', { cls: 'site' }, '(no frames)');
    return el('td', { cls: 'site' }, el('span', { cls: 'fn' }, S[fName(f)]), ' ', el('span', { cls: 'loc' }, fWhere(f)));
  }

  function chart(p) {
    const g = p.growth;
    const W = 800;
    const H = 200;
    const L = 70;
    const B = 24;
    const maxY = Math.max(1, Math.max.apply(null, g.total));
    const x0 = g.x[0];
    const span = Math.max(g.x[g.x.length - 1] - x0, 1e-9);
    const px = x => L + (W - L - 10) * (x - x0) / span;
    const py = y => H - B - (H - B - 10) * y / maxY;
    const root = svg('svg', { id: 'hp-chart', viewBox: '0 0 ' + W + ' ' + H, width: '100%', height: String(H) });
    root.appendChild(svg('line', { x1: L, y1: H - B, x2: W - 10, y2: H - B, class: 'axis' }));
    root.appendChild(svg('line', { x1: L, y1: 10, x2: L, y2: H - B, class: 'axis' }));
    const label = (x, y, text, anchor) => {
      const e = svg('text', { x: x, y: y, 'text-anchor': anchor || 'start', class: 'lbl' });
      e.textContent = text;
      root.appendChild(e);
    };
    label(L - 6, 14, fmtBytes(maxY), 'end');
    label(L - 6, H - B, '0', 'end');
    label(L, H - 6, g.timed ? fmtSeconds(x0) : 'dump 1');
    label(W - 10, H - 6, g.timed ? fmtSeconds(g.x[g.x.length - 1]) + ' since the first dump' : 'dump ' + g.x.length, 'end');
    const pts = g.total.map((y, i) => px(g.x[i]).toFixed(1) + ',' + py(y).toFixed(1));
    root.appendChild(svg('polyline', { points: pts.join(' '), class: 'line' }));
    g.total.forEach((y, i) => {
      const c = svg('circle', { cx: px(g.x[i]), cy: py(y), r: 3.5, class: 'pt', 'data-i': i, 'data-v': y });
      const title = svg('title', {});
      title.textContent = 'dump ' + (i + 1) + ': ' + fmtBytes(y) + ' unreleased (' + y + ' bytes)';
      c.appendChild(title);
      c.addEventListener('click', () => {
        if (!p.dumps[i] || !p.dumps[i].v) return;
        st.view = 'dump';
        st.dump = i;
        refreshControls();
        rebuild();
      });
      root.appendChild(c);
    });
    return root;
  }

  function renderGrowth() {
    const p = proc();
    const box = ui.growth;
    box.textContent = '';
    if (!p.growth) return;
    box.appendChild(el('h2', null, 'Heap over time'));
    box.appendChild(el('div', { cls: 'note' }, 'Unreleased bytes of process ' + p.pid +
      ' at each of its ' + p.growth.total.length + ' dumps (click a point for its flame graph).'));
    box.appendChild(chart(p));
    if (p.growth.total.length < 3) return;
    box.appendChild(el('h2', null, 'Sites by steady growth'));
    box.appendChild(el('div', { cls: 'note' }, 'Least-squares slope of each site\u2019s ' +
      'unreleased bytes; z = slope / its standard error, with the sampling noise as a floor: ' +
      'z \u2265 3 is growth beyond noise. Click a site for its stack.'));
    const unit = p.growth.timed ? '/s' : '/dump';
    const body = el('tbody', null);
    p.growth.sites.forEach((s, i) => {
      const row = el('tr', { cls: 'site-row', 'data-leaf': String(s.s) }, el('td', null, '#' + (i + 1)),
        el('td', null, '+' + fmtBytes(s.slope) + unit),
        el('td', { cls: s.z >= 3 ? '' : 'noise' }, s.z.toFixed(1) + (s.z >= 3 ? '' : ' (noise?)')),
        el('td', null, fmtBytes(s.last)), siteCell(s.s));
      row.addEventListener('click', () => showStack(s.s, 'dump'));
      body.appendChild(row);
    });
    if (!p.growth.sites.length) body.appendChild(el('tr', null, el('td', { colspan: '5' }, '(no site grew)')));
    box.appendChild(el('table', { id: 'hp-growth', cls: 'sites' }, el('thead', null,
      el('tr', null, el('th', null, '#'), el('th', null, 'growth'), el('th', null, 'z'),
        el('th', null, 'unreleased at the last dump'), el('th', null, 'site'))), body));
  }

  function renderDiff() {
    const p = proc();
    const box = ui.diff;
    box.textContent = '';
    if (!p.diff) return;
    const d = p.diff;
    const sum = a => a.reduce((s, x) => s + x, 0);
    box.appendChild(el('h2', null, 'Growth since ' + data.baseTitle));
    box.appendChild(el('div', null, d.base ? 'Compared with process ' + d.base.pid + ' (' +
      (d.base.cmd || '?') + ') of the base.' : 'No matching process in the base: all of it is growth.'));
    box.appendChild(el('div', null, 'unreleased ' + fmtSigned(sum(d.du)) + ', allocated ' + fmtSigned(sum(d.da))));
    const body = el('tbody', null);
    let shown = 0;
    for (let i = 0; i < d.s.length && shown < 20; i++) {
      if (d.du[i] <= 0 && d.da[i] <= 0) continue;
      shown++;
      const leaf = d.s[i];
      const row = el('tr', { cls: 'site-row', 'data-leaf': String(leaf) }, el('td', null, '#' + shown),
        el('td', null, fmtSigned(d.du[i])), el('td', null, fmtBytes(d.bu[i]) + ' \u2192 ' + fmtBytes(d.tu[i])),
        el('td', null, fmtSigned(d.da[i])), el('td', null, (d.dc[i] >= 0 ? '+' : '') + d.dc[i]), siteCell(leaf));
      row.addEventListener('click', () => showStack(leaf, 'diff'));
      body.appendChild(row);
    }
    if (!shown) body.appendChild(el('tr', null, el('td', { colspan: '6' }, '(none grew)')));
    box.appendChild(el('table', { id: 'hp-diff', cls: 'sites' }, el('thead', null,
      el('tr', null, el('th', null, '#'), el('th', null, 'unreleased'), el('th', null, 'base \u2192 now'),
        el('th', null, 'allocated'), el('th', null, 'allocations'), el('th', null, 'site'))), body));
  }

  /* ---- the page ---- */

  function main() {
    const app = document.getElementById('app');
    app.textContent = '';
    document.title = 'heapprof: ' + data.title;
    app.appendChild(el('h1', null, 'heapprof: ' + data.title));
    if (data.truncated)
      app.appendChild(el('div', { cls: 'err' }, 'The trace is truncated: shown is what was read before its end' +
        (data.incompleteDumps ? ' (' + data.incompleteDumps + ' incomplete dumps dropped)' : '') + '.'));
    if (!procs.length) {
      app.appendChild(el('p', null, 'No heap profiles in this trace (' + data.packets + ' packets).'));
      return;
    }
    app.appendChild(buildSummary());
    ui.detail = el('div', { id: 'hp-detail', cls: 'detail' });
    app.appendChild(ui.detail);
    app.appendChild(buildControls());
    ui.flameTitle = el('div', { id: 'hp-flame-title', cls: 'ftitle' });
    ui.matchInfo = el('div', { id: 'hp-match', cls: 'match-info' });
    ui.flame = el('div', { id: 'hp-flame', cls: 'flame' });
    ui.tip = el('div', { id: 'hp-tip', cls: 'tip' });
    app.append(ui.flameTitle, ui.matchInfo, ui.flame, ui.tip);
    ui.growth = el('div', { id: 'hp-growth-box' });
    ui.diff = el('div', { id: 'hp-diff-box' });
    app.append(ui.growth, ui.diff);
    app.appendChild(el('p', { cls: 'note' }, 'Click a frame to zoom into it, the top row to zoom out. ' +
      'Search highlights matching functions; hide drops matching frames (their callees go to their ' +
      'caller); focus keeps the stacks through a matching frame.'));

    ui.flame.addEventListener('click', ev => {
      const box = ev.target.closest('.f');
      if (!box) return;
      st.zoom = +box.dataset.n;
      renderFlame();
    });
    ui.flame.addEventListener('mousemove', showTip);
    ui.flame.addEventListener('mouseleave', () => {
      ui.tip.style.display = 'none';
    });
    let resizeTimer = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(renderFlame, 100);
    });
    let first = 0;
    procs.forEach((p, i) => {
      const pk = p.dumps.length ? p.dumps[p.dumps.length - 1].u : 0;
      if (pk > (procs[first].dumps.length ? procs[first].dumps[procs[first].dumps.length - 1].u : 0)) first = i;
    });
    selectProcess(first);
  }

  main();
  /* For measurements: when the first flame graph was built and drawn. */
  window.heapprofRenderedMs = performance.now();
  requestAnimationFrame(() => setTimeout(() => {
    window.heapprofPaintedMs = performance.now();
    document.body.setAttribute('data-ready', '1');
  }, 0));
})();
