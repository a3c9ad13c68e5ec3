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


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_serve_refuses_a_port_out_of_range(port, capsys):
    """uvloop binds another port for one past 65535, while uvicorn prints the one asked for."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--port", port])
    assert exit_info.value.code == 2
    assert "--port" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--concurrency", "0"), ("--checkpoint-every", "0"), ("--prompts", "0"),
                                              ("--held-out", "1"), ("--batch-size", "0"), ("--lr", "0")])
def test_train_mtp_refuses_values_that_fail_after_the_model_loads(flag, value, tmp_path, capsys):
    from speclane.cli import main

    assert main(["train-mtp", "--out", str(tmp_path / "out"), flag, value]) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.parametrize(("flag", "value"), [("--replicas", "0"), ("--counter-sync-ms", "nan")])
def test_simulate_refuses_replicas_below_one_and_a_bad_sync_interval(flag, value, tmp_path, capsys):
    from speclane.cli import main

    assert main(["simulate", "--out", str(tmp_path), "--requests", "10", flag, value]) == 2
    assert flag in capsys.readouterr().err


def test_serve_refuses_a_port_another_process_holds_before_the_model_loads(capsys):
    import socket

    from speclane.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", "no-such-model"]) == 2  # the model is never looked up
    err = capsys.readouterr().err
    assert err.startswith(f"speclane serve: error: cannot listen on 127.0.0.1:{port}") and "in use" in err


def test_errors_name_the_flags_and_the_environment_variables(capsys, monkeypatch):
    from speclane.cli import main

    assert main(["generate", "--max-model-len", "8", "hi"]) == 2
    assert capsys.readouterr().err.strip() == "speclane generate: error: --max-model-len must be >= 16; got 8"
    monkeypatch.setenv("SPECLANE_SPEC_SLOTS", "abc")
    assert main(["generate", "hi"]) == 2
    assert capsys.readouterr().err.strip() == "speclane generate: error: SPECLANE_SPEC_SLOTS: not an integer: 'abc'"


def test_bench_help_lists_the_scenarios(capsys):
    from speclane.bench.cli import SCENARIOS

    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in SCENARIOS)


def test_the_port_check_binds_as_uvicorn_does():
    """Every address the host resolves to, IPv6 apart from IPv4: a port held on 127.0.0.1
    leaves [::] free, and the message writes an IPv6 host in brackets."""
    import socket

    from speclane.server.app import check_listening

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}: address already in use"):
            check_listening("127.0.0.1", port)
        if socket.has_ipv6:
            try:
                check_listening("::", port)
            except ValueError as exc:
                assert "Address family" in str(exc) or "not available" in str(exc), exc  # no IPv6 on this host
