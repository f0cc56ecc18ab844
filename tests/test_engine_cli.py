"""``homing queues``: the engine from the shell, on both backends."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
from click.testing import CliRunner

from homing.cli import cli


def run(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--db", url, "queues", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_queues_cli_end_to_end(store_url: str) -> None:
    assert run(store_url, "create", "print", "--dead-letter", "$dead")[0] == 0
    assert run(store_url, "create", "out")[0] == 0
    code, out, _ = run(
        store_url,
        "bind",
        "print",
        "bw",
        "--consumer",
        "bw-1",
        "--match",
        '{"color": false}',
        "--credits",
        "2",
    )
    assert code == 0 and "bound print/bw" in out
    assert run(store_url, "bind", "print", "copy-out", "--to", "out", "--mode", "copy")[0] == 0

    code, out, _ = run(
        store_url, "publish", "print", '{"doc": 1}', "--headers", '{"color": false}', "--json"
    )
    assert code == 0 and json.loads(out)["outcome"] == "routed"
    code, out, _ = run(store_url, "publish", "print", '{"doc": 2}', "--headers", '{"color": true}')
    assert code == 0 and out.strip().endswith("processed")  # copied to "out", nothing to move it
    code, out, _ = run(store_url, "publish", "nowhere", "hello", "--raw", "--json")
    assert code == 0 and json.loads(out)["outcome"] == "dead-lettered"

    code, out, _ = run(store_url, "list", "--json")
    graph = {q["name"]: q for q in json.loads(out)["queues"]}
    assert graph["print"]["outstanding"] == 1
    (bw,) = [s for s in graph["print"]["selectors"] if s["name"] == "bw"]
    assert (bw["credits"], bw["granted"], bw["outstanding"]) == (1, 2, 1)
    assert graph["out"]["ready"] == 2
    assert graph["$dead"]["ready"] == 1
    code, out, _ = run(store_url)  # no subcommand: the table
    assert code == 0 and "print" in out and "bw" in out

    code, out, _ = run(store_url, "dead-letters", "--json")
    (dead,) = json.loads(out)
    assert dead["address"] == "nowhere" and dead["body_base64"] == "aGVsbG8="
    code, _, err = run(store_url, "redrive", str(dead["seq"]))
    assert code == 1 and "does not exist" in err  # refused, nothing changed
    code, out, _ = run(store_url, "redrive", str(dead["seq"]), "--to", "out", "--json")
    assert code == 0 and json.loads(out)["queue"] == "out"
    assert json.loads(run(store_url, "dead-letters", "--json")[1]) == []

    code, out, _ = run(store_url, "unbind", "print", "bw", "--json")
    assert code == 0 and len(json.loads(out)["returned"]) == 1
    code, _, err = run(store_url, "delete", "print")
    assert code == 1 and "in use" in err
    assert run(store_url, "delete", "print", "--force")[0] == 0
    code, out, _ = run(store_url, "check")
    assert code == 0 and out.startswith("ok")


def test_queues_cli_bad_input_is_a_clear_error(store_url: str) -> None:
    run(store_url, "create", "a")
    run(store_url, "create", "b")
    run(store_url, "bind", "a", "ab", "--to", "b")
    cases = [
        (("bind", "b", "ba", "--to", "a"), "loop"),
        (
            ("bind", "a", "x", "--consumer", "c", "--match", '{"n": {"$regex": "."}}'),
            "unknown operator",
        ),
        (("bind", "a", "x", "--consumer", "c", "--match", "{not json"), "not valid JSON"),
        (("bind", "missing", "x", "--consumer", "c"), "no queue"),
        (("publish", "a", "{bad"), "not valid JSON"),
        (("create", "$x"), "reserved"),
        (("redrive", "12345"), "no unprocessed message"),
        (("unbind", "a", "nope"), "no selector"),
    ]
    for args, expected in cases:
        code, out, err = run(store_url, *args)
        assert code != 0, args
        assert expected in out + err, (args, out, err)
        assert "Traceback" not in out + err


def test_printer_example_runs(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    example = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "engine_printers.py"))
    example["main"](store_url)
    out = capsys.readouterr().out
    assert "publish photo    colour=True  -> dead-lettered" in out
    assert "bw-1 prints invoice and pays" in out
    assert "client-1 queue gone: True" in out


def test_group_json_flag_applies_to_subcommands(store_url: str) -> None:
    """``homing queues --json list`` prints JSON, as ``homing queues list --json`` does."""
    assert run(store_url, "create", "dlq")[0] == 0
    code, out, _ = run(
        store_url,
        "create",
        "q",
        "--dead-letter",
        "dlq",
        "--max-deliveries",
        "3",
        "--message-ttl",
        "60",
        "--on-overflow",
        "drop-head",
        "--max-unprocessed",
        "5",
    )
    assert code == 0
    for args in (("--json", "list"), ("list", "--json"), ("--json",)):
        code, out, _ = run(store_url, *args)
        assert code == 0, out
        data = json.loads(out)
        (q,) = [x for x in data["queues"] if x["name"] == "q"]
        assert (q["max_deliveries"], q["message_ttl"], q["on_overflow"]) == (3, 60.0, "drop-head")
    code, out, _ = run(store_url, "--json", "sweep")
    assert code == 0 and json.loads(out) == {"handled": 0}
    code, out, _ = run(store_url, "--json", "dead-letters", "--queue", "dlq")
    assert code == 0 and json.loads(out) == []
