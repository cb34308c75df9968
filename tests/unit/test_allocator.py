"""broker.allocator: when ``serve`` re-executes itself with jemalloc, and with what environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.allocator import EXEC_MARK, Allocator, AllocatorError, choose, loaded_jemalloc, plan, serve_mode

pytestmark = pytest.mark.unit

LIB = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234   /root/.pyenv/versions/3.11.7/bin/python3.11
7f3a10000000-7f3a10021000 rw-p 00000000 00:00 0
7f3a11000000-7f3a11030000 r-xp 00000000 fe:01 5678   /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
7ffd2a000000-7ffd2a021000 rw-p 00000000 00:00 0      [stack]
"""


def test_a_found_library_is_preloaded_once_and_the_second_run_is_marked() -> None:
    env, line = plan(Allocator.AUTO, {"PATH": "/bin", "LD_PRELOAD": "/opt/other.so"}, None, LIB)
    assert env == {"PATH": "/bin", "LD_PRELOAD": f"{LIB} /opt/other.so", EXEC_MARK: "1"}
    assert line == f"allocator: jemalloc ({LIB})"
    env, _ = plan(Allocator.JEMALLOC, {}, None, LIB)
    assert env == {"LD_PRELOAD": str(LIB), EXEC_MARK: "1"}


def test_nothing_is_re_executed_when_jemalloc_is_loaded_or_not_wanted() -> None:
    assert plan(Allocator.AUTO, {}, str(LIB), LIB) == (None, f"allocator: jemalloc ({LIB})")
    assert plan(Allocator.JEMALLOC, {EXEC_MARK: "1"}, str(LIB), LIB)[0] is None
    assert plan(Allocator.SYSTEM, {}, None, LIB) == (None, "allocator: glibc malloc (--allocator system)")


def test_without_the_library_auto_falls_back_and_jemalloc_refuses() -> None:
    env, line = plan(Allocator.AUTO, {}, None, None)
    assert env is None and line.startswith("allocator: glibc malloc (no libjemalloc found; apt-get install")
    with pytest.raises(AllocatorError, match="no libjemalloc was found"):
        plan(Allocator.JEMALLOC, {}, None, None)


def test_a_library_that_did_not_load_never_re_executes_again() -> None:
    """The second run is marked: if the preload did not take, auto goes on with glibc's malloc."""
    env, line = plan(Allocator.AUTO, {EXEC_MARK: "1", "LD_PRELOAD": str(LIB)}, None, LIB)
    assert env is None and line.endswith("did not load; glibc malloc")
    with pytest.raises(AllocatorError, match="did not load"):
        plan(Allocator.JEMALLOC, {EXEC_MARK: "1", "LD_PRELOAD": str(LIB)}, None, LIB)


def test_the_mapped_library_is_read_from_proc_maps() -> None:
    assert loaded_jemalloc(MAPS) == str(LIB)
    assert loaded_jemalloc(MAPS.replace("libjemalloc.so.2", "libc.so.6")) is None
    assert loaded_jemalloc("") is None


def test_choose_executes_the_same_command_line_with_the_new_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("broker.allocator.loaded_jemalloc", lambda: None)
    monkeypatch.setattr("broker.allocator.find_jemalloc", lambda: LIB)
    monkeypatch.delenv(EXEC_MARK, raising=False)
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    line = choose(Allocator.AUTO, ["python", "-m", "broker.cli.main", "serve"],
                  execve=lambda path, argv, env: calls.append((path, argv, env)))
    assert line == f"allocator: jemalloc ({LIB})"
    [(path, argv, env)] = calls
    assert argv == ["python", "-m", "broker.cli.main", "serve"]
    assert env["LD_PRELOAD"].split()[0] == str(LIB) and env[EXEC_MARK] == "1"


@pytest.mark.parametrize("argv, env, mode", [
    (["raftbroker", "serve", "--node-id", "n1"], {}, Allocator.AUTO),
    (["raftbroker", "serve", "--allocator", "system"], {}, Allocator.SYSTEM),
    (["raftbroker", "serve", "--allocator=jemalloc"], {"RAFTBROKER_ALLOCATOR": "system"}, Allocator.JEMALLOC),
    (["raftbroker", "serve"], {"RAFTBROKER_ALLOCATOR": "system"}, Allocator.SYSTEM),
    (["raftbroker", "--bootstrap", "serve", "serve"], {}, Allocator.AUTO),  # a global option's value first
    (["raftbroker", "--bootstrap", "serve", "topic", "list"], {}, None),
    (["raftbroker", "publish", "serve", "hello"], {}, None),  # a topic named serve
    (["raftbroker", "serve", "--allocator", "tcmalloc"], {}, None),  # left to the CLI to refuse
    (["raftbroker"], {}, None),
])
def test_the_serve_command_and_its_mode_are_read_before_the_cli_loads(
        argv: list[str], env: dict[str, str], mode: Allocator | None) -> None:
    assert serve_mode(argv, env) is mode


def test_grpc_verbosity_is_error_for_a_node_none_for_other_commands_and_the_callers_own_is_kept() -> None:
    from broker.cli.launch import QUIET_MARK, grpc_verbosity

    node: dict[str, str] = {}
    grpc_verbosity(["raftbroker", "--json", "serve", "--node-id", "a"], node)
    assert node == {"GRPC_VERBOSITY": "ERROR"}
    cli: dict[str, str] = {}
    grpc_verbosity(["raftbroker", "--bootstrap", "serve", "topic", "list"], cli)  # "serve" is the option's value
    assert cli == {"GRPC_VERBOSITY": "NONE", QUIET_MARK: "1"}
    inherited = dict(cli)  # a node `raftbroker dev` started: our NONE is not the caller's choice
    grpc_verbosity(["raftbroker", "serve"], inherited)
    assert inherited == {"GRPC_VERBOSITY": "ERROR"}
    for command in (["raftbroker", "serve"], ["raftbroker", "topic", "list"]):
        chosen = {"GRPC_VERBOSITY": "DEBUG"}
        grpc_verbosity(command, chosen)
        assert chosen == {"GRPC_VERBOSITY": "DEBUG"}
