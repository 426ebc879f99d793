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
 * What the step charts share: a uPlot in `figure` (a <figure> whose <figcaption> stays on top) that
 * follows the figure's width, the steps' rows (a step seen again replaces its row), a redraw once
 * per animation frame at most, and the figure's data-points (how many steps it holds). A subclass
 * says which rows it takes (`takes`) and what it draws of them (`columns`).
 */
class StepPlot {
  constructor(figure, options, seriesCount, height) {
    this.figure = figure;
    this.rows = new Map(); // step -> its row
    this.pending = false;
    const width = Math.max(240, figure.clientWidth - 8);
    this.plot = new uPlot({ width, height, ...options }, [[], ...Array.from({ length: seriesCount }, () => [])],
      figure);
    new ResizeObserver(() => {
      const w = Math.max(240, this.figure.clientWidth - 8);
      if (Math.abs(w - this.plot.width) > 2) this.plot.setSize({ width: w, height });
    }).observe(figure);
  }

  takes() {
    return true;
  }

  /** Put one step's row in; the chart redraws once per animation frame at most. */
  add(step, row) {
    if (!this.takes(row)) return;
    this.rows.set(step, row);
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => this.draw());
    }
  }

  draw() {
    this.pending = false;
    const steps = [...this.rows.keys()].sort((a, b) => a - b);
    this.plot.setData([steps, ...this.columns(steps)]);
    this.figure.dataset.points = String(steps.length);
  }
}

/**
 * A chart of metrics by step. `series`: [{key: "reward_mean", label: "reward"}, ...]; add(step,
 * data) puts a step's values in. `fraction`: the values are fractions (rewards, accuracies), drawn
 * on 0..1 whatever they are.
 */
export class StepChart extends StepPlot {
  constructor(figure, series, { height = 180, fraction = false } = {}) {
    super(figure, {
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
    }, series.length, height);
    this.series = series;
  }

  takes(data) {
    return this.series.some((s) => typeof data[s.key] === "number");
  }

  columns(steps) {
    return this.series.map((s) => steps.map((step) => {
      const v = this.rows.get(step)[s.key];
      return typeof v === "number" ? v : null;
    }));
  }
}

/**
 * A stacked bar a step: where the step's wall time went, phase by phase (`phases`: the keys of a
 * ``timings`` event, in the order they are stacked from the bottom). add(step, timings) puts a
 * step's seconds in; the legend shows each phase's own seconds, not the running sum.
 */
export class PhaseChart extends StepPlot {
  constructor(figure, phases, { height = 200 } = {}) {
    const bars = uPlot.paths.bars({ size: [0.8, 40] });
    // drawn top of the stack first, so each later (lower) bar covers all but its own segment
    const order = [...phases].reverse();
    super(figure, {
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
    }, order.length, height);
    this.phases = phases;
    this.order = order;
  }

  columns(steps) {
    return this.order.map((phase) => {
      const below = this.phases.slice(0, this.phases.indexOf(phase) + 1);
      return steps.map((step) => below.reduce((sum, p) => sum + (this.rows.get(step)[p] || 0), 0));
    });
  }
}
