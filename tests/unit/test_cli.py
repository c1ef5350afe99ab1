"""The `reservoir` / `kubectl reservoir` command line: kubeconfig resolution as kubectl does it (shared.kube), the
output formats of `reservoir status` (agent.commands) and how a failing command ends (reservoir.cli)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from agent.commands import render_status, render_table, status_document
from agent.planner.model import Lock
from agent.planner.plan import current_locks, plan
from agent.published import published_document, render
from certs.pki import make_ca
from reservoir import cli
from shared import keys
from shared.kube import KubeconfigError, new_api_client, resolve_kubeconfig
from shared.resources import Resources
from shared.views import QueueView
from shared.watchcache import Skipped
from tests.builders import CONFIG, NOW, node, pod, snap

# --- kubeconfig resolution ---

CA_PEM = make_ca("test-ca", timedelta(days=1)).cert_pem


def kubeconfig(path: Path, *, clusters: dict[str, str] = {}, contexts: dict[str, str] = {},  # noqa: B006
               current: str | None = None, extra_user: dict[str, Any] | None = None) -> Path:
    """A kubeconfig at `path`: clusters name -> server, contexts name -> cluster (each with a user of its name)."""
    data: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": s, "certificate-authority": "ca.crt"}}
                     for n, s in clusters.items()],
        "contexts": [{"name": n, "context": {"cluster": c, "user": n}} for n, c in contexts.items()],
        "users": [{"name": n, "user": {"token": f"token-{n}", **(extra_user or {})}} for n in contexts],
    }
    if current is not None:
        data["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    (path.parent / "ca.crt").write_bytes(CA_PEM)
    return path


def server_of(resolved: Any) -> str:
    context = next(c for c in resolved.config["contexts"] if c["name"] == resolved.context)
    cluster = next(c for c in resolved.config["clusters"] if c["name"] == context["context"]["cluster"])
    return str(cluster["cluster"]["server"])


def test_explicit_kubeconfig_wins_over_the_environment_and_home(tmp_path: Path) -> None:
    explicit = kubeconfig(tmp_path / "explicit", clusters={"c": "https://explicit"}, contexts={"x": "c"}, current="x")
    env = kubeconfig(tmp_path / "env", clusters={"c": "https://env"}, contexts={"x": "c"}, current="x")
    kubeconfig(tmp_path / "home/.kube/config", clusters={"c": "https://home"}, contexts={"x": "c"}, current="x")
    resolved = resolve_kubeconfig(explicit, environ={"KUBECONFIG": str(env)}, home=tmp_path / "home")
    assert server_of(resolved) == "https://explicit" and resolved.files == (explicit,)


def test_an_explicit_kubeconfig_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=r"--kubeconfig .*missing: no such file"):
        resolve_kubeconfig(tmp_path / "missing", environ={}, home=tmp_path)


def test_kubeconfig_env_list_merges_first_file_wins(tmp_path: Path) -> None:
    a = kubeconfig(tmp_path / "a/config", clusters={"shared": "https://a"}, contexts={"from-a": "shared"})
    b = kubeconfig(tmp_path / "b/config", clusters={"shared": "https://b", "only-b": "https://only-b"},
                   contexts={"from-b": "only-b", "from-a": "only-b"}, current="from-b")
    c = kubeconfig(tmp_path / "c/config", clusters={"c": "https://c"}, contexts={"from-c": "c"}, current="from-c")
    listed = f"{a}:{tmp_path / 'missing'}::{b}:{a}:{c}"  # a missing file and an empty entry are skipped
    resolved = resolve_kubeconfig(environ={"KUBECONFIG": listed}, home=tmp_path / "home")
    assert resolved.files == (a, b, c)
    assert resolved.context == "from-b", "current-context: the first file that sets it (a does not)"
    assert server_of(resolved) == "https://only-b"
    config = resolved.config
    assert config is not None
    assert [c["name"] for c in config["clusters"]] == ["shared", "only-b", "c"]
    assert next(c for c in config["clusters"] if c["name"] == "shared")["cluster"]["server"] == "https://a"
    assert next(c for c in config["contexts"] if c["name"] == "from-a")["context"]["cluster"] == "shared"
    # a relative file reference is resolved against the directory of the file that defines it
    cas = {c["name"]: c["cluster"]["certificate-authority"] for c in config["clusters"]}
    assert cas == {"shared": str(tmp_path / "a/ca.crt"), "only-b": str(tmp_path / "b/ca.crt"),
                   "c": str(tmp_path / "c/ca.crt")}


def test_context_selects_among_the_merged_files(tmp_path: Path) -> None:
    a = kubeconfig(tmp_path / "a", clusters={"ca": "https://a"}, contexts={"xa": "ca"}, current="xa")
    b = kubeconfig(tmp_path / "b", clusters={"cb": "https://b"}, contexts={"xb": "cb"})
    env = {"KUBECONFIG": f"{a}:{b}"}
    assert server_of(resolve_kubeconfig(environ=env, home=tmp_path)) == "https://a"
    chosen = resolve_kubeconfig(context="xb", environ=env, home=tmp_path)
    assert (chosen.context, server_of(chosen)) == ("xb", "https://b")
    with pytest.raises(KubeconfigError, match=r'context "nope" not found in .*/a, .*/b'):
        resolve_kubeconfig(context="nope", environ=env, home=tmp_path)


def test_home_kube_config_when_kubeconfig_is_unset_or_empty(tmp_path: Path) -> None:
    home = kubeconfig(tmp_path / ".kube/config", clusters={"c": "https://home"}, contexts={"x": "c"}, current="x")
    for environ in ({}, {"KUBECONFIG": ""}):
        resolved = resolve_kubeconfig(environ=environ, home=tmp_path)
        assert resolved.files == (home,) and server_of(resolved) == "https://home"


def test_no_current_context_asks_for_context(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", clusters={"c": "https://c"}, contexts={"x": "c", "y": "c"})
    with pytest.raises(KubeconfigError, match=r"no current-context in .*: pass --context \(contexts: x, y\)"):
        resolve_kubeconfig(path, environ={}, home=tmp_path)


def test_a_file_that_is_not_a_kubeconfig_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(KubeconfigError, match=r"bad: not a kubeconfig"):
        resolve_kubeconfig(environ={"KUBECONFIG": str(bad)}, home=tmp_path)


def test_in_cluster_when_no_file_gives_a_configuration(tmp_path: Path) -> None:
    resolved = resolve_kubeconfig(environ={"KUBECONFIG": str(tmp_path / "missing"),
                                           "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, home=tmp_path)
    assert resolved.config is None and resolved.tried[-1] == "in-cluster"


def test_missing_everything_says_which_places_were_tried(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError) as raised:
        resolve_kubeconfig(environ={}, home=tmp_path)
    assert str(raised.value) == (f"no kubeconfig found: tried {tmp_path}/.kube/config (no file), "
                                 "in-cluster (KUBERNETES_SERVICE_HOST is not set)")
    with pytest.raises(KubeconfigError, match=r"tried \$KUBECONFIG=/nope/a:/nope/b \(no file\), in-cluster"):
        resolve_kubeconfig(environ={"KUBECONFIG": "/nope/a:/nope/b"}, home=tmp_path)


async def test_new_api_client_uses_the_chosen_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = kubeconfig(tmp_path / "a", clusters={"ca": "https://a.example:6443"}, contexts={"xa": "ca"}, current="xa")
    b = kubeconfig(tmp_path / "b", clusters={"cb": "https://b.example:6443"}, contexts={"xb": "cb"})
    monkeypatch.setenv("KUBECONFIG", f"{a}:{b}")
    for context, host, token in ((None, "https://a.example:6443", "token-xa"), ("xb", "https://b.example:6443",
                                                                                  "token-xb")):
        api = await new_api_client(context=context)
        try:
            assert api.configuration.host == host
            assert api.configuration.api_key["BearerToken"] == f"Bearer {token}"
            assert api.configuration.ssl_ca_cert == str(a.parent / "ca.crt")
        finally:
            await api.close()


# --- output formats ---

LOCK = Lock(node="n1", owner=keys.owner_id(keys.LockKind.JOB, "ns/Pod/big"), kind=keys.LockKind.JOB,
            subject="ns/Pod/big", reason="reserved for a starving job", since=NOW - timedelta(minutes=7),
            expires=NOW + timedelta(hours=1), reserved=Resources.parse({"cpu": "4"}), tasks=("ns/big",))
SKIPPED = Skipped(cache="queues", kind="Queue", name="broken", uid="u1", resource_version="7",
                  error="spec.weight: not an integer")


def snapshot() -> Any:
    """A fixed snapshot: one locked node, one free node full of a running pod, a job too big to run."""
    nodes = [node("n1", cpu="4", lock=LOCK), node("a-much-longer-node-name", cpu="4")]
    pods = [pod("hog", "4", node_name="a-much-longer-node-name"), pod("big", "8", age=timedelta(minutes=10))]
    return snap(nodes, pods)


PLANNED = NOW - timedelta(seconds=20)


def published(snapshot_: Any = None) -> dict[str, Any]:
    """What the agent publishes for the snapshot's plan (made 20s before NOW), round-tripped through its JSON."""
    result = plan(snapshot_ if snapshot_ is not None else snapshot(), CONFIG, PLANNED)
    return json.loads(render(published_document(result, agent="agent-1", planned=PLANNED, config=CONFIG)))


