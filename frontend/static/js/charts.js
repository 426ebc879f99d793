// Line charts of per-step metrics on uPlot (vendored, frontend/static/vendor/uplot/).
import uPlot from "../vendor/uplot/uPlot.esm.js";

const COLORS = ["#1f5fbf", "#c2410c", "#15803d", "#7e22ce", "#0e7490", "#a16207", "#be185d"];

/** A y range from 0 (or the minimum, when negative) to the maximum; a flat series (a loss or a
 * KL that stays 0) gets a small span instead of uPlot's default 0..100. */
function spanAroundZero(u, min, max) {
  const lo = Math.min(0, min ?? 0);
  const hi = Math.max(0, max ?? 0);
  return hi > lo ? [lo, hi] : [lo, lo + 1];
}

/**
 * A chart of metrics by step, drawn into `figure` (a <figure> whose <figcaption> stays on top).
 * `series`: [{key: "reward_mean", label: "reward"}, ...]. add(step, data) puts a step's values in
 * (a step seen again replaces the old values); the figure's data-points says how many steps it holds.
 * `fraction`: the values are fractions (rewards, accuracies), drawn on 0..1 whatever they are.
 */
export class StepChart {
  constructor(figure, series, { height = 180, fraction = false } = {}) {
    this.figure = figure;
    this.series = series;
    this.rows = new Map(); // step -> data
    this.pending = false;
    const width = Math.max(240, figure.clientWidth - 8);
    this.plot = new uPlot(
      {
        width,
        height,
        scales: { x: { time: false }, y: { range: fraction ? [0, 1] : spanAroundZero } },
        legend: { live: true },
        axes: [{ label: "step" }, { size: 56 }],
        series: [
          { label: "step" },
          ...series.map((s, i) => ({
            label: s.label,
            stroke: COLORS[i % COLORS.length],
            width: 2,
            spanGaps: true, // evaluation metrics arrive every few steps only
            value: (u, v) => (v == null ? "–" : v.toFixed(4)),
          })),
        ],
      },
      [[], ...series.map(() => [])],
      figure,
    );
    new ResizeObserver(() => {
      const w = Math.max(240, this.figure.clientWidth - 8);
      if (Math.abs(w - this.plot.width) > 2) this.plot.setSize({ width: w, height });
    }).observe(figure);
  }

  /** Put one step's metrics in; the chart redraws once per animation frame at most. */
  add(step, data) {
    if (!this.series.some((s) => typeof data[s.key] === "number")) return;
    this.rows.set(step, data);
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => this.draw());
    }
  }

  draw() {
    this.pending = false;
    const steps = [...this.rows.keys()].sort((a, b) => a - b);
    const columns = this.series.map((s) =>
      steps.map((step) => {
        const v = this.rows.get(step)[s.key];
        return typeof v === "number" ? v : null;
      }),
    );
    this.plot.setData([steps, ...columns]);
    this.figure.dataset.points = String(steps.length);
  }
}

/**
 * A stacked bar a step: where the step's wall time went, phase by phase (`phases`: the keys of a
 * ``timings`` event, in the order they are stacked from the bottom). add(step, timings) puts a
 * step's seconds in; the legend shows each phase's own seconds, not the running sum; the figure's
 * data-points says how many steps it holds.
 */
export class PhaseChart {
  constructor(figure, phases, { height = 200 } = {}) {
    this.figure = figure;
    this.phases = phases;
    this.rows = new Map(); // step -> timings
    this.pending = false;
    const bars = uPlot.paths.bars({ size: [0.8, 40] });
    // drawn top of the stack first, so each later (lower) bar covers all but its own segment
    const order = [...phases].reverse();
    this.plot = new uPlot(
      {
        width: Math.max(240, figure.clientWidth - 8),
        height,
        scales: { x: { time: false }, y: { range: spanAroundZero } },
        legend: { live: true },
        axes: [{ label: "step" }, { size: 56, label: "seconds" }],
        series: [
          { label: "step" },
          ...order.map((phase) => ({
            label: phase,
            fill: COLORS[phases.indexOf(phase) % COLORS.length] + "cc",
            stroke: COLORS[phases.indexOf(phase) % COLORS.length],
            paths: bars,
            points: { show: false },
            value: (u, v, s, i) => (i == null ? "–" : (this.rows.get(u.data[0][i])?.[phase] ?? 0).toFixed(3)),
          })),
        ],
      },
      [[], ...order.map(() => [])],
      figure,
    );
    this.order = order;
  }

  add(step, timings) {
    this.rows.set(step, timings);
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => this.draw());
    }
  }

  draw() {
    this.pending = false;
    const steps = [...this.rows.keys()].sort((a, b) => a - b);
    const tops = this.order.map((phase) => {
      const below = this.phases.slice(0, this.phases.indexOf(phase) + 1);
      return steps.map((step) => below.reduce((sum, p) => sum + (this.rows.get(step)[p] || 0), 0));
    });
    this.plot.setData([steps, ...tops]);
    this.figure.dataset.points = String(steps.length);
  }
}
