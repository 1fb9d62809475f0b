"""The launch scripts (launch/*.sh) in dry-run mode: every cloud command they would run, printed
(`+ ` lines) and checked here; a `gcloud` on PATH that records any real call proves none runs."""

import ast
import os
import shlex
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POD_ENV = {"PROJECT": "proj", "ZONE": "us-east5-a", "TPU_NAME": "avalon-v5p",
           "ACCELERATOR": "v5p-256"}


@pytest.fixture
def shell_env(tmp_path):
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "real_calls"
    for tool in ("gcloud", "gcsfuse"):
        (stub / tool).write_text(f"#!/bin/sh\necho \"$0 $*\" >> {calls}\nexit 99\n")
        (stub / tool).chmod(0o755)
    env = {**os.environ, **POD_ENV, "DRY_RUN": "1", "TMPDIR": str(tmp_path),
           "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
    yield env
    assert not calls.exists(), f"a dry run called a real tool: {calls.read_text()}"


def run(script: str, *args, env, ok: bool = True) -> tuple[list[list[str]], str]:
    """(the commands printed, in order; everything printed)."""
    r = subprocess.run(["bash", os.path.join(REPO, "launch", script), *args], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
                       cwd=REPO)
    assert (r.returncode == 0) == ok, r.stdout
    return _commands(r.stdout), r.stdout


def _commands(text: str) -> list[list[str]]:
    """The `+ ` lines as argument lists (a quoted argument may span lines)."""
    out, lines = [], iter(text.splitlines())
    for line in lines:
        if not line.startswith("+ "):
            continue
        words = line[2:]
        while True:
            try:
                out.append(shlex.split(words))
                break
            except ValueError:  # an open quote: the word goes on on the next line
                words += "\n" + next(lines)
    return out


def remote(command: list[str]) -> str:
    """The shell command an `ssh ... --command=...` runs on the workers."""
    return next(a.split("=", 1)[1] for a in command if a.startswith("--command="))


def test_create_pod_spot_by_default_on_demand_or_queued(shell_env):
    (cmd,), _ = run("create_pod.sh", env=shell_env)
    assert cmd[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]
    assert {"avalon-v5p", "--project=proj", "--zone=us-east5-a", "--accelerator-type=v5p-256",
            "--version=v2-alpha-tpuv5", "--spot"} <= set(cmd)
    (cmd,), _ = run("create_pod.sh", env={**shell_env, "SPOT": "0"})
    assert "--spot" not in cmd
    (cmd,), _ = run("create_pod.sh", env={**shell_env, "QUEUED": "1"})
    assert cmd[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
    assert {"--node-id=avalon-v5p", "--runtime-version=v2-alpha-tpuv5", "--spot"} <= set(cmd)


def test_a_missing_setting_is_one_line_naming_it(shell_env):
    env = {k: v for k, v in shell_env.items() if k != "ZONE"}
    r = subprocess.run(["bash", "launch/create_pod.sh"], env=env, capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.strip() == \
        "create_pod.sh: set ZONE (see launch/README.md)"


def test_copy_code_ships_head_and_sets_up_every_worker(shell_env):
    cmds, _ = run("copy_code.sh", env=shell_env)
    archive, scp, ssh = cmds
    assert archive[:4] == ["git", "-C", REPO, "archive"] and archive[-1] == "HEAD"
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert ssh[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"] and "--worker=all" in ssh
    assert "PYTHON_VERSION=3.11 bash ~/avalon/launch/worker_setup.sh" in remote(ssh)


def test_worker_setup_installs_python_311_and_the_pinned_pod_extra(shell_env):
    cmds, _ = run("worker_setup.sh", env={**shell_env, "HOME": "/home/w"})
    pip_uv, venv, install, check = cmds
    assert pip_uv[:4] == ["python3", "-m", "pip", "install"] and "uv" in pip_uv
    assert venv[:4] == ["/home/w/.local/bin/uv", "venv", "--python", "3.11"]
    assert venv[-1] == "/home/w/avalon/.venv"
    assert install[1:3] == ["pip", "install"] and install[-1] == "/home/w/avalon[pod]"
    assert check[0] == "/home/w/avalon/.venv/bin/python" and "0.10.2" in check[-1]
    # ... and the `pod` extra pins the jax release and its libtpu, with jinja2 and GCS.
    extras = _setup_extras()
    assert {"jax[tpu]==0.10.2", "libtpu==0.0.42.1", "jinja2", "gcsfs"} <= set(extras["pod"])


def _setup_extras() -> dict:
    tree = ast.parse(open(os.path.join(REPO, "setup.py")).read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "EXTRAS")
    return ast.literal_eval(node.value)


def test_gpu_extra_pins_the_jax_release():
    gpu = _setup_extras()["gpu"]
    assert "jax==0.10.2" in gpu and "jax-cuda12-pjrt==0.10.2" in gpu
    assert any(r.startswith("jax-cuda12-plugin") and r.endswith("==0.10.2") for r in gpu)
    assert any(r.startswith("nvidia-cuda-nvcc-cu12") for r in gpu)


def test_stage_weights_streams_through_gcsfuse_or_copies(shell_env):
    env = {**shell_env, "WEIGHTS": "gs://ckpt-bucket/models/Nemotron-Base"}
    (ssh,), _ = run("stage_weights.sh", env=env)
    script = remote(ssh)
    assert "--worker=all" in ssh
    assert "gcsfuse --implicit-dirs -o ro --only-dir=models ckpt-bucket /mnt/checkpoints" in script
    assert "test -f /mnt/checkpoints/Nemotron-Base/config.json" in script
    (ssh,), _ = run("stage_weights.sh", env={**env, "MODE": "copy", "MOUNT": "/data"})
    script = remote(ssh)
    assert "gcloud storage rsync -r gs://ckpt-bucket/models/Nemotron-Base " \
           "/data/Nemotron-Base" in script
    assert "df --output=avail" in script  # refuses a disk without room, before copying
    _, err = run("stage_weights.sh", env={**env, "WEIGHTS": "/local/dir"}, ok=False)
    assert "must be gs://BUCKET/[PREFIX/]NAME" in err


def test_env_servers_listen_where_every_worker_reaches_them(shell_env):
    cmds, out = run("serve_envs.sh", "avalon.envs.parallel:ParallelSubtasks", env=shell_env)
    ssh = cmds[0]
    assert "--worker=0" in ssh
    script = remote(ssh)
    assert "-m avalon.envs.serve --env=avalon.envs.parallel:ParallelSubtasks" in script
    assert "--host=$(hostname -I" in script and "--port=8080" in script
    assert out.strip().splitlines()[-1] == "http://10.0.0.2:8080"


def test_run_pod_starts_every_worker_with_the_flags_given(shell_env):
    (ssh,), _ = run("run_pod.sh", "configs/nemotron3_super_pod.py", "gs://b/runs/super",
                    "--config.rl.lr=1e-6", "--config.x=a b", env=shell_env)
    assert "--worker=all" in ssh
    script = remote(ssh)
    assert "vm.max_map_count=1048576" in script
    start = shlex.split(script.split("nohup ", 1)[1].split(" > ")[0])
    assert start == [".venv/bin/python", "-m", "avalon.main",
                     "--config=configs/nemotron3_super_pod.py", "--workdir=gs://b/runs/super",
                     "--distributed_auto", "--config.rl.lr=1e-6", "--config.x=a b"]


def _started(cmds) -> list[str]:
    return [c[4] if c[:4] == ["gcloud", "compute", "tpus", "tpu-vm"] else " ".join(c[:4])
            for c in cmds]


def test_supervisor_recreates_a_preempted_pod_and_resumes(shell_env):
    env = {**shell_env, "WEIGHTS": "gs://b/models/M"}
    cmds, _ = run("supervise.sh", "configs/nemotron3_super_pod.py", "gs://b/runs/super",
                  env=env)
    assert cmds[0][:3] == ["gcloud", "storage", "ls"]  # finished? (summary.json)
    assert _started(cmds[1:]) == ["describe", "delete", "create", "git -C " + REPO + " archive",
                                  "scp", "ssh", "ssh", "ssh"]
    assert "--distributed_auto" in remote(cmds[-1])  # the last ssh starts training again
    queued, _ = run("supervise.sh", "c.py", "gs://b/w", env={**shell_env, "QUEUED": "1"})
    assert queued[2][:5] == ["gcloud", "compute", "tpus", "queued-resources", "delete"]
    assert queued[3][:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
    assert len(queued) == 4  # its TPU is not there yet: nothing to copy to


def test_supervisor_sets_up_a_queued_pod_once_its_tpu_is_ready(shell_env):
    """A queued resource's create returns before the TPU exists: the supervisor waits while it
    waits for capacity, and copies, stages and starts once it is ACTIVE and its TPU READY."""
    env = {**shell_env, "QUEUED": "1", "WEIGHTS": "gs://b/models/M", "DRY_RUN_PASSES": "3",
           "DRY_RUN_QUEUED_STATE": "SUSPENDED WAITING_FOR_RESOURCES ACTIVE",
           "DRY_RUN_TPU_STATE": "READY"}
    cmds, out = run("supervise.sh", "c.py", "gs://b/w", env=env)
    passes, current = [], None
    for c in cmds:
        if c[:3] == ["gcloud", "storage", "ls"]:
            current = []
            passes.append(current)
        else:
            current.append(" ".join(c[3:5]) if c[:3] == ["gcloud", "compute", "tpus"]
                           else " ".join(c[:4]))
    assert passes == [
        ["queued-resources describe", "queued-resources delete", "queued-resources create"],
        ["queued-resources describe"],
        ["queued-resources describe", "tpu-vm describe", "git -C " + REPO + " archive",
         "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh", "tpu-vm ssh"]]
    assert "WAITING_FOR_RESOURCES; waiting" in out
    assert "--distributed_auto" in remote(cmds[-1])


def test_supervisor_survives_a_failed_step_and_retries_it(shell_env):
    """A step that fails (here staging weights from a bad address) is said, and the next pass
    sets the new TPU up again instead of starting training on a TPU without weights."""
    env = {**shell_env, "WEIGHTS": "/not/a/bucket", "DRY_RUN_PASSES": "2",
           "DRY_RUN_TPU_STATE": "PREEMPTED READY"}
    cmds, out = run("supervise.sh", "c.py", "gs://b/w", env=env)
    assert out.count("setting up the new TPU failed; retrying next pass") == 2
    assert sum(c[:2] == ["git", "-C"] for c in cmds) == 2  # the code copied again
    assert not any("avalon.main" in remote(c) for c in cmds if c[3:5] == ["tpu-vm", "ssh"]
                   and "--command" in " ".join(c))


def test_supervisor_restarts_a_stopped_run_and_leaves_a_running_or_finished_one(shell_env):
    ready = {**shell_env, "DRY_RUN_TPU_STATE": "READY"}
    cmds, _ = run("supervise.sh", "c.py", "gs://b/w", env=ready)
    assert _started(cmds[1:]) == ["describe", "ssh", "ssh"]  # is it running? no: start it
    assert "pgrep" in remote(cmds[2]) and "avalon.main" in remote(cmds[3])
    cmds, _ = run("supervise.sh", "c.py", "gs://b/w", env={**ready, "DRY_RUN_RUNNING": "running"})
    assert _started(cmds[1:]) == ["describe", "ssh"]
    cmds, out = run("supervise.sh", "c.py", "gs://b/w", env={**ready, "DRY_RUN_FINISHED": "1"})
    assert len(cmds) == 1 and "gs://b/w is finished" in out
