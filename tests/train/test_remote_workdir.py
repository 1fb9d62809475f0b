"""A run whose workdir is a `gs://` URL writes everything there, and resumes from there.

The bucket is served on loopback by `gcp-storage-emulator` (an in-memory server of the GCS JSON
API); the run reaches it through the real clients of a pod run: `gcsfs` (what `etils.epath`
uses for gs://, pointed at the emulator by STORAGE_EMULATOR_HOST) and tensorstore's GCS driver
(orbax's array data, pointed at it by TENSORSTORE_GCS_HTTP_URL). No network is used.

The emulator does not implement the conditional writes of OCDBT's manifest, so the run writes
one zarr store per array (`checkpoint.ocdbt=False`); the gs:// path handling is the same. (The
Go fake-gcs-server serves OCDBT, but gcsfs stops getting answers from it after ~100 requests.)
Slow: two micro runs of `avalon.main` (tests/train/micro_config.py).
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from avalon import paths
from avalon.train import run_dir
from avalon.train.telemetry import Telemetry
from tests.train.runner import CACHE, REPO, environment

BUCKET = "avalon-test"
_HAVE_GCS = all(importlib.util.find_spec(m) is not None
                for m in ("gcsfs", "gcp_storage_emulator"))
_NEEDS_GCS = pytest.mark.skipif(not _HAVE_GCS, reason="needs gcsfs and gcp-storage-emulator: "
                                "pip install '.[test]'")


def test_gs_urls_stay_urls():
    """The old layer (`Path(p).absolute()`) made gs://b/run into /cwd/gs:/b/run."""
    assert os.fspath(paths.path("gs://b/run")) == "gs://b/run"
    assert os.fspath(paths.join("gs://b/run", "checkpoints", "7")) == "gs://b/run/checkpoints/7"
    assert paths.is_remote("gs://b/run") and not paths.is_remote("runs/toy")
    assert os.fspath(paths.path("runs/toy")) == os.path.join(os.getcwd(), "runs", "toy")
    assert os.fspath(Telemetry("gs://b/run", enabled=False).path) == "gs://b/run/metrics.jsonl"
    run, ckpts, step = run_dir.resolve("gs://b/run/checkpoints/7")
    assert (os.fspath(run), os.fspath(ckpts), step) == ("gs://b/run", "gs://b/run/checkpoints", 7)
    with pytest.raises(ValueError, match=r"'ftp://h/run': unknown URL scheme"):
        paths.path("ftp://h/run")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gcs(monkeypatch):
    """A fresh loopback GCS server holding the test bucket; the env that points clients at it."""
    from gcp_storage_emulator.server import create_server
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           # gcsfs's bucket-layout probe speaks gRPC, which the emulator does not.
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield env
    server.stop()


def _pythonpath() -> str:
    """This checkout first: the run's cwd is an empty directory, not the repository."""
    return os.pathsep.join([REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p])


def _main(workdir, cwd, env):
    r = subprocess.run([sys.executable, "-m", "avalon.main",
                        f"--config={REPO}/tests/train/micro_config.py", f"--workdir={workdir}",
                        "--config.checkpoint.ocdbt=False", "--config.plots=True",
                        f"--jax_cache_dir={CACHE}"],
                       cwd=cwd, env={**environment(), **env, "PYTHONPATH": _pythonpath()},
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


@pytest.mark.slow
@_NEEDS_GCS
def test_run_writes_and_resumes_a_gs_workdir(gcs, tmp_path):
    import gcsfs
    workdir = f"gs://{BUCKET}/runs/micro"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _main(workdir, cwd, gcs)
    assert os.listdir(cwd) == []  # nothing landed under the cwd (no ./gs:/...)
    fs = gcsfs.GCSFileSystem(token="anon")
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{BUCKET}/runs/micro")}
    assert {"metrics.jsonl", "config.json", "summary.json", "tensorboard", "checkpoints",
            "events", "reward.png", "organisation.png"} <= names, names
    # Every logged step is in metrics.jsonl and in the TensorBoard file (appends on an object
    # store are whole rewrites: none may lose the earlier lines or events).
    records = [json.loads(line) for line in
               fs.cat(f"{BUCKET}/runs/micro/metrics.jsonl").decode().splitlines()]
    logged = {r["step"] for r in records}
    assert len(logged) >= 4, logged  # after SFT, the evaluations and the RL steps
    (event_file,) = fs.ls(f"{BUCKET}/runs/micro/tensorboard")
    local = tmp_path / "events.tfevents"
    local.write_bytes(fs.cat(event_file))
    tb_steps = {e.step for e in EventFileLoader(str(local)).Load() if e.summary.value}
    assert tb_steps == logged, (tb_steps, logged)
    steps = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{BUCKET}/runs/micro/checkpoints")]
    assert any(s.isdigit() for s in steps), steps
    assert fs.find(f"{BUCKET}/runs/micro/events")  # rollout event logs and their index
    assert fs.cat(f"{BUCKET}/runs/micro/reward.png")[:8] == b"\x89PNG\r\n\x1a\n"

    # Run again: it restores the newest checkpoint from the bucket and finds the run finished.
    r = _main(workdir, cwd, gcs)
    assert "is finished" in r.stderr, r.stderr[-2000:]