def status_args(snapshot_: Any = None) -> tuple[Any, Any, list[Skipped], Any]:
    """render_status's inputs: the locks on the snapshot's nodes, the published plan, one skipped object, NOW."""
    snapshot_ = snapshot_ if snapshot_ is not None else snapshot()
    return current_locks(snapshot_), published(snapshot_), [SKIPPED], NOW


def competing() -> Any:
    """Two queues with a pending pod each: the plan scores them (QueueScoreOrder). Queue `other` exists (a name no
    Queue backs is no queue of its own: shared.entitlement.honoured_queue)."""
    other = replace(pod("other", "8", age=timedelta(minutes=10)), annotations={keys.QUEUE_NAME: "other"})
    base = snapshot()
    queue = QueueView.from_obj({"metadata": {"name": "other", "uid": "q-other"}, "spec": {"weight": 1}})
    return replace(base, pods=[*base.pods, other], queues={"other": queue})


def camel(key: str) -> bool:
    return re.fullmatch(r"[a-z][a-zA-Z0-9]*", key) is not None


# values that are maps of resource names (cpu, nvidia.com/gpu), not of fields
QUANTITY_MAPS = {"reserved", "resource", "allocated", "deserved"}


def all_keys(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [k for k, v in value.items() for k in [k, *([] if k in QUANTITY_MAPS else all_keys(v))]]
    if isinstance(value, list):
        return [k for item in value for k in all_keys(item)]
    return []


def test_render_table_sizes_columns_from_their_content() -> None:
    assert render_table(["A", "LONG HEADER", "LAST"], [["xxxxxx", "y", "z z z"], ["q", "", "r"]]) == [
        "A        LONG HEADER   LAST",
        "xxxxxx   y             z z z",
        "q                      r",
    ]
    assert render_table(["NODE", "REASON"], [], "(none)") == ["NODE   REASON", "(none)"]


def test_render_table_escapes_what_a_tenant_could_use_to_fake_a_row_or_drive_the_terminal() -> None:
    """Review finding L1: a job's name or reason is a tenant's text; a newline or an escape sequence in it is shown,
    not obeyed."""
    lines = render_table(["JOB", "REASON"], [["ns/Pod/a\nn9   ns/Pod/victim", "\x1b[2Jgone"], ["ns/Pod/b", "ok \u00e9"]])
    assert len(lines) == 3
    assert lines[1] == "ns/Pod/a\\nn9   ns/Pod/victim   \\x1b[2Jgone"
    assert lines[2].endswith("ok \u00e9"), "printable non-ASCII is left as it is"


def test_json_is_the_documented_shape_all_camel_case() -> None:
    out = render_status(*status_args(), "json")
    document = json.loads(out)
    assert list(document) == ["locks", "starvingJobs", "windows", "guarantees", "skipped", "plan"]
    assert document["locks"] == [{
        "node": "n1", "owner": LOCK.owner, "kind": "job", "subject": "ns/Pod/big",
        "reason": "reserved for a starving job", "since": "2026-11-22T11:53:00Z", "age": "7m",
        "expires": "2026-11-22T13:00:00Z", "start": None, "backfilled": 0, "reserved": {"cpu": "4"},
        "tasks": ["ns/big"], "exclusive": False, "unreadable": None}]
    assert [list(j) for j in document["starvingJobs"]] == [
        ["subject", "owner", "queue", "priority", "minMember", "bound", "pending", "reason", "starvingSince", "nodes",
         "start"]]
    # starving since its creation (10m ago) + the threshold (60s); 8 cpu fit on no 4-cpu node: the plan locks nothing
    job = document["starvingJobs"][0]
    assert (job["subject"], job["starvingSince"], job["nodes"]) == ("ns/Pod/big", "2026-11-22T11:51:00Z", [])
    assert job["reason"].startswith("cannot reserve: fewer than the 1 tasks it needs fit"), job["reason"]
    assert document["skipped"] == [{"kind": "Queue", "name": "broken", "error": "spec.weight: not an integer"}]
    assert document["plan"] == {"agent": "agent-1", "planned": "2026-11-22T11:59:40Z", "age": "20s",
                                "warning": None, "omitted": {}}
    keys_seen = all_keys(document)
    assert keys_seen and all(camel(k) for k in keys_seen), [k for k in keys_seen if not camel(k)]


def test_yaml_is_the_same_document_as_json() -> None:
    as_yaml = yaml.safe_load(render_status(*status_args(), "yaml"))
    assert as_yaml == json.loads(render_status(*status_args(), "json"))
    assert as_yaml == status_document(*status_args())


def test_queues_json_and_yaml_are_camel_case() -> None:
    queues = json.loads(render_status(*status_args(competing()), "json", queues=True))
    assert sorted(q["name"] for q in queues) == ["default", "other"]
    assert set(queues[0]) == {"name", "priority", "score", "priorityScore", "drfShare", "drfScore",
                              "proportionShare", "proportionScore", "allocated", "deserved"}
    assert all(camel(k) for k in all_keys(queues))
    assert yaml.safe_load(render_status(*status_args(competing()), "yaml", queues=True)) == queues


def test_table_and_wide() -> None:
    table = render_status(*status_args(), "table").splitlines()
    owner = "ns/Pod/big"
    assert table[:2] == [
        "NODE   KIND   OWNER        AGE   EXPIRES                START   BACKFILLED   REASON",
        f"n1     job    {owner}   7m    2026-11-22T13:00:00Z   -       0            reserved for a starving job",
    ]
    assert table[3].split() == ["STARVING", "JOB", "QUEUE", "PRIORITY", "BOUND", "START", "REASON"]
    assert "(no windows configured)" in table and "(no queue guarantees)" in table
    assert table[-4:-2] == ["SKIPPED OBJECT   ERROR", "Queue broken     spec.weight: not an integer"]
    wide = render_status(*status_args(), "wide").splitlines()
    assert wide[0].split() == ["NODE", "KIND", "OWNER", "AGE", "EXPIRES", "START", "BACKFILLED", "SINCE", "EXCLUSIVE",
                               "RESERVED", "TASKS", "REASON"]
    assert wide[1].split()[:11] == ["n1", "job", owner, "7m", "2026-11-22T13:00:00Z", "-", "0",
                                    "2026-11-22T11:53:00Z", "false", "cpu=4", "ns/big"]
    assert wide[3].split()[:9] == ["STARVING", "JOB", "QUEUE", "PRIORITY", "BOUND", "START", "PENDING", "OWNER",
                                   "SINCE"]
    assert table[-1] == wide[-1] == "plan published by agent-1 at 2026-11-22T11:59:40Z, 20s ago"
    queues = render_status(*status_args(competing()), "wide", queues=True).splitlines()
    assert queues[1].split()[-2:] == ["ALLOCATED", "DESERVED"] and queues[2].split()[0] in ("default", "other")


def test_every_table_line_has_no_trailing_padding() -> None:
    for output in ("table", "wide"):
        for queues in (False, True):
            text = render_status(*status_args(), output, queues=queues)
            assert all(line == line.rstrip() for line in text.splitlines())


# --- the command: flags, errors, exit codes ---


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"reservoir {metadata.version('reservoir')}"


def test_status_flags_parse_as_kubectl_spells_them() -> None:
    args = cli.build_parser().parse_args(["status", "-n", "elsewhere", "--context", "ctx", "-o", "wide",
                                          "--kubeconfig", "/k"])
    assert (args.namespace, args.context, args.output, args.kubeconfig) == ("elsewhere", "ctx", "wide", "/k")
    default = cli.build_parser().parse_args(["status"])
    assert (default.namespace, default.reservoir_namespace, default.why) == (None, keys.NAMESPACE, None)
    why = cli.build_parser().parse_args(["status", "--why", "p", "-n", "team-a", "--reservoir-namespace", "rs"])
    assert (why.why, why.namespace, why.reservoir_namespace) == ("p", "team-a", "rs")
    release = cli.build_parser().parse_args(["release", "--all", "--context", "ctx"])
    assert release.context == "ctx"


async def forbidden(request: web.Request) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                              "message": 'nodes is forbidden: User "jane" cannot list resource "nodes"',
                              "code": 403}, status=403)


