"""The CLI surface, frozen: a change to a command or an option must change this test too.

Other tools, CI jobs and the docs call these names (the CLI contract, docs/contract.md).
"""

import typer.main

from bisect_prefetch.cli import app
from bisect_prefetch.commands.common import COMMAND_OPTIONS

SURFACE = {
    "aa": {"experiment", "--mask", "--runs", "--steps", "--guard", "--json", "--state-dir",
           "--executor", "--slots", "--stress", "--reuse", "--no-reuse", "--resume"},
    "audit": {"experiment", "--guard", "--kinds", "--json", "--state-dir"},
    "bisect": {"experiment", "--confidence", "--max-runs", "--resume", "--json", "--state-dir",
               "--executor", "--slots", "--stress", "--segments", "--reuse", "--no-reuse",
               "--explain"},
    "compare": {"a", "b", "--format", "--json", "--allow-truncated"},
    "explain": {"experiment", "--mask", "--stress", "--runs", "--steps", "--all-units", "--json",
                "--state-dir", "--resume"},
    "graph": {"experiment", "--policy", "--layers", "--format", "--out", "--state-dir"},
    "init": {"command", "--out", "--log", "--steps", "--force", "--state-dir"},
    "masks": {"experiment", "--policy", "--layers", "--preset", "--state-dir"},
    "matrix": {"matrix_file", "--junit", "--markdown", "--json", "--state-dir", "--executor",
               "--slots", "--stress", "--reuse", "--no-reuse", "--resume"},
    "report": {"state", "--html"},
    "simulate": {
        "--policy", "--layers", "--culprit", "--together", "--hazard", "--steps", "--trials",
        "--seed", "--background", "--startup-cost", "--confidence", "--max-runs", "--slots",
        "--stress-factor", "--stress-cost", "--segments",
        "--hint-accuracy", "--all-off-runs", "--json",
    },
}


def surface() -> dict[str, set[str]]:
    group = typer.main.get_command(app)
    return {
        name: {opt for p in cmd.params
               for opt in (p.opts + p.secondary_opts if p.param_type_name == "option" else [p.name])}
        for name, cmd in group.commands.items()
    }


def test_every_command_and_option_is_as_documented():
    assert surface() == SURFACE


def test_printed_commands_know_every_option_of_the_commands_they_name():
    """A resume, reproduce or explain line carries every option given that its command
    accepts (commands/common.Given): the lists it goes by are the CLI's."""
    for name, accepted in COMMAND_OPTIONS.items():
        flags = {o[2:].replace("-", "_") for o in SURFACE[name] if o.startswith("--")}
        assert flags == set(accepted), name


def test_every_command_has_help_text():
    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        assert cmd.help, f"{name} has no help text"


def test_every_command_takes_h_and_the_tool_says_its_version(capsys):
    """`-h` as well as `--help` on every command, values shown by what they are (a metavar)
    and not by their Python type; `--version` from the installed package."""
    from importlib.metadata import version

    from bisect_prefetch.cli import main

    for name in SURFACE:
        assert main([name, "-h"]) == 0
        shown = capsys.readouterr().out
        assert f"Usage: bisect-prefetch {name}" in shown
        # init's COMMAND... argument keeps typer's `<list[str]>`: typer shows an argument's type
        leaks = {"<int>", "<float>", "<str>", "<int range>"} | (
            set() if name == "init" else {"<list[str]>"})
        assert not [t for t in leaks if t in shown], shown
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bisect-prefetch {version('bisect-prefetch')}"
