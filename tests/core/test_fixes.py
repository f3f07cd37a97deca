"""Fix lines written from the user's own code (pure AST work) and suspect classification."""

from torchmem_magic.analysis.fixes import fix_accumulate, fix_append, fix_carry_over, function_sources
from torchmem_magic.finder.scan.results import RootStats
from torchmem_magic.finder.suspects import classify, container_path

CELL = """\
%%memwatch --interval 50
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    history.append(loss)
    metrics['val'].append(model(x))
    running += loss
    h, c = lstm(x, (h, c))
class Logger:
    def log(self, out):
        self.hist.append(out)
"""


def test_append_becomes_item_or_detach() -> None:
    assert fix_append("history", "item", [CELL]).after == "history.append(loss.item())"
    assert fix_append("metrics['val']", "detach", [CELL]).after == "metrics['val'].append(model(x).detach())"
    fix = fix_append("logger.hist", "detach", [CELL])
    assert (fix.before, fix.after) == ("self.hist.append(out)", "self.hist.append(out.detach())")
    assert fix_append("nowhere", "item", [CELL]) is None


def test_accumulate_and_carry_over() -> None:
    assert fix_accumulate("running", [CELL]).after == "running += loss.item()"
    assert fix_carry_over("h", [CELL]).after == "h, c = lstm(x, (h.detach(), c))"


def test_newest_source_wins_and_bad_sources_are_skipped() -> None:
    newer = "history.append(loss.detach())"
    assert fix_append("history", "item", ["def broken(:", newer, CELL]).before == newer


def test_a_functions_own_body_is_found_nested_or_as_a_method() -> None:
    cell = "store.append(x)\ndef make():\n    store = []\n    def log(t):\n        store.append(t)\n    return log\n"
    (body,) = function_sources("log", [cell])
    assert fix_append("store", "detach", [body]).before == "store.append(t)"
    assert function_sources("log", [CELL]) == ["def log(self, out):\n    self.hist.append(out)"]
    assert function_sources("nowhere", [CELL, "def broken(:"]) == []


def test_container_path() -> None:
    assert container_path("history[17]") == "history"
    assert container_path("logger.hist[3]") == "logger.hist"
    assert container_path("metrics['val'][0]") == "metrics['val']"


def _stats(**values: object) -> RootStats:
    stats = RootStats("x", str(values.pop("kind", "user")), "x", str(values.pop("holder", "list")))
    for key, value in values.items():
        setattr(stats, key, value)
    return stats


def test_classification() -> None:
    assert classify(_stats(tensors=1, graph_tensors=1, graph_nodes=10)) is None  # the last step's loss
    assert classify(_stats(tensors=40, graph_tensors=40, graph_nodes=300)) == "autograd-graph"
    assert classify(_stats(tensors=1, graph_tensors=1, graph_nodes=5000, holder="Tensor")) == "autograd-graph"
    assert classify(_stats(tensors=10, tensor_bytes=8 << 20)) == "tensor-cache"
    assert classify(_stats(tensors=10, tensor_bytes=8 << 20, holder="Sequential")) is None  # a model is no cache
    assert classify(_stats(kind="output-cache", tensors=1)) == "output-cache"
    assert classify(_stats(kind="traceback", tensors=0)) is None


def test_tensor_cache_fix_does_not_suggest_detach() -> None:
    from torchmem_magic.finder.suspects import fix_for

    stats = _stats(tensors=10, tensor_bytes=8 << 20)
    stats.first_tensor_path = "x[0]"
    assert "deque(maxlen=100)" in fix_for(stats, "tensor-cache", ["x.append(torch.ones(3))"])
    stats.scalar_tensors = 10
    assert fix_for(stats, "tensor-cache", ["x.append(acc)"]).startswith("x.append(acc.item())")
