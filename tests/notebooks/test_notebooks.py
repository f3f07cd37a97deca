"""The teaching notebooks run top to bottom in a real kernel and teach what they say.

They run as committed, from the `.ipynb` a user opens; test_notebook_sources checks that each is exactly what
its `.py` source makes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _text(cell: dict) -> str:
    out = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            out.append(output["text"])
        elif "data" in output:
            out.append(output["data"].get("text/plain", ""))
    return "".join(out)


def _execute(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


@pytest.fixture(scope="module")
def quickstart() -> nbformat.NotebookNode:
    return _execute("01_memwatch_quickstart.ipynb")


def test_quickstart_runs_and_shows_live_figures(quickstart: nbformat.NotebookNode) -> None:
    memwatch_cells = [c for c in quickstart.cells if c.cell_type == "code" and c.source.startswith("%%memwatch")]
    assert len(memwatch_cells) == 2
    for cell in memwatch_cells:
        kinds = [o.get("data", {}).keys() for o in cell.outputs]
        assert any("application/vnd.jupyter.widget-view+json" in k for k in kinds), "live figure displayed"
        assert any("text/html" in k for k in kinds), "report displayed"


def test_quickstart_shows_the_leak_against_the_clean_loop(quickstart: nbformat.NotebookNode) -> None:
    comparison = next(c for c in quickstart.cells if c.cell_type == "code" and "heap growth per step" in c.source)
    text = _text(comparison)
    clean_kib = float(text.split("clean ")[1].split(" KiB")[0])
    leaky_kib = float(text.split("leaky ")[1].split(" KiB")[0])
    assert leaky_kib > 20 * max(clean_kib, 1.0), text
    script = quickstart.cells[-1]
    assert "(64, 1)" in _text(script)  # 4096 / 64 steps, one epoch
    json.dumps(quickstart)  # the executed notebook stays serialisable


def test_classic_leaks_notebook_names_each_holder_and_its_fix() -> None:
    nb = _execute("02_classic_leaks.ipynb")
    text = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "history.append(loss.item())  # was: history.append(loss)" in text
    assert "total_loss += loss.item()  # was: total_loss += loss" in text
    assert "h = cell(torch.randn(32, 64), h.detach())" in text
    assert "Out (output-cache): 32.0 MiB retained" in text
    assert "sys.last_traceback (traceback): 32.0 MiB retained" in text
    freed = [int(_text(c)) for c in nb.cells if c.cell_type == "code" and c.source.startswith("torchmem_magic.release")]
    assert len(freed) == 2 and all(f >= 30 << 20 for f in freed)  # each fix really gave back the 32 MiB


def test_rank_that_leaks_notebook_names_rank_1_and_its_holder_then_all_ranks_clean() -> None:
    nb = _execute("03_the_rank_that_leaks.ipynb")
    leaky_run, fixed_run = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%memwatch")]
    leaky = _text(leaky_run)
    assert "verdict: leak (worst rank: 1)" in leaky, leaky
    rank_1 = next(line for line in leaky.splitlines() if line.strip().startswith("1 "))
    assert "leak (per-iteration)" in rank_1 and rank_1.rstrip().endswith("debug_outputs"), leaky
    assert "→ rank 1: leak (per-iteration), heap +" in leaky and "debug_outputs grows +" in leaky, leaky
    assert "→ rank 0: clean" in leaky, leaky
    assert "rank 1: debug_outputs (autograd-graph)" in leaky, leaky
    assert "fix: debug_outputs.append(out.detach())  # was: debug_outputs.append(out)" in leaky, leaky
    summary = _text(nb.cells[nb.cells.index(leaky_run) + 2])
    assert "rank 0: clean  holders: -" in summary and "rank 1: leak   holders: debug_outputs" in summary, summary
    assert "worst rank: 1" in summary, summary
    fixed = _text(fixed_run)
    assert "→ ranks 0, 1: clean" in fixed and "verdict: clean" in fixed, fixed
    assert "verdicts: {0: 'clean', 1: 'clean'}" in _text(nb.cells[-1])


def _code(nb: nbformat.NotebookNode, starts: str) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts)]


def _advice(text: str) -> list[str]:
    return [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("→ ")]


def test_dataloader_notebook_shows_copy_on_access_the_strategies_and_a_worker_killed_by_a_full_shm() -> None:
    nb = _execute("04_dataloader_workers_and_shared_memory.ipynb")
    objects, arrays, death = (_text(c) for c in _code(nb, "%%memwatch"))
    # a list of Python strings: workers' PSS grows while the heap is flat, named copy-on-access with the fix
    assert "DataLoader workers" in objects, objects  # the verdict depends on whether copying had stopped
    copy = next(a for a in _advice(objects) if "copy-on-access" in a)
    assert "while the kernel's heap stayed nearly flat" in copy and "numpy/torch arrays" in copy, copy
    # the same records as one numpy array: clean, no copy-on-access
    assert "verdict: clean" in arrays and "copy-on-access" not in arrays, arrays
    comparison = _text(_code(nb, "arrays = torchmem_magic.last_report()")[0])
    peaks = {line.split(" worker")[0].strip(): (float(line.split("peak")[1].split("MiB")[0]), line.endswith("True"))
             for line in comparison.splitlines()}
    assert peaks["list of str"][1] and not peaks["numpy array"][1], comparison
    assert peaks["list of str"][0] > peaks["numpy array"][0] + 40, comparison  # ~90 MiB of strings copied per worker
    # file_descriptor segments are unlinked (no files, space used); file_system leaves torch_* files
    strategies = _text(_code(nb, "class Images(Dataset)")[0])
    counts = {line.split()[0]: int(line.split("/dev/shm:")[1].split("·")[0]) for line in strategies.splitlines()}
    assert counts["file_descriptor"] == 0 and counts["file_system"] >= 4, strategies
    assert "sharing strategy file_descriptor · /dev/shm" in _text(_code(nb, "print(torchmem_magic.sharing_info")[0])
    # a full (small) shm mount: the bus error is explained, with the fix; or the notebook says it skipped
    mount = _text(_code(nb, "import mmap, subprocess, tempfile")[0])
    if "cannot mount a small tmpfs here" in mount:
        assert "skipped: no small tmpfs" in death
        return
    assert "/dev/shm is only 16 MiB (a container default)" in mount, mount
    assert "verdict: leak" in death and "DataLoader worker" in death, death
    small = mount.split("mounted at ")[1].split(",")[0]
    assert re.match(rf"DataLoader worker [\d, ]+ died \(Bus error\): {re.escape(small)} was (9\d|100)% full", _advice(death)[0]), death
    assert "--shm-size" in _advice(death)[1], death
    explained = _text(nb.cells[-1])
    assert "died (Bus error)" in explained and "--shm-size" in explained, explained


def test_gpu_memory_notebook_on_cpu_shows_freed_not_given_back_then_returned_and_a_clean_verdict() -> None:
    nb = _execute("05_gpu_memory.ipynb")
    if "no GPU here" not in _text(nb.cells[1]):
        pytest.skip("the CUDA path runs where a GPU is; this checks the CPU path")

    def mib(line: str, label: str) -> float:
        return float(line.split(label)[1].split("MiB")[0])

    rows = {line[:28].strip(): line for line in _text(_code(nb, "show('before')")[0]).splitlines()}
    before, alive, freed = rows["before"], rows["3,000 chunks alive"], rows["chunks freed"]
    assert mib(alive, "heap in use") - mib(before, "heap in use") > 150, rows  # 3,000 × 64 KiB
    assert mib(freed, "heap in use") - mib(before, "heap in use") < 20, rows  # freed at once ...
    assert mib(alive, "RSS") - mib(freed, "RSS") < 20, rows  # ... but not given back
    returned = _text(_code(nb, "print(torchmem_magic.collect_garbage() if cuda")[0])
    rss = re.search(r"return heap to OS: RSS ([\d.]+) MiB → ([\d.]+) MiB", returned)
    assert rss is not None and float(rss.group(1)) - float(rss.group(2)) > 100, returned  # malloc_trim gave it back
    watched = _text(_code(nb, "%%memwatch")[0])
    assert "verdict: clean" in watched, watched
    assert any(a.startswith("RSS grows while the heap in use is flat") and "malloc_trim(0)" in a for a in _advice(watched)), watched
    summary = _text(_code(nb, "run = torchmem_magic.last_report()")[0])
    assert "verdict: clean" in summary
    heap, ram = (dict(part.strip().split(" ", 1) for part in line[12:].split(","))
                 for line in summary.splitlines()[1:3])
    assert float(heap["end"].split()[0]) - float(heap["start"].split()[0]) < 20, summary  # allocated/heap back down
    assert float(ram["end"].split()[0]) - float(ram["start"].split()[0]) > 100, summary  # reserved/RSS stays up
    given_back = _text(_code(nb, "given_back = ")[0])
    rss = re.search(r"return heap to OS: RSS ([\d.]+) MiB → ([\d.]+) MiB", given_back)
    assert rss is not None and float(rss.group(1)) - float(rss.group(2)) > 100, given_back  # the run's RSS came back
    assert "PYTORCH_CUDA_ALLOC_CONF =" in _text(_code(nb, "print('PYTORCH_CUDA_ALLOC_CONF")[0])


def test_real_script_notebook_finds_the_logger_that_keeps_validation_graphs_and_the_fix_is_clean() -> None:
    nb = _execute("06_finding_the_leak_in_a_real_script.ipynb")
    leaky, fixed = (_text(c) for c in _code(nb, "%%memwatch"))
    assert "epoch 4: train loss" in leaky and "epoch 4: train loss" in fixed  # the script really trained
    assert "verdict: leak" in leaky and "per-epoch leak in heap" in leaky, leaky
    assert "and logger grows +" in leaky and "that is where it goes" in leaky, leaky
    assert "logger (autograd-graph):" in leaky and "e.g. logger.history['val_loss'][" in leaky, leaky
    assert "fix: wrap the code that fills logger.history['val_loss'] in `with torch.no_grad():`" in leaky, leaky
    memcheck = _text(_code(nb, "leaky = torchmem_magic.last_report()")[0])
    assert "logger.history['val_loss'][*]" in memcheck and "grad_fn=NllLossBackward0" in memcheck, memcheck
    retained = float(re.search(r"retains ([\d.]+) MiB", memcheck).group(1))  # type: ignore[union-attr]
    assert retained > 100, memcheck
    assert "verdict: clean" in fixed and "holders of tensors" not in fixed, fixed
    side_by_side = _text(nb.cells[-1])
    assert "leaky: leak  · heap +" in side_by_side and "graph holders: logger" in side_by_side, side_by_side
    assert "fixed: clean · heap" in side_by_side and "graph holders: -" in side_by_side, side_by_side


def test_kernel_death_notebook_shows_the_guard_stopping_the_leak_and_a_killed_runs_record() -> None:
    nb = _execute("07_when_the_kernel_dies.ipynb")
    guarded = _code(nb, "%%memwatch --guard 90%")[0]
    errors = [o for o in guarded.outputs if o.get("output_type") == "error"]
    assert [e["ename"] for e in errors] == ["MemoryGuardError"], errors
    text = _text(guarded)
    assert "memwatch: failed" in text and "of its" in text and "TORCHMEM_MAGIC_RAM_LIMIT" in text, text
    assert any(a.startswith("the memory guard stopped the run after") for a in _advice(text)), text
    assert "top holder so far: cache" in errors[0]["evalue"], errors[0]["evalue"]
    survived = _text(_code(nb, "print(f'{len(cache)} steps")[0])
    steps = int(survived.split(" steps kept")[0])
    assert 0 < steps < 1000 and "the model is still here: (256, 256)" in survived and "status: error" in survived
    assert "killed with SIGKILL" in _text(_code(nb, "body = ")[0])
    last = _text(_code(nb, "%memwatch --last")[0])
    assert "memwatch: killed" in last and "the kernel died during this run" in last, last
    assert "outputs (autograd-graph)" in last and "fix: outputs.append(out.detach())" in last, last
    killed, cleared = _text(nb.cells[-1]).splitlines()
    assert killed.startswith("killed ") and killed.endswith("['outputs']") and cleared == "cleared 1", (killed, cleared)


def test_lightning_notebook_names_the_modules_list_logs_the_curves_and_the_fix_is_clean() -> None:
    nb = _execute("08_a_leak_inside_a_lightningmodule.ipynb")
    leaky, fixed = (c for c in nb.cells if c.cell_type == "code" and "trainer.fit(" in c.source)
    kinds = [o.get("data", {}).keys() for o in leaky.outputs]
    assert any("application/vnd.jupyter.widget-view+json" in k for k in kinds), "live figure under the fit cell"
    leaky_text, fixed_text = _text(leaky), _text(fixed)
    assert "prototype accuracy after the last epoch" in leaky_text  # it really trained
    assert "verdict: leak" in leaky_text and "per-epoch leak in heap" in leaky_text, leaky_text
    assert "it grows while validating: " in leaky_text, leaky_text  # the passes the callback marked
    assert "e.g. model.validation_step_outputs[" in leaky_text, leaky_text
    assert "fix: model.validation_step_outputs grows with the steps" in leaky_text, leaky_text  # the list, not an item
    assert "verdict: clean" in fixed_text and "holders of tensors" not in fixed_text, fixed_text
    logged = [_text(c) for c in nb.cells if c.cell_type == "code" and 'memwatch_rows("' in c.source]
    leaky_rows, fixed_rows = (re.findall(r"step +(\d+): heap +([\d.]+) MiB · growth/step (\S+)", t) for t in logged)
    assert leaky_rows[-1][0] == "512" and float(leaky_rows[-1][2]) > 16 * 1024, leaky_rows  # the report's rate
    assert fixed_rows and all(growth in ("-", "0.0") for _, _, growth in fixed_rows), fixed_rows
