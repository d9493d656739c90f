"""The graph and masks commands through the CLI: JSON, --out, presets, one-line errors."""

import json

from bisect_prefetch.cli import main


def test_graph_json_mindformers_4(capsys):
    assert main(["graph", "--policy", "mindformers", "--layers", "4", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in data["nodes"]] == [
        "embedding", "decoder.layers.0", "decoder.layers.1", "decoder.layers.2", "decoder.layers.3",
        "decoder.final_layernorm", "output_layer"]
    phases = [e["phase"] for e in data["edges"]]
    assert phases.count("fwd") == 6 and phases.count("bwd") == 5
    assert {"id", "phase", "src", "dst"} <= set(data["edges"][0])


def test_graph_out_file(tmp_path, capsys):
    out = tmp_path / "g.dot"
    assert main(["graph", "--policy", "fsdp2-chain", "--layers", "3", "--format", "dot", "--out", str(out)]) == 0
    assert "digraph" in out.read_text()


def test_masks_preset(capsys):
    assert main(["masks", "--policy", "mindformers", "--layers", "4",
                 "--preset", "keep-only:bwd:decoder.layers.1->*"]) == 0
    out = capsys.readouterr().out
    assert "1 enabled, 10 disabled" in out
    assert "+ bwd:decoder.layers.1->decoder.layers.0" in out


def test_user_errors_are_one_line_exit_2(capsys):
    assert main(["masks", "--policy", "mindformers", "--layers", "4", "--preset", "keep-only:bwd:nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: selector") and "Traceback" not in err
    assert main(["graph", "--policy", "nope", "--layers", "2"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert main(["graph"]) == 2
    assert main(["graph", "--policy", "mindformers", "--layers", "2", "--format", "png"]) == 2
