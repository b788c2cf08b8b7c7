"""contrib/'s pipelines cannot run here (GitHub, Zuul, Jenkins); what can be checked is: every
YAML file parses, and every `reconciler` command line in them names a command and options
that the CLI has."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from reconciler.cli import cli

CONTRIB = Path(__file__).resolve().parent.parent / "contrib"
FILES = sorted([*CONTRIB.glob("github/*.yml"), *CONTRIB.glob("gerrit/**/*.yaml"), CONTRIB / "gerrit/review.sh"])


class AnyTag(yaml.SafeLoader):
    """Zuul's !encrypted/... tags are data to Zuul, not to us."""


AnyTag.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_every_yaml_file_parses() -> None:
    yamls = [f for f in FILES if f.suffix in (".yml", ".yaml")]
    assert len(yamls) == 4
    for f in yamls:
        assert yaml.load(f.read_text(), Loader=AnyTag), f


def test_every_reconciler_command_line_uses_commands_and_options_that_exist() -> None:
    seen = set()
    for f in FILES:
        text = re.sub(r"\\\n\s*|>\n\s*|\n\s{8,}", " ", f.read_text())  # folded and continued lines as one
        for cmd, rest in re.findall(r"reconciler (validate|diff|status|history|review-post)\b([^\n]*)", text):
            usage = CliRunner().invoke(cli, [cmd, "--help"]).output
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", rest):
                assert re.search(rf"{re.escape(option)}(?![\w-])", usage), (f.name, cmd, option)
            seen.add(cmd)
    assert seen == {"validate", "diff", "status", "review-post"}
