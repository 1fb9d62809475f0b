"""The toy notebook runs end to end in its smoke form (as CI runs it): nbclient executes every
cell with smoke parameters injected after the `parameters` cell (papermill's convention), and
the run it trains has its metrics, plots and event logs. Slow: a toy smoke run (several
minutes of XLA compilation on 2 cores without a warm cache)."""

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(REPO, "experiments", "notebooks", "toy_org.ipynb")


def smoke_parameters(workdir: str, cache: str) -> str:
    return (f"WORKDIR = {workdir!r}\nSMOKE = True\nJAX_CACHE_DIR = {cache!r}\n"
            "OVERRIDES = {'sft.teacher_episodes': 4, 'sft.steps': 2, 'sft.skill_steps': 1,\n"
            "             'rollout.steps': 1, 'eval.tasks': 1, 'eval.seeds': 1}\n")


def inject(nb, source: str):
    """A copy of `nb` with `source` as a new cell right after the `parameters` cell."""
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)
    return nb


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None


@pytest.mark.slow
def test_notebook_runs_in_its_smoke_form(tmp_path, monkeypatch):
    from tests.train.runner import CACHE
    monkeypatch.setenv("PYTHONPATH", REPO)  # the kernel imports this checkout's avalon
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    nb = inject(nbformat.read(NOTEBOOK, as_version=4),
                smoke_parameters(str(tmp_path / "run"), CACHE))
    client = nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)
    assert "RL step   1: organisation" in text
    assert "event logs" in text and "agents: [" in text and "trace reads" in text
    for name in ("metrics.jsonl", "reward.png", "organisation.png", "summary.json", "events"):
        assert (tmp_path / "run" / name).exists(), name
