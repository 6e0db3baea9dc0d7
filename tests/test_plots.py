"""Every plot function draws what it says (inspected through matplotlib) and writes a file;
the plot commands reject unknown tasks and metrics with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import assert_one_line_error, fixed_profile, make_trace, run
from typer.testing import CliRunner

from simulator import plots
from simulator.cli import app

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
runner = CliRunner()


@pytest.fixture(scope="module")
def log() -> pd.DataFrame:
    trace = make_trace([(0, ["a", "a"]), (1, ["b"]), (2, ["a", "b"]), (6, ["a"])])
    return run(trace, fixed_profile(a=3.0, b=1.0), max_batch=2, flush=0.5, gpus=2)


def test_cdf_lines_markers_slo_and_file(tmp_path, log):
    path = tmp_path / "cdf.svg"
    fig = plots.latency_cdf({"one": log, "two": log}, task="a", slo=4.0, log_x=True, path=path)
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("latency (s)") and ax.get_xscale() == "log"
    assert ax.get_ylabel() == "fraction of prompts"
    # per run: the CDF step line and its percentile markers; then the SLO line
    assert len(ax.lines) == 2 * 2 + 1
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["one", "two", "SLO 4 s"]
    assert path.stat().st_size > 1000 and path.read_text().lstrip().startswith("<?xml")


def test_timeline_panels(tmp_path, log):
    path = tmp_path / "t.png"
    fig = plots.timeline(log, "t", path)
    q_ax, g_ax, u_ax = fig.axes
    assert len(q_ax.lines) == log["queue"].nunique()
    assert len(g_ax.patches) == log["batch_id"].nunique()           # one bar per batch
    assert [t.get_text() for t in g_ax.get_yticklabels()] == ["GPU 0", "GPU 1"]
    assert u_ax.get_ylabel() == "GPUs busy" and u_ax.get_xlabel() == "time (s)"
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_batch_sizes_and_decomposition(tmp_path, log):
    fig = plots.batch_sizes(log, path=tmp_path / "b.png")
    ax = fig.axes[0]
    sizes = log.groupby("batch_id")["batch_size"].first()
    assert len(ax.patches) == 2 * sizes.max()        # a bar per task and size
    assert ax.get_xlabel() == "batch size (prompts)"
    fig = plots.latency_decomposition(log, path=tmp_path / "d.png")
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 2                   # wait and service bars for each task
    heights = [p.get_height() for p in ax.patches]
    wait = (log["started_at"] - log["arrived_at"]).groupby(log["task"]).mean()
    assert heights[:2] == pytest.approx(wait.sort_index().tolist())


def test_sweep_plots():
    agg = pd.DataFrame({"flush": [0, 0, 1, 1] * 2, "max_batch": [1, 4] * 4,
                        "topology": ["shared"] * 4 + ["split"] * 4, "mean": np.arange(8.0), "ci95": 0.1, "n": 3})
    fig = plots.heatmap_panels(agg, "overall.latency.p95", "flush", "max_batch", "topology", "t")
    assert [ax.get_title() for ax in fig.axes[:2]] == ["topology = shared", "topology = split"]
    assert fig.axes[2].get_ylabel() == "overall latency p95 (s)"      # the colour bar
    fig = plots.lines(agg[agg.topology == "shared"], "flush", "tasks.a.wait.mean", "t", group="max_batch")
    ax = fig.axes[0]
    assert len(ax.lines) == 2 and len(ax.collections) == 2          # a line and a CI band per group
    assert ax.get_ylabel() == "a wait mean (s)"


def test_plot_commands(tmp_path):
    # The bundled trace's first 30 calls (all three tasks): the commands and their files are
    # what is checked here, and a short run draws them in a fraction of the time.
    trace = tmp_path / "head.json"
    trace.write_text(json.dumps(json.loads(TRACE.read_text())[:30]))
    events = tmp_path / "run.parquet"
    result = runner.invoke(app, ["replay", str(trace), "--events", str(events), "--plot", str(tmp_path / "figs")])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == [
        "batch_sizes.png", "cdf.png", "decomposition.png", "timeline.png"]
    for verb in ("timeline", "batches", "decomposition"):
        out = tmp_path / f"{verb}.png"
        assert runner.invoke(app, ["plot", verb, str(events), "-o", str(out)]).exit_code == 0
        assert out.stat().st_size > 1000
    assert runner.invoke(app, ["plot", "cdf", str(events), str(events), "--task", "mmlu",
                               "-o", str(tmp_path / "c.png")]).exit_code == 0
    assert_one_line_error(runner.invoke(app, ["plot", "cdf", str(events), "--task", "chat", "-o", str(tmp_path / "x.png")]),
                          "chat", "graph, infobench, mmlu")
    assert_one_line_error(runner.invoke(app, ["plot", "cdf", str(events), "-o", str(tmp_path / "x.jpg")]), ".png")
    sweep = tmp_path / "s.parquet"
    assert runner.invoke(app, ["sweep", str(trace), "--flush", "0,2", "--max-batch", "4,10", "--topology",
                               "shared,split", "--rate-scale", "1,2", "--out", str(sweep)]).exit_code == 0
    assert runner.invoke(app, ["plot", "heatmap", str(sweep), "--where", "rate_scale=1.0",
                               "-o", str(tmp_path / "h.png")]).exit_code == 0
    assert_one_line_error(runner.invoke(app, ["plot", "heatmap", str(sweep), "--where", "rate_scale=1.0",
                                              "--metric", "overall.speed", "-o", str(tmp_path / "h2.png")]),
                          "overall.speed")
    assert runner.invoke(app, ["plot", "load", str(sweep), "--group", "topology", "--where", "flush=0.0",
                               "--where", "max_batch=10", "-o", str(tmp_path / "l.png")]).exit_code == 0
    assert_one_line_error(runner.invoke(app, ["plot", "load", str(sweep), "-o", str(tmp_path / "l2.png")]),
                          "also varies")


# -- readable figures ---------------------------------------------------------------------


def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _heatmap_agg() -> pd.DataFrame:
    """Two panels where a few cells are 20× the rest (a backlog), as sweeps of a real trace give."""
    rows = []
    for topology in ("shared", "split"):
        for flush in (0.0, 0.5, 5.0):
            for mb in (2, 8):
                rows.append({"topology": topology, "flush": flush, "max_batch": mb,
                             "mean": 3900.0 if (mb == 2 and flush == 0.0) else 150.0 + flush + mb})
    return pd.DataFrame(rows)


def test_heatmap_numbers_are_readable_and_outliers_do_not_flatten_the_scale(tmp_path):
    fig = plots.heatmap_panels(_heatmap_agg(), "tasks.infobench.latency.p95", "flush", "max_batch", "topology",
                               "t", tmp_path / "h.png")
    cells = [t.get_text() for ax in fig.axes[:2] for t in ax.texts]
    assert "3,900" in cells and "158" in cells
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    assert not any("e+" in t or "e-" in t for t in ticks + cells), ticks
    image = fig.axes[0].images[0]
    norm = image.norm
    # the ordinary cells (150–163 s) span the colour range instead of sitting in its bottom 4 %
    assert norm(163.0) - norm(152.0) > 0.2
    # panel titles do not overlap each other
    renderer = _renderer(fig)
    a, b = (ax.title.get_window_extent(renderer) for ax in fig.axes[:2])
    assert not a.overlaps(b)


def test_decomposition_legend_covers_no_bar(tmp_path, log):
    fig = plots.latency_decomposition(log, path=tmp_path / "d.png")
    renderer = _renderer(fig)
    legend = fig.axes[0].get_legend().get_window_extent(renderer)
    for bar in fig.axes[0].patches:
        assert not legend.overlaps(bar.get_window_extent(renderer))


def test_timeline_of_a_long_run_shows_a_window(tmp_path):
    trace = make_trace([(3.0 * i, ["a"]) for i in range(2000)])
    long_log = run(trace, fixed_profile(a=1.0), gpus=2)
    fig = plots.timeline(long_log, "Timeline", tmp_path / "t.png")
    assert "first 200 of 2,000 calls" in fig.axes[0].get_title()
    assert len(fig.axes[1].patches) < 250   # batches of the window only, not of the whole run


def test_cdf_takes_a_label_per_input(tmp_path, log):
    events = tmp_path / "dn.parquet"
    from simulator.events import write_event_log

    write_event_log(log, events)
    out = tmp_path / "c.png"
    result = runner.invoke(app, ["plot", "cdf", str(events), str(events), "--label", "design notes",
                                 "--label", "defaults", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert_one_line_error(runner.invoke(app, ["plot", "cdf", str(events), "--label", "a", "--label", "b",
                                              "-o", str(tmp_path / "x.png")]), "--label", "one per input")


@pytest.mark.parametrize("verb", ["cdf", "timeline", "batches", "decomposition"])
def test_plots_given_a_sweep_results_file_say_what_it_is(tmp_path, verb):
    sweep = tmp_path / "s.parquet"
    assert runner.invoke(app, ["sweep", str(TRACE), "--flush", "0", "-j", "1", "-o", str(sweep)]).exit_code == 0
    assert_one_line_error(runner.invoke(app, ["plot", verb, str(sweep), "-o", str(tmp_path / "f.png")]),
                          "sweep results file, not an event log", "simctl compare")
    assert_one_line_error(runner.invoke(app, ["compare-runs", str(sweep), str(sweep)]),
                          "sweep results file, not an event log")
