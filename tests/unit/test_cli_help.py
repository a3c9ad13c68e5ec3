"""`speclane <command> --help` prints help for every command (argparse formats help
strings with %, so a literal '%' in a flag's help once crashed it with a traceback)."""

import pytest

from speclane.cli import build_parser


def _commands() -> list[str]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sorted(subparsers.choices)


@pytest.mark.parametrize("command", _commands())
def test_help_of_every_command(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and command in out


def test_serve_refuses_a_negative_stream_interval(capsys):
    from speclane.cli import main

    assert main(["serve", "--stream-interval-ms", "-5"]) == 2  # before any model loads
    err = capsys.readouterr().err
    assert err.strip() == "speclane serve: error: --stream-interval-ms must be >= 0; got -5.0"