@pytest.fixture(autouse=True)
def fast_list_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caches try a failed list page again with backoff (shared.watchcache): not half a second here."""
    monkeypatch.setattr("shared.watchcache.PAGE_BACKOFF_START", 0.001)


@pytest.fixture
async def forbidding_server(tmp_path: Path) -> AsyncIterator[Path]:
    """A kubeconfig for an API server on loopback that answers every request 403."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forbidden)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    yield path
    await runner.cleanup()


def run_cli(argv: list[str]) -> int:
    """cli.main in a thread of its own (it runs its own event loop, and the test's loop serves the fake API)."""
    import asyncio
    return asyncio.get_running_loop().run_in_executor(None, cli.main, argv)  # type: ignore[return-value]


async def test_an_api_error_is_one_line_and_exit_1(forbidding_server: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = await run_cli(["status", "--kubeconfig", str(forbidding_server)])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err == ('reservoir: error: API error 403 Forbidden: nodes is forbidden: User "jane" cannot list '
                            'resource "nodes"\n')


async def test_verbose_shows_the_traceback(forbidding_server: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = await run_cli(["-v", "status", "--kubeconfig", str(forbidding_server)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("Traceback (most recent call last):") and "ApiException" in err
    assert err.splitlines()[-1].startswith("reservoir: error: API error 403 Forbidden")


async def test_release_api_error_is_one_line_too(forbidding_server: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert await run_cli(["release", "--all", "--kubeconfig", str(forbidding_server)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "403 Forbidden" in err


def test_no_kubeconfig_anywhere_is_one_line_naming_the_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err == (f"reservoir: error: no kubeconfig found: tried {tmp_path}/.kube/config "
                                       "(no file), in-cluster (KUBERNETES_SERVICE_HOST is not set)\n")


def test_connection_refused_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localcluster.cluster import free_port

    port = free_port()
    path = kubeconfig(tmp_path / "config", clusters={"c": f"http://127.0.0.1:{port}"}, contexts={"x": "c"},
                      current="x")
    assert cli.main(["release", "n1", "--kubeconfig", str(path)]) == 1
    assert capsys.readouterr().err == (f"reservoir: error: cannot connect to the API server at 127.0.0.1:{port}: "
                                       "connection refused\n")


def test_kubectl_plugin_name_shows_in_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/kubectl-reservoir"])
    assert cli.main(["status", "--kubeconfig", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err == f"kubectl reservoir: error: --kubeconfig {tmp_path / 'none'}: no such file\n"


def test_simulate_names_a_library_of_the_bench_extra_it_lacks(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The engine is found but numpy is not installed: the message names numpy and how to get it, not the source
    tree (which is there)."""
    def without_numpy(name: str) -> Any:
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
    monkeypatch.setattr(cli.importlib, "import_module", without_numpy)
    assert cli.main(["simulate"]) == 2
    err = capsys.readouterr().err
    assert "needs numpy, of the bench extra" in err and "source tree" not in err
