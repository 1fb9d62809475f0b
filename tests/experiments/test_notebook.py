"""The toy notebook runs end to end as shipped (as CI runs it): nbclient executes every cell
unchanged (`SMOKE = True`: the toy's smoke config, started from the shipped seed), in a
scratch directory, and the run it trains has its metrics, plots and event logs, and the episode
it opens is an organisation (hires and messages). Slow: a toy smoke run, compiled from cold
(the notebook keeps its compilation cache in the run directory)."""

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(REPO, "experiments", "notebooks", "toy_org.ipynb")


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None


def test_the_repository_url_is_not_a_placeholder():
    """The install cell clones REPO_URL in Colab: a URL (or empty: then it asks for one in
    one line), never the OWNER placeholder it once held."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    scope = {}
    exec(params.source, scope)  # noqa: S102 (the notebook's own parameters cell)
    assert "OWNER" not in scope["REPO_URL"] and scope["SMOKE"] is True
    install = next(c.source for c in nb.cells if "git" in c.source and "clone" in c.source)
    assert "AVALON_REPO_URL" in install


@pytest.mark.slow
@pytest.mark.ci
def test_notebook_runs_as_shipped(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", REPO)  # the kernel imports this checkout's avalon
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)
    assert "RL step   3: organisation" in text
    assert "event logs" in text and "agents: [" in text and "trace reads" in text
    agents = next(line for line in text.splitlines() if line.startswith("agents: ["))
    assert agents.count("'") >= 4, agents  # the CEO and at least one hire
    run = tmp_path / "runs" / "notebook_toy"
    for name in ("metrics.jsonl", "reward.png", "organisation.png", "summary.json", "events",
                 "episode.html"):
        assert (run / name).exists(), name
