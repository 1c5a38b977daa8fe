"""Hostile and malformed input (issue 23): every spec error located, nothing escapes the output
folder, nothing blows up.

Three layers: hostile YAML texts (alias bombs, deep nesting, bad bytes, odd tags) against the
loader, with their peak memory; out-of-range numbers and names at their line and column; and
property-based mutations of the example specs (hypothesis, derandomized, a fixed number of
examples) asserting that `validate` and `build` fail only with located spec errors, and agree.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetcompile.driver import compile_spec
from hetcompile.errors import HetcompileError, PassError, SpecError
from hetcompile.ir.load import read_spec
from hetcompile.ir.lower import load_problem
from hetcompile.ir.yaml_spans import load_yaml

from conftest import ROOT

QUICKSTART = ROOT / "examples/quickstart/spec.yaml"


def _alias_bomb(depth: int, fan: int = 9) -> str:
    text = 'a0: &a0 [' + ",".join(['"x"'] * fan) + "]\n"
    for i in range(1, depth + 1):
        text += f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * fan) + "]\n"
    return text


HOSTILE_TEXTS = {
    "alias-bomb-7": (_alias_bomb(7).encode(), "aliases expand to more than"),
    "alias-bomb-9": (_alias_bomb(9).encode(), "aliases expand to more than"),
    "deep-nesting": (("a: " + "[" * 100_000 + "]" * 100_000).encode(), "nested deeper than"),
    "deep-mapping": (("a: " + "{b: " * 5_000 + "1" + "}" * 5_000).encode(), "nested deeper than"),
    "recursive-alias": (b"a: &a [*a]\n", "nested deeper than"),
    "recursive-merge": (b"a: &a {<<: *a}\n", "nested deeper than"),
    "nul-byte": (b"name: x\x00y\n", "control character U+0000"),
    "control-char": (b"name: x\x07y\n", "control character U+0007"),
    "utf-16": ("name: x\n".encode("utf-16"), "UTF-16"),
    "bad-utf-8": (b"name: x\xff\n", "byte 0xff is not UTF-8"),
    "huge-int": (b"name: " + b"9" * 5000 + b"\n", "number too large"),
    "python-tag": (b"name: !!python/object:os.system x\n", "could not determine a constructor"),
    "unknown-tag": (b"name: !vault abc\n", "could not determine a constructor"),
    "two-documents": (b"name: a\n---\nname: b\n", "expected a single document"),
    "complex-key": (b"? [a, b]\n: 1\n", "mapping keys must be plain scalars"),
    "unclosed": (b"name: [a, b\n", "invalid YAML"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TEXTS))
def test_hostile_yaml_is_a_located_error_in_bounded_memory(case: str, tmp_path: Path) -> None:
    raw, expected = HOSTILE_TEXTS[case]
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(raw)
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as info:
            read_spec(spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = info.value
    assert expected in str(err)
    assert err.span is not None and err.span.line >= 1 and err.span.file == str(spec)
    if len(raw) <= 1024:
        assert peak < 100 * 2**20, f"{case}: {peak / 2**20:.0f} MiB"


def test_merge_keys_work_like_safe_load() -> None:
    text = (
        "defaults: &d {gpus_per_node: 1, max_nodes: 4, price: $1/h}\n"
        "more: &m {spot: false}\n"
        "offers:\n"
        "  - {<<: *d, gpu: L4}\n"
        "  - {<<: [*d, *m], gpu: A10G, max_nodes: 2}\n"
    )
    data, smap = load_yaml(text, "t.yaml")
    assert data == yaml.safe_load(text)
    # a merged value points at where it is written (the anchor), an own value at its own line
    assert smap.value(("offers", 0, "price")).line == 1
    assert smap.value(("offers", 1, "max_nodes")).line == 5


def test_merge_keys_in_a_spec_build_the_same_problem(tmp_path: Path) -> None:
    text = QUICKSTART.read_text().replace(
        "      - {gpu: L4, max_nodes: 4, price: $0.85/h}",
        "      - &l4 {gpu: L4, max_nodes: 4, price: $0.85/h}\n      - {<<: *l4, gpu: T4, price: $0.35/h}",
    )
    (tmp_path / "spec.yaml").write_text(text)
    ir, _, _ = load_problem(tmp_path / "spec.yaml")
    t4 = [o for o in ir.offers if o.gpu == "T4"]
    assert len(t4) == 1 and t4[0].max_gpus == 4


def _edit(tmp_path: Path, old: str, new: str) -> Path:
    text = QUICKSTART.read_text()
    assert old in text
    spec = tmp_path / "spec.yaml"
    spec.write_text(text.replace(old, new, 1))
    return spec


# (old text, new text, message, line) on the quickstart spec
OUT_OF_RANGE = [
    ("rate: 6/s", "rate: -3/s", "workloads.0.rate: a rate must be > 0, got -3/s", 12),
    ("rate: 6/s", "rate: 0", "a rate must be > 0, got 0", 12),
    ("rate: 6/s", "rate: .nan", "a rate must be a finite number, got nan", 12),
    ("rate: 6/s", "rate: .inf", "a rate must be a finite number, got inf", 12),
    ("price: $0.85/h", "price: -1", "regions.0.offers.0.price: a price must be >= 0, got -1", 22),
    ("price: $0.85/h", "price: .nan", "a price must be a finite number", 22),
    ("budget: $12/h", "budget: .nan", "budget: a price must be a finite number, got nan", 31),
    ("latency: 1ms}", "latency: -1ms}", "network.intra_region.latency: a latency must be >= 0, got -1ms", 29),
    ("bandwidth: 10Gbps", "bandwidth: 0", "a bandwidth must be > 0, got 0", 29),
    ("mip_gap: 0.01%", "mip_gap: -1", "solver.mip_gap: a gap must be >= 0, got -1", 33),
    ("mip_gap: 0.01%", "mip_gap: 100%", "a gap must be < 1, got 100%", 33),
    ("time_limit: 30s", "time_limit: -5s", "solver.time_limit: a duration must be > 0, got -5s", 33),
    ("time_limit: 30s", "time_limit: .nan", "a duration must be a finite number", 33),
    ("solver: {", "solver: {threads: 10000, ", "solver.threads: Input should be less than or equal to 256", 33),
    ("max_nodes: 4, price: $0.85/h", "max_nodes: 99999999999999999999, price: $0.85/h", "less than or equal to 100000", 22),
    ("input_tokens: 763", "input_tokens: -763", "greater than 0", 10),
    ("{gpu: L4,", "{gpu: L4, gpus_per_node: .inf,", "gpus_per_node", 22),
    ("objective: max-throughput", "objective: max-throughput\ngpus: [{name: x1, memory: 80GB, fp16_tflops: .inf, bandwidth: 1TB/s}]",
     "gpus.0.fp16_tflops: Input should be a finite number", 33),
    ("objective: max-throughput", "objective: max-throughput\ngpus: [{name: x1, memory: -80GB, fp16_tflops: 100, bandwidth: 1TB/s}]",
     "gpus.0.memory: a size must be > 0, got -80GB", 33),
]


@pytest.mark.parametrize("old,new,message,line", OUT_OF_RANGE, ids=[c[1][:40] for c in OUT_OF_RANGE])
def test_out_of_range_numbers_are_located(tmp_path: Path, old: str, new: str, message: str, line: int) -> None:
    spec = _edit(tmp_path, old, new)
    with pytest.raises(SpecError) as info:
        load_problem(spec)
    assert message in str(info.value)
    assert info.value.span is not None and info.value.span.line == line


@pytest.mark.parametrize("old,new,message,line", [
    ("budget:", "Budget:", "unknown key 'Budget'; did you mean 'budget'?", 31),
    ("{gpu: L4,", "{GPU: L4,", "unknown key 'GPU'; did you mean 'gpu'?", 22),
    ("  - name: us-central1\n", "  - name: us-central1\n    Cloud: gcp\n", "unknown key 'Cloud'; did you mean 'cloud'?", 20),
    ("name: quickstart", "name: Quick", "plan name 'Quick' is not allowed", 2),
    ("  - name: chat", "  - name: 'chat$(touch pwned)'", "name 'chat$(touch pwned)' is not allowed", 8),
    ("  - name: us-east-1", "  - name: ../../escaped", "name '../../escaped' is not allowed", 24),
])
def test_keys_and_names_are_located(tmp_path: Path, old: str, new: str, message: str, line: int) -> None:
    spec = _edit(tmp_path, old, new)
    with pytest.raises(SpecError) as info:
        load_problem(spec)
    assert message in str(info.value)
    assert info.value.span.line == line


@pytest.mark.parametrize("objective", ["max-throughput", "min-cost", "max-throughput-per-dollar"])
@pytest.mark.parametrize("budget", [True, False])
def test_free_gpus_get_a_defined_answer(tmp_path: Path, objective: str, budget: bool) -> None:
    text = QUICKSTART.read_text().replace("objective: max-throughput", f"objective: {objective}")
    for price in ("$0.85/h", "$3.67/h", "$1.01/h"):
        text = text.replace(price, "0")
    if not budget:
        text = text.replace("budget: $12/h\n", "")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    ir = compile_spec(spec, verify=False).ir
    assert ir.replicas and sum(n.price_per_s for n in ir.nodes) == 0


# --- ids read back from a previous plan: the shell-injection / path-traversal boundary -----------

def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def old_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("old") / "out"
    proc = subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", str(QUICKSTART), "-q", "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out / "plan.json"


@pytest.mark.parametrize("field,value", [
    ("replica", "r0$(touch pwned)"), ("replica", "../../escaped"), ("replica", "r0'; touch pwned; '"),
    ("replica", "r0\ntouch pwned"), ("replica", "/etc/cron.d/x"), ("node", "../../node"), ("plan", "x$(id)"),
])
def test_hostile_ids_in_previous_plan_are_refused_and_nothing_escapes(
        tmp_path: Path, old_plan: Path, field: str, value: str) -> None:
    import json

    doc = json.loads(old_plan.read_text())
    if field == "replica":
        doc["replicas"][0]["id"] = value
    elif field == "node":
        doc["nodes"][0]["id"] = value
    else:
        doc["plan"] = value
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    prev = work / "plan.json"
    prev.write_text(json.dumps(doc))
    before = _tree(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", str(QUICKSTART), "-q",
                           "--previous", str(prev), "-o", str(work / "out")], cwd=work, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert "is not allowed" in proc.stderr and str(prev) in proc.stderr
    assert _tree(tmp_path) == before  # nothing written anywhere, -o included
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def test_artifacts_never_leave_the_output_directory(tmp_path: Path) -> None:
    from hetcompile.backends.emit import _inside
    from hetcompile.errors import BackendError

    assert _inside(tmp_path, "sky/r0.yaml") == tmp_path / "sky/r0.yaml"
    for rel in ("../x", "sky/../../x", "/etc/passwd"):
        with pytest.raises(BackendError):
            _inside(tmp_path, rel)


# --- property-based: mutated example specs ----------------------------------------------------------

HOSTILE_VALUES = st.sampled_from([
    -1, 0, -3.5, math.nan, math.inf, -math.inf, 10**30, 2**63, "", "x", "-3/s", "$-1/h", "1e400", "nan", None, True,
    [], {}, [1, 2], {"a": 1}, "r0$(touch pwned)", "../../x", "A" * 300, "ünïcode", 1e-300, 1e308, "0%", "200%",
    "0s", "-1ms", "0Gbps", "1e-9/s",
])


def _paths(data: object, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _paths(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, path + (i,))
    return out


def _mutate(data: object, path: tuple, how: str, value: object) -> object:
    data = copy.deepcopy(data)
    if not path:
        return value
    parent = data
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if how == "set":
        parent[key] = value
    elif how == "upper" and isinstance(parent, dict) and isinstance(key, str):
        parent[key.upper()] = parent.pop(key)
    elif how == "drop":
        del parent[key]
    elif how == "repeat" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[key]))
    return data


EXAMPLES = ["quickstart", "three-regions", "helix-cluster10", "cost-efficiency-appc", "llama70b-pp", "tiny-cpu"]


@pytest.fixture(scope="module")
def example_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for ex in EXAMPLES:
        dst = tmp_path_factory.mktemp(ex) / ex
        shutil.copytree(ROOT / "examples" / ex, dst)
        out[ex] = dst
    return out


def _mutations(examples: list[str]):
    return st.sampled_from(examples).flatmap(lambda ex: st.tuples(
        st.just(ex),
        st.sampled_from(_paths(yaml.safe_load((ROOT / "examples" / ex / "spec.yaml").read_text()))),
        st.sampled_from(["set", "set", "set", "upper", "drop", "repeat"]),
        HOSTILE_VALUES,
    ))


def _mutated_spec(dirs: dict[str, Path], mutation) -> Path | None:
    """The example `mutation` names, mutated and written beside its own files (None: not YAML)."""
    ex, path, how, value = mutation
    base = yaml.safe_load((ROOT / "examples" / ex / "spec.yaml").read_text())
    return _write(dirs, ex, _mutate(base, path, how, value))


def _write(dirs: dict[str, Path], ex: str, data: object) -> Path | None:
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return None
    spec = dirs[ex] / "mutated.yaml"
    spec.write_text(text)
    return spec


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutation=_mutations(EXAMPLES))
def test_mutated_specs_fail_only_with_located_spec_errors(example_dirs: dict[str, Path], mutation) -> None:
    spec = _mutated_spec(example_dirs, mutation)
    if spec is None:
        return
    try:
        load_problem(spec)
    except SpecError as err:
        assert err.span is not None, str(err)
        assert err.span.file == str(spec)
    except HetcompileError:
        pass  # e.g. an unreadable profiles path: still a user error, printed without a traceback


# values that often load, so that build runs its passes on them: free and tiny prices and budgets,
# tiny and huge rates, availability, token counts and solver settings
PLAUSIBLE_VALUES = st.sampled_from([
    0, 1, 2, 7, 64, 100_000, "0", "$0/h", "$0.0005/h", "$1e6/h", "1e-6/s", "1000/s", "0.001ms", "1%", "100%",
    "1e-9s", "99%", "fp16", "min-cost", "max-throughput-per-dollar", "min-makespan", 0.5, 3000,
])


def _leaves(ex: str) -> list[tuple]:
    data = yaml.safe_load((ROOT / "examples" / ex / "spec.yaml").read_text())
    out = []
    for path in _paths(data):
        cur = data
        for k in path:
            cur = cur[k]
        if path and not isinstance(cur, (dict, list)):
            out.append(path)
    return out


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutation=st.sampled_from(["quickstart", "tiny-cpu"]).flatmap(lambda ex: st.tuples(
    st.just(ex), st.sampled_from(_leaves(ex)), st.just("set"), PLAUSIBLE_VALUES)))
def test_validate_and_build_agree(example_dirs: dict[str, Path], mutation) -> None:
    spec = _mutated_spec(example_dirs, mutation)
    if spec is None:
        return
    try:
        load_problem(spec)
        valid = None
    except HetcompileError as err:
        valid = str(err)
    try:
        compile_spec(spec, verify=False)  # where build stops on a bad spec: before any simulation
        built = None
    except PassError as err:  # a pass crashed on a spec that loaded: always a bug
        raise AssertionError(f"{mutation!r}: {err}") from None
    except HetcompileError as err:
        built = str(err)
    if valid is not None:
        assert built == valid  # build stops where validate stops, with the same message


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.lists(st.sampled_from(list("ab:-[]{}&*!<>|'\"#?,\n \t\x00\x07\ufeff9.") + ["&a ", "*a", "<<: ", "\n  "]),
                     max_size=200).map("".join))
def test_random_texts_load_or_fail_located(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    spec = tmp_path_factory.getbasetemp() / "random.yaml"
    spec.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    try:
        read_spec(spec)
    except SpecError as err:
        assert err.span is not None, repr(text)


def test_cli_prints_located_errors_without_tracebacks(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(_alias_bomb(9).encode())
    for cmd in ("validate", "build"):
        proc = subprocess.run([sys.executable, "-m", "hetcompile.cli", cmd, str(spec), "-o", str(tmp_path / "o")]
                              if cmd == "build" else [sys.executable, "-m", "hetcompile.cli", cmd, str(spec)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.returncode == 4  # a spec error (errors.EXIT_SPEC)
        assert f"{spec}:5:" in proc.stderr and "aliases expand" in proc.stderr  # a4, the first alias past the budget
        assert "Traceback" not in proc.stderr
