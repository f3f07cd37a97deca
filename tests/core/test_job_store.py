"""What the ranks of a multi-node job write in its c10d store, read without a store: who a rank is
from torchrun's environment, the bounded wire form of its summary, the status of a rank whose
summaries stopped, and saved reports of several nodes (each listing every rank) merged to one entry a rank."""

from __future__ import annotations

import json
from dataclasses import replace

from test_saved import _holder, _rank, _report

from torchmem_magic.report.merge import rank_lines
from torchmem_magic.ranks.job import (
    MAX_SERIES_POINTS,
    MAX_SUSPECTS,
    STALE_AFTER_S,
    JobStore,
    Published,
    decode_deaths,
    decode_summary,
    encode_death,
    encode_summary,
    job_from_fields,
    job_of,
    remote_status,
)
from torchmem_magic.report.saved import merge_reports

TORCHRUN = {
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2",
    "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "RANK": "3", "LOCAL_RANK": "1",
}


def test_a_rank_of_a_multi_node_torchrun_job_knows_its_store_and_keys() -> None:
    job = job_of(TORCHRUN)
    assert job == JobStore("10.0.0.1", 29500, "job7", 2, 4, 2, 1) and job.multi_node
    # not under the restart count (a node's own): a restarted rank's new process takes over its key
    assert job.summary_key(3) == "torchmem_magic/job7/rank/3" and job.events_key == "torchmem_magic/job7/events"
    assert job_from_fields(json.loads(json.dumps(job.fields()))) == job  # as it travels in a hello


def test_single_node_jobs_and_other_processes_have_no_job_to_publish_to() -> None:
    single = job_of({**TORCHRUN, "WORLD_SIZE": "2"})
    assert single is not None and not single.multi_node
    for missing in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        assert job_of({k: v for k, v in TORCHRUN.items() if k != missing}) is None
    assert job_of({**TORCHRUN, "MASTER_PORT": "http"}) is None
    assert job_from_fields({"host": "x"}) is None and job_from_fields("junk") is None


def test_a_summary_reads_back_bounded_and_marked_as_from_the_store() -> None:
    series = tuple((step, step * 1000) for step in range(0, 400, 4))
    holders = tuple(replace(_holder(f"h{i}", 1, 65_536.0), retained_bytes=(10 - i) << 20, series=series) for i in range(8))
    summary = replace(_rank(1, "leak", 65_536.0, host="node-b"), suspects=holders, node=1, advice=tuple("abcdefgh"))
    data = encode_summary(summary, seq=7, sent_wall_s=123.5, final=False)
    published = decode_summary(data)
    assert published is not None and (published.seq, published.sent_wall_s, published.final) == (7, 123.5, False)
    got = published.summary
    assert (got.rank, got.host, got.node, got.verdict, got.via) == (1, "node-b", 1, "leak", "store")
    assert [s.name for s in got.suspects] == [f"h{i}" for i in range(MAX_SUSPECTS)]  # the largest, in order
    assert len(got.suspects[0].series) == MAX_SERIES_POINTS
    assert got.suspects[0].series[0] == series[0] and got.suspects[0].series[-1] == series[-1]
    assert got.suspects[0].growth_per_step == 65_536.0 and got.heap == summary.heap
    assert len(data) < 8_000


def test_what_is_not_a_summary_reads_as_none() -> None:
    good = json.loads(encode_summary(_rank(0, "clean", None), 0, 0.0, True))
    for data in (b"", b"\xff\xfe", b"[]", b"{}", json.dumps({**good, "v": 99}).encode(),
                 json.dumps({**good, "summary": {"rank": 0}}).encode(), b"123"):
        assert decode_summary(data) is None


def test_a_silent_rank_is_stale_killed_when_its_node_said_so_and_its_own_once_it_finished() -> None:
    running = Published(replace(_rank(1, "leak", 65_536.0), status="running"), 3, 0.0, final=False)
    assert remote_status(running, 0.5, False, {}) == ("running", None)
    assert remote_status(running, STALE_AFTER_S + 0.1, False, {}) == ("stale", None)
    assert remote_status(running, 0.5, True, {}) == ("stale", None)  # the store went before it finished
    deaths = decode_deaths(encode_death(1, 1001, "SIGKILL") + b"not json\n" + encode_death(2, 1002, None))
    assert deaths == {(1, 1001): "SIGKILL", (2, 1002): None}
    assert remote_status(running, 0.5, True, deaths) == ("killed", "SIGKILL")
    restarted = Published(replace(running.summary, pid=2001), 0, 0.0, final=False)  # rank 1's next process
    assert remote_status(restarted, 0.5, False, deaths) == ("running", None)  # the death was its predecessor's
    assert remote_status(running, 0.5, False, {}, replaced=True) == ("killed", None)
    assert remote_status(running, 0.5, True, {}, job_failed=True) == ("killed", None)  # stopped with the job
    final = Published(replace(_rank(1, "leak", 65_536.0), status="ok"), 9, 0.0, final=True)
    assert remote_status(final, 100.0, True, deaths) == ("ok", None)


def test_a_stale_rank_keeps_its_last_figures_in_the_report_lines() -> None:
    stale = replace(_rank(1, "leak", 65_536.0, host="node-b"), status="stale", node=1, via="store", local_rank=0)
    lines = rank_lines((replace(_rank(0, "clean", None), status="ok"), stale))
    assert any(line.startswith("rank 1 (pid 1001 on node-b, node 1) went silent") and "heap 70.0 MiB" in line
               for line in lines), lines
    assert any(line.startswith("rank 1: leak (per-iteration)") for line in lines)


def test_saved_reports_of_two_nodes_merge_to_one_entry_a_rank_the_streamed_one() -> None:
    own0, own1 = _rank(0, "clean", None, host="a"), _rank(1, "leak", 65_536.0, host="b")
    via_store1 = replace(own1, via="store", status="stale", steps=120)
    via_store0 = replace(own0, via="store")
    merged = merge_reports([_report((own0, via_store1), worst=1), _report((via_store0, own1), worst=1)])
    assert merged.ranks is not None and [(r.rank, r.via, r.steps) for r in merged.ranks] == [(0, "stream", 200),
                                                                                           (1, "stream", 200)]
    assert merged.worst_rank == 1 and merged.verdict == "leak"
