"""The reference Avalon ships for a config (`eta.shipped_record`): a machine that never ran the
config forecasts a fresh run from it (every line within 2x on fake clocks, no guessed `~`), its
own record takes over once it has one, a killed or resumed run is refused as a reference, and
the smoke config (`configs/toy_org.py:smoke`) has a reference for its current key."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from avalon.train import eta
from avalon.train.config import describe, from_config_dict
from experiments.bench.progress_eta import score
from tests.train.progress_sim import play
from tests.train.test_progress_replay import EARLIER, LOADED, RESUMED, SMOKE, _off

REPO = Path(__file__).resolve().parents[2]


def _shipped(tmp_path, monkeypatch) -> str:
    """A reference shipped from one earlier fresh run of the config (on its own machine)."""
    play(str(tmp_path / "reference"), EARLIER, **SMOKE,
         timings=str(tmp_path / "reference_machine" / "k.jsonl"))
    monkeypatch.setattr(eta, "SHIPPED_DIR", str(tmp_path / "shipped"))
    return eta.ship(tmp_path / "reference" / eta.RUN_RECORD, {"smoke": True}, devices="1xcpu/1")


def test_a_machine_without_a_record_forecasts_from_the_shipped_reference(tmp_path, monkeypatch):
    shipped = _shipped(tmp_path, monkeypatch)
    assert shipped == eta.shipped_record({"smoke": True}, devices="1xcpu/1")
    empty = str(tmp_path / "machine" / "k.jsonl")
    lines, end = play(str(tmp_path / "run"), LOADED, **SMOKE, timings=empty, shipped=shipped)
    s = score(lines, end)
    assert s["untimed_lines"] == 0 and s["full_eta_lines"] >= 60
    assert _off(s["rows"]) == []
    assert not any("~" in text for _, text in lines)
    # The machine's own record is written as it runs and is read in preference next time.
    assert eta.read_record(empty)
    without, _ = play(str(tmp_path / "guessed"), LOADED, **SMOKE,
                      timings=str(tmp_path / "other" / "k.jsonl"))
    assert any("~" in text for _, text in without)  # no record, no reference: a guess


def test_only_one_fresh_invocation_is_shipped(tmp_path, monkeypatch):
    monkeypatch.setattr(eta, "SHIPPED_DIR", str(tmp_path / "shipped"))
    run = str(tmp_path / "run")
    play(run, LOADED, **SMOKE, kill_at_rl=3)
    play(run, RESUMED, **SMOKE, sft_done=4)
    with pytest.raises(ValueError, match="not one fresh invocation"):
        eta.ship(Path(run) / eta.RUN_RECORD, {"smoke": True}, devices="1xcpu/1")


def test_a_reference_of_several_runs_forecasts_each_unit_by_their_median(tmp_path, monkeypatch):
    """Three fresh runs shipped together: each unit's forecast is the median of the three, so
    the one run whose finish took 2.5x the others' does not set it."""
    monkeypatch.setattr(eta, "SHIPPED_DIR", str(tmp_path / "shipped"))
    finishes = (0.7, 1.8, 0.8)
    records = []
    for k, finish in enumerate(finishes):
        run = tmp_path / f"run{k}"
        play(str(run), EARLIER.scaled(work=1.0 + 0.1 * k, compiled=1.0) if k else EARLIER,
             **SMOKE)
        lines = [json.loads(line) for line in (run / eta.RUN_RECORD).read_text().splitlines()]
        for line in lines:
            if line["phase"] == "finish":
                line["work_s"] = finish
        (run / eta.RUN_RECORD).write_text("".join(json.dumps(x) + "\n" for x in lines))
        records.append(run / eta.RUN_RECORD)
    path = eta.ship(records, {"smoke": True}, devices="1xcpu/1")
    units = eta.read_record(path)
    assert len({t.invocation for t in units}) == 3
    reference = eta.Reference(shipped=units)
    assert reference.work_of("finish", 0) == 0.8
    sft1 = sorted(t.work_s for t in units if (t.phase, t.ordinal) == ("sft", 1))
    assert reference.work_of("sft", 1) == sft1[1]
    with pytest.raises(ValueError, match="not one fresh invocation"):
        eta.ship([records[0], tmp_path / "missing" / eta.RUN_RECORD], {"smoke": True},
                 devices="1xcpu/1")


def test_the_smoke_config_has_a_reference_for_its_key():
    """A change to what the smoke config runs changes its key; record the reference again:
    AVALON_TIMINGS_DIR=$(mktemp -d) python -m experiments.bench.progress_eta
    --workdir=$(mktemp -d)/run --ship_reference --runs=3 -- --config=configs/toy_org.py:smoke"""
    spec = importlib.util.spec_from_file_location("toy_org", REPO / "configs" / "toy_org.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("smoke")
    description = json.loads(json.dumps(describe(from_config_dict(c, num_devices=1), c.env)))
    path = eta.shipped_record(description, devices="1xcpu/1")
    assert Path(path).exists(), (
        f"no shipped ETA reference for the smoke config ({Path(path).name}); record it with "
        "the command in this test's docstring")
    units = eta.read_record(path)
    assert {t.phase for t in units} >= {"teacher", "sft", "eval", "rl", "finish"}
