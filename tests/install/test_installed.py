"""The installed wheel does the main job where users are: in a fresh environment that already had torch,
JupyterLab and ipywidgets (left as they were), from a directory that cannot see this checkout — a real
kernel (`%load_ext`, a `%%memwatch` cell naming its holder with the static figure in its output,
`%memcheck`, a rank launched with `start_processes`, `last_crash()` after a SIGKILLed kernel), the command
line (`watch`, `show`) and the pytest plugin loaded through its entry point."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributions import TORCH_SPEC, UserEnvironment, run, start_user_kernel
from kernel_client import RANK_TRAINING, Execution, Kernel, free_port

from torchmem_magic.render.static import embedded_figure

pytestmark = pytest.mark.install

PREPARE = '''
import torch
torch.set_num_threads(1)
%load_ext torchmem_magic
import torchmem_magic
kept = []
model = torch.nn.Linear(256, 256); opt = torch.optim.SGD(model.parameters(), lr=0.01)
'''
LEAKING_CELL = '''%%memwatch --interval 20
for step in range(300):
    out = model(torch.randn(64, 256))
    loss = out.pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    kept.append(out)  # keeps every step's output and its graph
'''
SCRIPT = '''
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept_outputs = []
for step in range(300):
    out = model(torch.randn(64, 256))
    loss = out.pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    kept_outputs.append(out)  # the leak
'''
GATED_TESTS = '''
import pytest, torch

def _train(keep):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256); opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(200):
        out = model(torch.randn(64, 256))
        loss = out.pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        keep(out)

@pytest.mark.no_leak
def test_leaky():
    history = []
    _train(history.append)

@pytest.mark.no_leak
def test_clean():
    history = []
    _train(lambda out: history.append(out.sum().item()))
'''


def _venv_path(user_env: UserEnvironment, path: str) -> Path:
    found = Path(path).resolve()
    assert found.is_relative_to(user_env.prefix.resolve()), f"{found} is not the installed package"
    return found


def test_installing_changes_nothing_the_user_had(user_env: UserEnvironment) -> None:
    changed = {name: (versions, user_env.after.get(name)) for name, versions in user_env.before.items()
               if user_env.after.get(name) != versions}
    assert changed == {}, changed  # no upgrade, no downgrade, no second copy (torch, JupyterLab, ipywidgets...)
    for name in ("torch", "jupyterlab", "ipywidgets"):
        assert len(user_env.after[name]) == 1 and name in user_env.before, (name, user_env.before.get(name))
    added = set(user_env.after) - set(user_env.before)
    assert "torchmem-magic" in added and "torch" not in added, added
    run([str(user_env.python), "-m", "pip", "check"], cwd=user_env.work)


def test_the_extras_name_what_users_need(user_env: UserEnvironment) -> None:
    """`[lab]` was installed with the wheel (JupyterLab already there: nothing added); `[nvml]` brings
    NVML's bindings and nothing else."""
    report = user_env.work / "nvml.json"
    run([str(user_env.python), "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(report),
         "torchmem_magic[nvml]"], cwd=user_env.work)
    would = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert would == {"nvidia-ml-py"}, would


def test_the_integrations_come_with_the_wheel_and_name_their_extra(user_env: UserEnvironment) -> None:
    """The trainers' callbacks are in the wheel; where the user has no Lightning, importing its callback says, in
    one line, which extra to install; `[tensorboard]` would add tensorboard and leave torch as it is."""
    code = ("import torchmem_magic.integrations.tensorboard\n"
            "try:\n    import torchmem_magic.integrations.lightning\nexcept ImportError as e:\n    print(e)\n")
    done = run([str(user_env.python), "-c", code], cwd=user_env.work)
    assert done.stdout.strip() == (
        "torchmem_magic.integrations.lightning needs Lightning: pip install 'torchmem_magic[lightning]'"
    ), done.stdout
    report = user_env.work / "tensorboard.json"
    run([str(user_env.python), "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(report),
         "torchmem_magic[tensorboard]"], cwd=user_env.work)
    would = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert "tensorboard" in would and "torch" not in would, would


@pytest.fixture(scope="module")
def user_kernel(user_env: UserEnvironment) -> Iterator[Kernel]:
    k = start_user_kernel(user_env)
    try:
        k.ok(PREPARE)
        yield k
    finally:
        k.shutdown()


def test_load_ext_and_a_memwatch_cell_name_the_holder_with_the_static_figure(
    user_env: UserEnvironment, user_kernel: Kernel
) -> None:
    _venv_path(user_env, user_kernel.value("torchmem_magic.__file__"))
    assert user_kernel.value("__import__('os').getcwd()") == str(user_env.work)
    execution = user_kernel.ok(LEAKING_CELL, timeout_s=240)
    shown = [m["content"]["data"] for m in execution.of_type("display_data")]
    assert any("application/vnd.jupyter.widget-view+json" in data for data in shown), "the live figure"
    html = "".join(data.get("text/html", "") for data in shown)
    figure = embedded_figure(html)
    assert figure and "<polyline" in figure and "verdict:" in figure, "the static figure in the output"
    assert "kept" in html
    report = user_kernel.value("torchmem_magic.last_report().to_dict()")
    assert (report["verdict"], report["leak_kind"], report["steps"]) == ("leak", "per-iteration", 300), report["advice"]
    top = report["suspects"][0]
    assert (top["name"], top["kind"]) == ("kept", "autograd-graph"), report["suspects"]


