"""Real torchtitan 0.3.0 as a client job: its own trainer, `torchtitan.train`,
llama3 `debugmodel` (6 layers), FSDP2 over gloo on 2 CPU ranks, in its own venv
(`.venv-torchtitan`, `make torchtitan-venv`), reached zero-touch.

The job is torchtitan's, started through tests/jobs/torchtitan_cpu.py: a test device that lets
torchtitan run on CPU and runs `torchtitan.train` unchanged (real users run on GPUs). Neither
it nor the asset script (tests/jobs/torchtitan_assets.py: tokenizer and dataset, made here) imports
anything of bisect-prefetch. The planted fault is the wrapper's own (`--fault-target`,
`--fault-hazard`): the tool is never told which edge it rides on.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.graph import from_policy
from tests.conftest import read_ranks, run_json

TESTS = Path(__file__).resolve().parents[1]
VENV = TESTS.parent / ".venv-torchtitan"
WRAPPER = TESTS / "jobs" / "torchtitan_cpu.py"
ASSETS = TESTS / "jobs" / "torchtitan_assets.py"
LAYERS = 6
TARGET = "layers.3"  # the fault's unit; the edge into it is layers.4's backward prefetch
PLANTED = "bwd:layers.4->layers.3"


def _venv() -> Path:
    if not (VENV / ".installed").is_file():
        pytest.skip("torchtitan's venv is not built (make torchtitan-venv)")
    return VENV


@pytest.fixture(scope="session")
def titan_assets(tmp_path_factory) -> Path:
    """Tokenizer and dataset folders, made once a session with torchtitan's interpreter."""
    out = tmp_path_factory.mktemp("torchtitan-assets")
    subprocess.run([str(_venv() / "bin" / "python"), str(ASSETS), str(out)], check=True,
                   timeout=300)
    return out


def _command(assets: Path, *wrapper_args: str) -> list[str]:
    """torchtitan's own command line (tyro flags), under torchtitan's own torchrun."""
    return [
        str(VENV / "bin" / "torchrun"), "--nnodes=1", "--nproc_per_node=2",
        "--master_port={port}", str(WRAPPER), *wrapper_args,
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--hf-assets-path", str(assets / "tokenizer"),
        "--dataloader.dataset-path", str(assets / "c4_test"),
        "--dump-folder", "{run_dir}/dump",
        "--training.seq-len", "128", "--training.local-batch-size", "2",
        "--training.steps", "{steps}", "--debug.seed", "{seed}", "--debug.deterministic",
        "--parallelism.spmd-backend", "partial_dtensor",
    ]  # fmt: skip


