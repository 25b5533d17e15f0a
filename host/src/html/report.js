// gpuheap's HTML report: draws the timeline (SVG) from the JSON in #gpuheap-data. No library, no
// network. Opened with the fragment #selftest it writes what it drew, as JSON, into a pre element with
// the id gpuheap-selftest (see host/src/html/mod.rs).
(function () {
  'use strict';
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message || e)); });
  var origError = console.error;
  console.error = function () {
    errors.push(Array.prototype.map.call(arguments, String).join(' '));
    return origError.apply(console, arguments);
  };

  var NS = 'http://www.w3.org/2000/svg';
  var COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd', '#8c564b', '#e377c2', '#17becf', '#bcbd22',
    '#7f7f7f', '#393b79', '#637939', '#8c6d31'];
  var UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]); }
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtBytes(b) {
    var v = b, i = 0;
    while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
    return i === 0 ? b + ' B' : v.toFixed(2) + ' ' + UNITS[i];
  }
  // Byte axis: ticks at multiples of 1, 2 or 5 (or 2.5) of the largest binary unit that fits.
  function byteTicks(max) {
    var unit = 1, name = 'B', i = 0;
    while (i < UNITS.length - 1 && max / unit >= 1024) { unit *= 1024; i++; name = UNITS[i]; }
    var span = max / unit, raw = span / 5, mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var step = [1, 2, 2.5, 5, 10].map(function (m) { return m * mag; }).find(function (s) { return s >= raw; });
    var t = [];
    for (var v = 0; v <= span * 1.0001; v += step) t.push({ v: v * unit, label: +v.toFixed(6) + ' ' + name });
    return t;
  }
  function eventTicks(lo, hi) {
    var raw = (hi - lo) / 8, mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var step = Math.max(1, [1, 2, 5, 10].map(function (m) { return m * mag; })
      .find(function (s) { return s >= raw; }));
    var t = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi; v += step) t.push(v);
    return t;
  }
  // Index of the point of `pts` (increasing events) nearest to event `x`.
  function nearest(pts, x) {
    var lo = 0, hi = pts.length - 1;
    if (hi < 0) return -1;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (pts[mid].event < x) lo = mid + 1; else hi = mid;
    }
    if (lo > 0 && Math.abs(pts[lo - 1].event - x) <= Math.abs(pts[lo].event - x)) lo--;
    return lo;
  }

  var data = JSON.parse(document.getElementById('gpuheap-data').textContent);
  var chart = document.getElementById('chart');
  var tooltip = document.getElementById('tooltip');
  var legend = document.getElementById('legend');
  var series = data.series;
  var hidden = series.map(function () { return false; });
  var drawn = null;

  var lo = Infinity, hi = -Infinity, top = 0;
  series.forEach(function (s) {
    s.points.forEach(function (p) {
      lo = Math.min(lo, p.event); hi = Math.max(hi, p.event);
      top = Math.max(top, p.allocated, p.reserved);
    });
  });
  data.markers.forEach(function (m) {
    lo = Math.min(lo, m.event); hi = Math.max(hi, m.event);
    if (m.bytes !== null && m.bytes !== undefined) top = Math.max(top, m.bytes);
  });
  if (!isFinite(lo)) { lo = 0; hi = 1; }
  if (hi <= lo) { hi = lo + 1; }
  if (top <= 0) top = 1;
  var yTicks = byteTicks(top * 1.05);
  var yTop = Math.max(top * 1.05, yTicks[yTicks.length - 1].v);

  var M = { left: 86, right: 16, top: 10, gap: 34, bottom: 34 };
  var H1 = 340, H2 = 130;

  function draw() {
    chart.querySelectorAll('svg').forEach(function (n) { n.remove(); });
    var W = Math.max(640, chart.clientWidth || 1000);
    var pw = W - M.left - M.right;
    var y2top = M.top + H1 + M.gap;
    var svg = el('svg', { width: W, height: y2top + H2 + M.bottom, viewBox: '0 0 ' + W + ' ' + (y2top + H2 + M.bottom),
      role: 'img', 'aria-label': 'timeline of allocated and reserved bytes' }, chart);
    var X = function (e) { return M.left + (e - lo) / (hi - lo) * pw; };
    var Xinv = function (px) { return lo + (px - M.left) / pw * (hi - lo); };
    var Y = function (b) { return M.top + H1 - b / yTop * H1; };
    var Yinv = function (py) { return (M.top + H1 - py) / H1 * yTop; };
    var F = function (f) { return y2top + H2 - f * H2; };
    var Finv = function (py) { return (y2top + H2 - py) / H2; };

    var grid = el('g', { 'class': 'grid' }, svg), axis = el('g', { 'class': 'axis' }, svg);
    yTicks.forEach(function (t) {
      el('line', { x1: M.left, x2: W - M.right, y1: Y(t.v), y2: Y(t.v) }, grid);
      el('text', { x: M.left - 6, y: Y(t.v) + 4, 'text-anchor': 'end' }, axis).textContent = t.label;
    });
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
      el('line', { x1: M.left, x2: W - M.right, y1: F(f), y2: F(f) }, grid);
      el('text', { x: M.left - 6, y: F(f) + 4, 'text-anchor': 'end' }, axis).textContent = f.toFixed(2);
    });
    eventTicks(lo, hi).forEach(function (e) {
      el('line', { x1: X(e), x2: X(e), y1: y2top + H2, y2: y2top + H2 + 5 }, axis);
      el('line', { x1: X(e), x2: X(e), y1: M.top + H1, y2: M.top + H1 + 5 }, axis);
      el('text', { x: X(e), y: y2top + H2 + 18, 'text-anchor': 'middle' }, axis).textContent = String(e);
    });
    el('path', { d: 'M' + M.left + ' ' + M.top + 'V' + (M.top + H1) + 'H' + (W - M.right), fill: 'none' }, axis);
    el('path', { d: 'M' + M.left + ' ' + y2top + 'V' + (y2top + H2) + 'H' + (W - M.right), fill: 'none' }, axis);
    el('text', { 'class': 'title', x: M.left + 4, y: M.top + 12 }, svg).textContent = 'bytes';
    el('text', { 'class': 'title', x: M.left + 4, y: y2top + 12 }, svg).textContent = 'external fragmentation';
    el('text', { 'class': 'title', x: W - M.right, y: y2top + H2 + 32, 'text-anchor': 'end' }, svg)
      .textContent = 'event';

    var out = [];
    series.forEach(function (s, i) {
      var c = COLORS[i % COLORS.length];
      var g = el('g', { 'data-series': i }, svg);
      if (hidden[i]) g.setAttribute('display', 'none');
      var line = function (pts, f, attrs, metric, panel) {
        var a = { points: pts.map(function (p) { return X(p.event).toFixed(2) + ',' + f(p).toFixed(2); }).join(' '),
          fill: 'none', stroke: c, 'data-metric': metric };
        for (var k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) a[k] = attrs[k]; }
        return el('polyline', a, panel);
      };
      var withFrag = s.points.filter(function (p) { return p.fragmentation !== null && p.fragmentation !== undefined; });
      var lr = line(s.points, function (p) { return Y(p.reserved); }, { 'stroke-width': 1.6 }, 'reserved', g);
      var la = line(s.points, function (p) { return Y(p.allocated); }, { 'stroke-width': 1.1,
        'stroke-dasharray': '5 3' }, 'allocated', g);
      var lf = line(withFrag, function (p) { return F(p.fragmentation); }, { 'stroke-width': 1.1 }, 'fragmentation', g);
      out.push({ reserved: lr, allocated: la, fragmentation: lf });
    });

    var marks = el('g', { 'class': 'markers' }, svg);
    var markersDrawn = [];
    data.markers.forEach(function (m) {
      if (m.series !== null && m.series !== undefined && hidden[m.series]) return;
      var b = m.bytes;
      if (b === null || b === undefined) {
        var s = m.series !== null && m.series !== undefined ? series[m.series] : null;
        var k = s ? nearest(s.points, m.event) : -1;
        b = k >= 0 ? s.points[k].reserved : yTop;
      }
      var x = X(m.event), y = Y(b), shape;
      var c = m.series !== null && m.series !== undefined ? COLORS[m.series % COLORS.length] : '#444';
      if (m.kind === 'oom') {
        shape = el('path', { d: 'M' + (x - 5) + ' ' + (y - 9) + 'L' + (x + 5) + ' ' + (y - 9) + 'L' + x + ' ' + y + 'Z',
          fill: '#d62728', stroke: c, 'stroke-width': 1 }, marks);
        el('line', { x1: x, x2: x, y1: y2top, y2: y2top + H2, stroke: '#d62728', 'stroke-opacity': 0.35 }, marks);
      } else {
        shape = el('circle', { cx: x, cy: y, r: 4.5, fill: '#ff9f1c', stroke: c, 'stroke-width': 1.2 }, marks);
      }
      el('title', {}, shape).textContent = m.label;
      markersDrawn.push({ kind: m.kind, event: m.event, bytes: b });
    });

    var cross = el('line', { y1: M.top, y2: y2top + H2, stroke: '#555', 'stroke-dasharray': '2 2', display: 'none' }, svg);
    var dots = el('g', {}, svg);
    var overlay = el('rect', { x: M.left, y: M.top, width: pw, height: y2top + H2 - M.top, fill: 'transparent' }, svg);

    function showAt(ev, px, py) {
      var lines = [], first = true;
      while (dots.firstChild) dots.removeChild(dots.firstChild);
      var shownEvent = null;
      series.forEach(function (s, i) {
        if (hidden[i]) return;
        var k = nearest(s.points, ev);
        if (k < 0) return;
        var p = s.points[k];
        if (first) { shownEvent = p.event; lines.push('event ' + p.event); first = false; }
        var f = p.fragmentation === null || p.fragmentation === undefined ? 'n/a' : p.fragmentation.toFixed(3);
        lines.push(s.name + ': allocated ' + fmtBytes(p.allocated) + ' (' + p.allocated + ' B), reserved ' +
          fmtBytes(p.reserved) + ' (' + p.reserved + ' B), fragmentation ' + f +
          (p.event !== shownEvent ? ' [event ' + p.event + ']' : ''));
        el('circle', { cx: X(p.event), cy: Y(p.reserved), r: 3, fill: COLORS[i % COLORS.length] }, dots);
      });
      var near = (hi - lo) / pw * 6;
      data.markers.forEach(function (m) {
        if (Math.abs(m.event - ev) <= near) lines.push((m.kind === 'oom' ? 'OOM: ' : 'compaction: ') + m.label);
      });
      if (!lines.length) { hide(); return ''; }
      var cx = shownEvent !== null ? X(shownEvent) : X(ev);
      cross.setAttribute('x1', cx); cross.setAttribute('x2', cx); cross.setAttribute('display', '');
      tooltip.textContent = lines.join('\n');
      tooltip.hidden = false;
      var r = chart.getBoundingClientRect();
      var tx = (px === undefined ? cx : px) + 14, ty = (py === undefined ? M.top + 20 : py) + 14;
      if (tx + tooltip.offsetWidth > r.width) tx = Math.max(0, tx - tooltip.offsetWidth - 28);
      tooltip.style.left = (r.left + window.scrollX + tx) + 'px';
      tooltip.style.top = (r.top + window.scrollY + ty) + 'px';
      return tooltip.textContent;
    }
    function hide() {
      cross.setAttribute('display', 'none');
      while (dots.firstChild) dots.removeChild(dots.firstChild);
      tooltip.hidden = true;
    }
    overlay.addEventListener('mousemove', function (e) {
      var r = svg.getBoundingClientRect();
      showAt(Xinv(e.clientX - r.left), e.clientX - r.left, e.clientY - r.top);
    });
    overlay.addEventListener('mouseleave', hide);
    drawn = { lines: out, markers: markersDrawn, showAt: showAt, hide: hide, overlay: overlay, X: X, Xinv: Xinv,
      Yinv: Yinv, Finv: Finv };
  }

  series.forEach(function (s, i) {
    var label = document.createElement('label');
    var box = document.createElement('input');
    box.type = 'checkbox'; box.checked = true;
    box.addEventListener('change', function () { hidden[i] = !box.checked; draw(); });
    var sw = document.createElement('span');
    sw.className = 'swatch'; sw.style.background = COLORS[i % COLORS.length];
    label.appendChild(box); label.appendChild(sw);
    var note = s.points.length < s.source_points ? ' (' + s.points.length + ' of ' + s.source_points + ' points)' : '';
    label.appendChild(document.createTextNode(s.name + note));
    legend.appendChild(label);
  });
  draw();
  var pending = null;
  window.addEventListener('resize', function () { clearTimeout(pending); pending = setTimeout(draw, 100); });

  if (location.hash === '#selftest') {
    var back = function (poly, inv) {
      var a = poly.getAttribute('points');
      return a ? a.split(' ').map(function (xy) {
        var v = xy.split(',');
        return [drawn.Xinv(+v[0]), inv(+v[1])];
      }) : [];
    };
    var result = {
      series: series.map(function (s, i) {
        return {
          name: s.name,
          source_points: s.source_points,
          points: s.points.map(function (p) { return [p.event, p.allocated, p.reserved, p.fragmentation]; }),
          reserved_vertices: back(drawn.lines[i].reserved, drawn.Yinv),
          allocated_vertices: back(drawn.lines[i].allocated, drawn.Yinv),
          fragmentation_vertices: back(drawn.lines[i].fragmentation, drawn.Finv)
        };
      }),
      y_top: yTop,
      markers: drawn.markers,
      tooltip: null,
      hover_tooltip: null,
      errors: errors
    };
    var s0 = series.find(function (s) { return s.points.length > 0; });
    if (s0) {
      var peak = s0.points.reduce(function (a, p) { return p.reserved > a.reserved ? p : a; });
      result.tooltip = { event: peak.event, text: drawn.showAt(peak.event) };
      // A real mouse event over the plot: the handler must show a tooltip too.
      var r = drawn.overlay.getBoundingClientRect();
      drawn.overlay.dispatchEvent(new MouseEvent('mousemove', { clientX: r.left + r.width / 2,
        clientY: r.top + 20, bubbles: true }));
      result.hover_tooltip = tooltip.hidden ? null : tooltip.textContent;
      drawn.hide();
    }
    var pre = document.createElement('pre');
    pre.id = 'gpuheap-selftest';
    pre.hidden = true;
    pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  }
})();
