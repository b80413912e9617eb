"""`bertkit plot` of a short run shows its points: a series of a few records is drawn with a marker
at each (a single logged step would otherwise be invisible); a long one stays a plain line."""

import json

from bertkit.train import plot


def _run(tmp_path, steps: int):
    records = [{"step": s, "loss": 1.0 / s, "learning_rate": 1e-4} for s in range(1, steps + 1)]
    records.append({"step": steps, "eval": True, "accuracy": 0.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return tmp_path


def _drawn(run_dir, monkeypatch) -> dict[str, list]:
    """figure name -> its lines, as drawn (captured just before saving)."""
    drawn, save = {}, plot._save

    def capture(fig, ax, title, path, **kw):
        drawn[path.name] = list(ax.get_lines())
        return save(fig, ax, title, path, **kw)

    monkeypatch.setattr(plot, "_save", capture)
    plot.plot_run(run_dir)
    return drawn


def test_a_one_step_run_shows_its_point(tmp_path, monkeypatch):
    drawn = _drawn(_run(tmp_path, 1), monkeypatch)
    (loss,) = drawn["loss.png"]
    assert len(loss.get_xdata()) == 1 and loss.get_marker() == "o"
    assert drawn["learning_rate.png"][0].get_marker() == "o"
    assert drawn["dev_metrics.png"][0].get_marker() == "o"
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_a_long_run_is_a_line(tmp_path, monkeypatch):
    drawn = _drawn(_run(tmp_path, 200), monkeypatch)
    assert drawn["loss.png"][0].get_marker() in (None, "None", "")
