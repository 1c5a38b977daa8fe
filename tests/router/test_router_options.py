"""Both router entry points share one options builder: same flags, same refusals."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hetcompile.cli import app
from hetcompile.router.__main__ import main as module_main
from hetcompile.router.options import build, build_parser, check_exposure, is_loopback
from hetcompile.router.table import RouterError


def _module(argv, capsys):
    rc = module_main(argv)
    return rc, capsys.readouterr().err


def _typer(argv):
    r = CliRunner().invoke(app, ["router", *argv])
    return r.exit_code, r.output


ENTRY = ["module", "typer"]


def _invoke(which, argv, capsys):
    return _module(argv, capsys) if which == "module" else _typer(argv)


@pytest.mark.parametrize("which", ENTRY)
@pytest.mark.parametrize("value", [None, ""])
def test_unset_or_empty_token_env_refuses(which, value, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("HC_ROUTER_TOKEN_T", raising=False)
    if value is not None:
        monkeypatch.setenv("HC_ROUTER_TOKEN_T", value)
    rc, err = _invoke(which, ["--table", str(tmp_path / "nope.json"), "--auth-token-env", "HC_ROUTER_TOKEN_T"], capsys)
    assert rc == 2
    assert "--auth-token-env HC_ROUTER_TOKEN_T: the variable is not set or empty" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("which", ENTRY)
def test_non_loopback_without_token_refuses(which, capsys, tmp_path):
    rc, err = _invoke(which, ["--table", str(tmp_path / "nope.json"), "--host", "0.0.0.0"], capsys)
    assert rc == 2
    assert "--host 0.0.0.0 is not loopback" in err and "--allow-unauthenticated" in err


@pytest.mark.parametrize("which", ENTRY)
def test_allow_unauthenticated_passes_validation(which, capsys, tmp_path):
    # validation passes, then the missing table is the (clear) error: nothing listened
    rc, err = _invoke(which, ["--table", str(tmp_path / "nope.json"), "--host", "0.0.0.0",
                              "--allow-unauthenticated"], capsys)
    assert rc == 2
    assert "not loopback" not in err and "nope.json" in err


def test_same_defaults_both_entry_points():
    a = build_parser().parse_args(["--table", "t.json"])
    b = build_parser("hetcompile router").parse_args(["--table", "t.json"])
    assert vars(a) == vars(b)
    r = CliRunner().invoke(app, ["router", "--help"])
    assert r.exit_code == 0
    for flag in ("--auth-token-env", "--allow-unauthenticated", "--read-timeout", "--max-retries", "--fail-threshold"):
        assert flag in r.output


def test_token_and_loopback_checks(monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5")
    check_exposure("0.0.0.0", "tok", False)
    check_exposure("0.0.0.0", None, True)
    with pytest.raises(RouterError):
        check_exposure("10.0.0.5", None, False)
    monkeypatch.setenv("HC_ROUTER_TOKEN_T", "s3cret")
    options, token = build(build_parser().parse_args(["--table", "t.json", "--host", "0.0.0.0",
                                                      "--auth-token-env", "HC_ROUTER_TOKEN_T", "--read-timeout", "7"]))
    assert token == "s3cret" and options.read_timeout == 7.0
