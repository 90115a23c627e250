"""Delivery commands as a user runs them: target set/list, worker, lease show.

SQLite only: the same worker process runs on PostgreSQL and MariaDB in
tests/integration/test_crash_delivery.py.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

from support.cli import QUOTAGATE, run
from support.waiting import wait_for


def test_process_delivery_tour(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run("init", db=db, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=2", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=2", db=db, cwd=tmp_path)
    shown = run("target", "set", "local", "--kind", "process", "--default",
                "--command", 'sh -c "echo ran $QUOTAGATE_REQUEST_ID"', "--run-dir", "runs",
                db=db, cwd=tmp_path)
    assert shown.stdout.strip() == "target local: process (default)"
    [listed] = json.loads(run("target", "list", "--json", db=db, cwd=tmp_path).stdout)
    assert listed["config"] == {"command": ["sh", "-c", "echo ran $QUOTAGATE_REQUEST_ID"],
                                "run_dir": str(tmp_path / "runs")}  # made absolute
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path)
    run("submit", "--id", "job-2", "--tenant", "team-a", "--cost", "gpu=1", "--target", "local",
        db=db, cwd=tmp_path)

    moved = run("worker", "--name", "w1", "--admit", "--once", db=db, cwd=tmp_path)
    # What moved, in words; the commands may already have exited and been read back
    # ("…, 2 completed and 0 failed by their executor"), or not yet.
    assert moved.stdout.startswith(
        "admitted 2 requests, delivered 2 requests, 0 failed, 0 stops confirmed")
    lease = json.loads(run("lease", "show", "worker/w1", "--json", db=db, cwd=tmp_path).stdout)
    assert lease == [{**lease[0], "owner": None, "generation": 1, "held": False}]  # released

    run("worker", "--name", "w1", "--until-idle", "--poll", "0.05", db=db, cwd=tmp_path)
    inspected = json.loads(run("inspect", "--json", db=db, cwd=tmp_path).stdout)
    assert {r["id"]: r["state"] for r in inspected["requests"]} == {
        "job-1": "completed", "job-2": "completed"
    }
    assert all(r["binding"] and r["uid"] for r in inspected["requests"])
    outputs = sorted((tmp_path / "runs").glob("*/output.log"))
    assert [p.read_text().strip() for p in outputs] == ["ran job-1", "ran job-2"]
    assert "worker/w1  -      2" in run("lease", "show", db=db, cwd=tmp_path).stdout


def test_a_command_given_by_a_relative_path_runs_from_its_run_directory(tmp_path: Path) -> None:
    # README's `--command './serve-model.sh'`: the command runs in its request's
    # run directory, so the path is read where the target was set, not there.
    db = f"sqlite:///{tmp_path / 'q.db'}"
    script = tmp_path / "serve-model.sh"
    script.write_text('#!/bin/sh\necho "serving $QUOTAGATE_REQUEST_ID"\n')
    script.chmod(0o755)
    run("init", db=db, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=1", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=1", db=db, cwd=tmp_path)
    run("target", "set", "local", "--kind", "process", "--default",
        "--command", "./serve-model.sh --port 9000", db=db, cwd=tmp_path)
    [listed] = json.loads(run("target", "list", "--json", db=db, cwd=tmp_path).stdout)
    assert listed["config"]["command"] == [str(script), "--port", "9000"]
    # Named like the other settings' entries (pool.set pool/…, tenant.set tenant/…).
    entries = json.loads(run("audit", "--json", db=db, cwd=tmp_path).stdout)
    assert [(e["operation"], e["target"]) for e in entries if e["operation"] == "target.set"
            ] == [("target.set", "target/local")]
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run("worker", "--name", "w1", "--admit", "--until-idle", "--poll", "0.05", db=db,
        cwd=elsewhere)
    shown = json.loads(run("show", "job-1", "--json", db=db, cwd=tmp_path).stdout)
    assert (shown["state"], shown["reason"]) == ("completed", None)
    described = run("show", "job-1", db=db, cwd=tmp_path).stdout
    assert "   target: (the default target)\n" in described and "  attempt: 1\n" in described
    [output] = (tmp_path / "quotagate-runs").glob("*/output.log")
    assert output.read_text().strip() == "serving job-1"


def test_worker_once_says_what_its_pass_did(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run("init", db=db, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=2", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=2", db=db, cwd=tmp_path)
    run("target", "set", "local", "--kind", "process", "--default", "--command", "sleep 600",
        "--stop-grace", "30", db=db, cwd=tmp_path)
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path)
    assert run("worker", "--name", "w1", "--admit", "--once", db=db, cwd=tmp_path).stdout == (
        "admitted 1 request, delivered 1 request, 0 failed, 0 stops confirmed\n")
    run("cancel", "job-1", db=db, cwd=tmp_path)

    def stop_confirmed() -> bool:
        said = run("worker", "--name", "w1", "--once", db=db, cwd=tmp_path).stdout
        # Until the command has exited the stop awaits the target (or is not due yet).
        assert said in ("delivered 0 requests, 0 failed, 0 stops confirmed, 1 stop awaiting "
                        "the target\n", "delivered 0 requests, 0 failed, 0 stops confirmed\n",
                        "delivered 0 requests, 0 failed, 1 stop confirmed\n"), said
        return said == "delivered 0 requests, 0 failed, 1 stop confirmed\n"

    wait_for(stop_confirmed, "the worker to confirm job-1's stop", timeout=60)
    assert json.loads(run("show", "job-1", "--json", db=db, cwd=tmp_path).stdout)[
        "state"] == "cancelled"

    # While a live worker holds the lease of that name, a pass does nothing and says why.
    live = subprocess.Popen([*QUOTAGATE, "worker", "--name", "w1", "--poll", "0.05",
                             "--db", db], cwd=tmp_path, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: json.loads(run("lease", "show", "worker/w1", "--json", db=db,
                                        cwd=tmp_path).stdout)[0]["held"],
                 "the live worker to take its lease", timeout=60)
        assert run("worker", "--name", "w1", "--once", db=db, cwd=tmp_path).stdout == (
            "did nothing: lease worker/w1 is held by another live worker (each live worker "
            "needs its own --name; a dead one's lease expires)\n")
    finally:
        live.terminate()
        live.wait(timeout=30)


def test_inspect_prints_the_last_error_of_a_delivery_that_keeps_failing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run("init", db=db, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=2", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=2", db=db, cwd=tmp_path)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    run("target", "set", "hooks", "--kind", "webhook", "--default",
        "--url", f"http://127.0.0.1:{port}/hooks", db=db, cwd=tmp_path)
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path)
    run("worker", "--name", "w1", "--admit", "--once", db=db, cwd=tmp_path)
    [shown] = json.loads(run("inspect", "--json", db=db, cwd=tmp_path).stdout)["requests"]
    assert shown["last_error"], shown
    # The troubleshooting guide sends the reader to inspect's last_error: the table says it.
    table = run("inspect", db=db, cwd=tmp_path).stdout
    assert f"job-1: outbox pending after 1 attempt, last_error: {shown['last_error']}" in table


def test_bad_target_settings_are_refused_and_change_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run("init", db=db, cwd=tmp_path)
    no_command = run("target", "set", "local", "--kind", "process", db=db, cwd=tmp_path,
                     expect=2)
    assert "invalid_target_config" in no_command.stderr
    bad_url = run("target", "set", "hook", "--kind", "webhook", "--url", "ftp://x", db=db,
                  cwd=tmp_path, expect=2)
    assert "--url" in bad_url.stderr
    bad_name = run("target", "set", "Bad_Name", "--kind", "process", "--command", "true",
                   db=db, cwd=tmp_path, expect=2)
    assert "invalid_target_name" in bad_name.stderr
    # An option of another kind was dropped without a word (a spark target "with" a URL).
    foreign = run("target", "set", "job", "--kind", "spark", "--module", "jobs.main",
                  "--url", "http://127.0.0.1:9/", "--namespace", "ml", db=db, cwd=tmp_path,
                  expect=2)
    assert foreign.stderr.startswith(
        "error: invalid_target_config: a spark target has no option 'namespace', 'url' (its "
        "options: checkpoint_root, command, environment, module, python, run_dir, stop_grace)"
    ), foreign.stderr
    webhook_with_command = run("target", "set", "hook", "--kind", "webhook", "--url",
                               "http://127.0.0.1:9/", "--command", "true", db=db, cwd=tmp_path,
                               expect=2)
    assert "a webhook target has no option 'command'" in webhook_with_command.stderr
    assert json.loads(run("target", "list", "--json", db=db, cwd=tmp_path).stdout) == []
    # Each kind's own options, every one given, are taken.
    for kind, options in [
        ("process", ["--command", "true", "--run-dir", "runs", "--environment", "LANG",
                     "--stop-grace", "5"]),
        ("spark", ["--module", "jobs.main", "--checkpoint-root", "cp", "--run-dir", "runs",
                   "--environment", "LANG", "--stop-grace", "5"]),
        ("webhook", ["--url", "http://127.0.0.1:9/", "--timeout", "3", "--poll-every", "1",
                     "--batch-read", "--batch-deliver", "4"]),
        ("kubernetes", ["--namespace", "ml", "--group", "example.io", "--version", "v1",
                        "--plural", "jobs", "--resource-kind", "Job", "--host",
                        "http://127.0.0.1:9", "--kubeconfig", "kc", "--context", "c",
                        "--stop", "suspend", "--timeout", "3"]),
    ]:
        run("target", "set", f"all-{kind}", "--kind", kind, *options, db=db, cwd=tmp_path)
    missing = run("lease", "show", "worker/none", db=db, cwd=tmp_path, expect=4)
    assert "unknown_lease" in missing.stderr
    run("worker", "--name", "bad/name", "--once", db=db, cwd=tmp_path, expect=2)


def test_sigterm_stops_a_worker_cleanly_and_releases_its_lease(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run("init", db=db, cwd=tmp_path)
    worker = subprocess.Popen([*QUOTAGATE, "worker", "--name", "w1", "--poll", "0.05",
                               "--db", db], cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            shown = run("lease", "show", "--json", db=db, cwd=tmp_path).stdout
            if json.loads(shown) and json.loads(shown)[0]["held"]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the worker never took its lease")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if worker.stderr is not None:
            worker.stderr.close()
    [lease] = json.loads(run("lease", "show", "--json", db=db, cwd=tmp_path).stdout)
    assert (lease["owner"], lease["generation"], lease["held"]) == (None, 1, False)