def _experiment(folder: Path, assets: Path, *, name: str, steps: int, graph: str,
                wrapper_args: tuple[str, ...] = (), extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        command: {json.dumps(_command(assets, *wrapper_args))}
        env: {{HF_HUB_OFFLINE: "1", HF_DATASETS_OFFLINE: "1",
              HF_DATASETS_CACHE: {json.dumps(str(assets / "datasets-cache"))}}}
        metrics: {{format: torchtitan, names: [loss, grad_norm]}}
        graph: {graph}
        steps: {steps}
        seed: 7
        timeout_s: 300
    """) + extra)
    return path


@pytest.fixture(scope="module")
def clean(tmp_path_factory, titan_assets) -> Path:
    """torchtitan without a fault, its graph discovered at run time; one state dir for the
    module, so `audit` reuses the graph the discovery run of `graph` found."""
    folder = tmp_path_factory.mktemp("torchtitan-clean")
    return _experiment(folder, titan_assets, name="titan", steps=3, graph="{source: runtime}")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, titan_assets) -> Path:
    """torchtitan with the wrapper's fault on the backward prefetch into TARGET (chance 0.8 a
    step, 2 steps: 0.96 a run), on the static torchtitan policy: no discovery run."""
    folder = tmp_path_factory.mktemp("torchtitan-fault")
    return _experiment(
        folder, titan_assets, name="titan-fault", steps=2,
        graph=f"{{source: static, policy: torchtitan, layers: {LAYERS}}}",
        wrapper_args=("--fault-target", TARGET, "--fault-hazard", "0.8"),
        extra="search: {confidence: 0.9, max_runs: 24}\n")


def test_graph_lists_torchtitans_units_and_the_static_policy_is_that_graph(clean, capsys):
    out = clean.parent / "graph.json"
    code = main(["graph", str(clean), "--format", "json", "--out", str(out),
                 "--state-dir", str(clean.parent / "state")])
    assert code == 0, capsys.readouterr().out
    real = json.loads(out.read_text())
    units = ["tok_embeddings", *[f"layers.{i}" for i in range(LAYERS)], "norm+lm_head", "root"]
    assert [n["name"] for n in real["nodes"]] == units
    chain = units[:-1]
    assert [e["id"] for e in real["edges"]] == [
        f"bwd:{b}->{a}" for a, b in reversed(list(zip(chain, chain[1:], strict=False)))]
    nodes = {n["name"]: n for n in real["nodes"]}
    assert nodes["root"]["order"] is None  # parameterless: it only groups the others
    assert {n["shard_size"] for name, n in nodes.items() if name != "root"} == {2}

    # The static policy describes 0.3.0: the same units, kinds, order and edge ids.
    static = from_policy("torchtitan", LAYERS).to_dict()
    assert [(n["name"], n["kind"], n["order"]) for n in static["nodes"]] == [
        (n["name"], n["kind"], n["order"]) for n in real["nodes"]]
    assert [e["id"] for e in static["edges"]] == [e["id"] for e in real["edges"]]


def test_audit_reads_torchtitans_run(clean, capsys):
    code, result = run_json(clean.parent, "audit", str(clean))
    out = capsys.readouterr().out
    assert code == 0 and result["ok"], out
    assert {e["id"] for e in result["edges"]} == set(from_policy("torchtitan", LAYERS).edge_ids())
    assert all(e["target_shard_size"] == 2 and not e["size_one"] and e["async_unshards"]
               for e in result["edges"]), result["edges"]
    assert result["findings"] == []


def test_the_wrappers_fault_diverges_aa_and_is_localized_to_its_unit(faulty, capsys):
    code, result = run_json(faulty.parent, "aa", str(faulty), "--runs", "2")
    out = capsys.readouterr().out
    assert code == 1 and result["verdict"] == "diverged", out
    where = result["localization"]
    assert where["unit"] == TARGET and where["rule"] == "values", where
    assert result["first_diff_step"] == where["step"]
    for run in result["run_details"]:
        if run["localization"] is not None:
            assert run["localization"]["unit"] == TARGET, run
    # The static policy's edges are the ones the job fires: all on, none masked, none missing.
    static = set(from_policy("torchtitan", LAYERS).edge_ids())
    runs = faulty.parent / "state" / "titan-fault" / "runs"
    probes = [json.loads(p.read_text()) for p in runs.glob("*aa*/probe.rank*.json")]
    assert probes
    for probe in probes:
        assert set(probe["edges"]) == static
        assert not any(e["masked"] for e in probe["edges"].values()), probe
    assert {edge for p in probes for edge, e in p["edges"].items() if e["issued"]} == static


def test_the_planted_edge_masked_off_is_consistent_with_digests_in_torchtitans_own_venv(
        faulty, capsys):
    """What a bisection would name, in one A/A group: the fault diverges with every edge on
    (above) and never with its edge off, which every rank masked at every firing. The group is
    also torchtitan's A/A with digests in its own venv: its other six edges on, each fired at
    every step on every rank, bitwise identical. The search itself on real runs:
    tests/e2e/test_two_causes.py (a user's script) and tests/e2e/test_bisect.py."""
    folder = faulty.parent / "planted-off"
    folder.mkdir()
    code, result = run_json(folder, "aa", str(faulty), "--mask", f"drop-only:{PLANTED}",
                            "--runs", "2")
    out = capsys.readouterr().out
    assert code == 0 and result["verdict"] == "consistent", out
    static = set(from_policy("torchtitan", LAYERS).edge_ids())
    assert set(result["mask"]) == static - {PLANTED} and len(result["mask"]) == 6
    assert "bitwise identical (digests)" in out
    signals = result["signals"]
    assert signals["digests"]["ranks"] == 2 and signals["step_source"] == "optimizer"
    assert set(signals["steps_counted"].values()) == {2}
    assert signals["precision"] == {"loss": 5, "grad_norm": 4}
    runs = sorted(p for p in (folder / "state" / "titan-fault" / "runs").iterdir()
                  if "aa" in p.name)
    assert len(runs) == 2
    for run_dir in runs:
        digests = read_ranks(run_dir, "digests")
        assert {d["rank"] for d in digests} == {0, 1}
        assert {d["step"] for d in digests} == {1, 2}
        for rank in (0, 1):
            probe = json.loads((run_dir / f"probe.rank{rank}.json").read_text())
            assert set(probe["edges"]) == static
            assert probe["edges"][PLANTED]["issued"] == 0 and probe["edges"][PLANTED]["masked"] > 0
            assert all(e["issued"] == 2 and e["masked"] == 0
                       for edge, e in probe["edges"].items() if edge != PLANTED), probe
        # The job ran torchtitan 0.3.0, which only torchtitan's venv holds.
        assert "torchtitan version: 0.3.0" in (run_dir / "stdout.log").read_text()
    # The journal's environment is the job's, taken inside it: torchtitan's venv, 2 ranks.
    for run in result["run_details"]:
        environment = run["environment"]
        assert environment["executable"].startswith(str(VENV.resolve())), environment
        assert environment["libraries"]["torchtitan"] == "0.3.0" and environment["ranks"] == 2
        assert environment["world_size"] == 2


# -- the templates (README, configs/slurm-fsdp2.yaml) on torchtitan 0.3.0 as written ----------
PARSE = """
import json, sys
from torch.distributed.run import get_args_parser
from torchtitan.config import ConfigManager
out = {}
for where, argv in json.loads(sys.argv[1]).items():
    launch = get_args_parser().parse_args(argv)
    config = ConfigManager().parse_args(launch.training_script_args)
    out[where] = {"module": launch.module, "script": launch.training_script,
                  "steps": config.training.steps, "seed": config.debug.seed,
                  "deterministic": config.debug.deterministic, "assets": config.hf_assets_path}
print(json.dumps(out))
"""


def _template_commands() -> dict[str, list[str]]:
    import yaml

    commands = {}
    for doc in ("README.md", "docs/slurm.md"):
        text = (TESTS.parent / doc).read_text()
        blocks = [b.split("```", 1)[0] for b in text.split("```yaml")[1:]]
        commands |= {f"{doc} {k}": yaml.safe_load(block)["command"]
                     for k, block in enumerate(b for b in blocks if "torchtitan.train" in b)}
    lines = (TESTS.parent / "configs" / "slurm-fsdp2.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#   command:"))
    end = next(i for i in range(start, len(lines)) if "]" in lines[i].split("#", 2)[1])
    text = "\n".join(line[1:] for line in lines[start:end + 1])
    commands["configs/slurm-fsdp2.yaml"] = yaml.safe_load(text)["command"]
    return commands


def test_the_torchtitan_templates_parse_on_030_as_written():
    """torchrun's and torchtitan's own parsers (tyro) read the README's and
    configs/slurm-fsdp2.yaml's torchtitan commands as written."""
    commands = {}
    for where, command in _template_commands().items():
        assert command[0] == "torchrun", where
        commands[where] = [word.replace("{steps}", "10").replace("{seed}", "1234")
                           .replace("{port}", "29500").replace("$MASTER_ADDR", "node1")
                           for word in command[1:]]
    done = subprocess.run([str(_venv() / "bin" / "python"), "-c", PARSE, json.dumps(commands)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.splitlines()[-1])
    assert set(parsed) == {"README.md 0", "docs/slurm.md 0", "configs/slurm-fsdp2.yaml"}
    for where, got in parsed.items():
        assert got["module"] and got["script"] == "torchtitan.train", where
        assert (got["steps"], got["seed"], got["deterministic"]) == (10, 1234, True), where