def test_memcheck_explains_the_holder(user_kernel: Kernel) -> None:
    execution = user_kernel.ok("%memcheck kept")
    text = execution.stdout + "".join(m["content"]["data"].get("text/plain", "") for m in execution.of_type("display_data"))
    assert re.search(r"kept: 300 tensors · .* · 300 with autograd graphs", text), text
    assert "kept[*]" in text and "grad_fn=AddmmBackward0" in text, text


def test_a_rank_launched_with_start_processes_is_watched(user_kernel: Kernel) -> None:
    user_kernel.ok(RANK_TRAINING)
    user_kernel.ok(f"%%memwatch -q\nmp.start_processes(train, args=(2, {free_port()}, 1), nprocs=2, start_method='fork')",
                   timeout_s=240)
    report = user_kernel.value("torchmem_magic.last_report().to_dict()")
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert sorted(ranks) == [0, 1] and report["worst_rank"] == 1, report["advice"]
    assert ranks[1]["verdict"] == "leak" and "outputs" in [s["name"] for s in ranks[1]["suspects"]], ranks[1]
    assert ranks[0]["verdict"] == "clean", ranks[0]


def _text_shown(execution: Execution) -> str:
    return execution.stdout + "\n".join(m["content"]["data"].get("text/plain", "") for m in execution.of_type("display_data"))


def test_last_crash_reads_back_a_sigkilled_kernels_run(
    user_env: UserEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = tmp_path / "records"
    monkeypatch.setenv("TORCHMEM_MAGIC_RECORD_DIR", str(records))
    monkeypatch.setenv("JPY_SESSION_NAME", str(user_env.work / "train.ipynb"))
    doomed = start_user_kernel(user_env)
    try:
        doomed.ok(PREPARE)
        doomed.kc.execute(LEAKING_CELL.replace("--interval 20", "").replace("range(300)", "range(10**7)"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until its record names the holder and a leak
            text = "".join(p.read_text(errors="replace") for p in records.glob("*.jsonl")) if records.is_dir() else ""
            if '"kept"' in text and "leak" in text:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the run's flight record never named its holder")
        process = doomed.km.provisioner.process  # type: ignore[union-attr]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        doomed.shutdown()
    survivor = start_user_kernel(user_env)
    try:
        first = survivor.ok("%load_ext torchmem_magic\nimport torchmem_magic")
        assert "the kernel of this notebook died while %%memwatch watched it" in _text_shown(first)
        crash = survivor.value("(lambda r: {'status': r.status, 'verdict': r.verdict, "
                               "'holders': [s.name for s in r.suspects]})(torchmem_magic.last_crash())")
        assert crash["status"] == "killed" and crash["verdict"] == "leak" and "kept" in crash["holders"], crash
        assert survivor.value("torchmem_magic.clear_crashes()") == 1
    finally:
        survivor.shutdown()


def test_the_command_line_watches_a_script_and_shows_the_saved_report(user_env: UserEnvironment) -> None:
    script = user_env.work / "train.py"
    script.write_text(SCRIPT)
    saved = user_env.work / "run.json"
    python = str(user_env.python)
    watched = run([python, "-m", "torchmem_magic", "watch", "--save", str(saved), "--", python, str(script)],
                  cwd=user_env.work, timeout_s=300)
    assert "verdict: leak (worst rank: 0)" in watched.stdout and "kept_outputs" in watched.stdout, watched.stdout
    shown = run([python, "-m", "torchmem_magic", "show", str(saved)], cwd=user_env.work)
    assert "verdict: leak" in shown.stdout and "kept_outputs" in shown.stdout, shown.stdout
    assert json.loads(saved.read_text())["ranks"][0]["verdict"] == "leak"


def test_the_pytest_plugin_loads_through_its_entry_point(user_env: UserEnvironment) -> None:
    run([str(user_env.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "pytest"],
        cwd=user_env.work)
    tests = user_env.work / "gated"
    tests.mkdir()
    (tests / "test_training.py").write_text(GATED_TESTS)
    (tests / "pytest.ini").write_text("[pytest]\n")
    done = run([str(user_env.python), "-m", "pytest", "-p", "no:cacheprovider", "-rf", str(tests)], cwd=tests,
               check=False, timeout_s=300)
    plugins = next((line for line in done.stdout.splitlines() if line.startswith("plugins:")), "")
    assert re.search(r"\btorchmem_magic-\d", plugins), done.stdout  # found through its pytest11 entry point
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert "FAILED test_training.py::test_leaky" in done.stdout, done.stdout
    assert "LeakError: memwatch verdict: leak over 200 steps" in done.stdout, done.stdout
    assert "top holder: history " in done.stdout, done.stdout


def test_the_environment_before_the_install_was_a_users(user_env: UserEnvironment) -> None:
    """What the install tests start from: torch, JupyterLab and ipywidgets, no torchmem_magic."""
    assert "torchmem-magic" not in user_env.before
    assert [version.split("+")[0] for version in user_env.before["torch"]] == [TORCH_SPEC.removeprefix("torch==")]
