"""The README's commands name real subcommands and options, and their configs and overrides validate: a newcomer
copying them meets no unknown option or key."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from r1trade.cli import app
from r1trade.config import load_config

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> list[list[str]]:
    """Every `r1trade ...` command in the README's bash blocks, continuation lines joined, shell variables set."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    variables: dict[str, str] = {}
    commands = []
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S+", words[0]):
            name, value = words[0].split("=", 1)
            variables[name] = value
        elif words and words[0] == "r1trade":
            commands.append([re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], word) for word in words])
    return commands


def test_the_readme_has_commands_to_check() -> None:
    assert len(readme_commands()) >= 15


@pytest.mark.parametrize("words", readme_commands(), ids=lambda words: " ".join(words[:2]))
def test_a_readme_command_is_valid(words: list[str]) -> None:
    commands = typer.main.get_command(app).commands
    assert words[1] in commands, f"no subcommand {words[1]}"
    options = {name for param in commands[words[1]].params for name in param.opts}
    for word in words[2:]:
        if word.startswith("--"):
            assert word.split("=", 1)[0] in options, f"{words[1]} has no option {word}"
    if "--config" in words:
        overrides = [words[k + 1] for k, word in enumerate(words) if word == "--set"]
        load_config(words[words.index("--config") + 1], overrides)  # raises on an unknown key or a bad value
