// Line charts of per-step metrics on uPlot (vendored, frontend/static/vendor/uplot/).
import uPlot from "../vendor/uplot/uPlot.esm.js";

const COLORS = ["#1f5fbf", "#c2410c", "#15803d", "#7e22ce"];

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
