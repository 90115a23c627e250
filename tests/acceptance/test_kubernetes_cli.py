"""The kubernetes target as a user runs it: target set, worker, inspect — against the in-suite API server.

SQLite only: the worker process runs on PostgreSQL and MariaDB in
tests/integration/test_crash_kubernetes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import run
from support.kube_api import KubeApiServer
from support.kube_api.controller import controller


def test_kubernetes_delivery_tour(tmp_path: Path, kube_api: KubeApiServer) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    kube_api.store.namespaces.add("ml")
    run("init", db=db, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=2", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=2", db=db, cwd=tmp_path)
    shown = run("target", "set", "cluster", "--kind", "kubernetes", "--default",
                "--host", kube_api.host, "--namespace", "ml", "--stop", "suspend",
                "--timeout", "5", db=db, cwd=tmp_path)
    assert shown.stdout.strip() == "target cluster: kubernetes (default)"
    [listed] = json.loads(run("target", "list", "--json", db=db, cwd=tmp_path).stdout)
    assert listed["config"]["stop"] == "suspend" and listed["config"]["namespace"] == "ml"
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path)

    run("worker", "--name", "w1", "--admit", "--once", db=db, cwd=tmp_path)
    [created] = kube_api.model_services()
    assert created["metadata"]["namespace"] == "ml" and created["spec"]["requestId"] == "job-1"
    with controller(kube_api, phase="Succeeded"):
        run("worker", "--name", "w1", "--until-idle", "--poll", "0.05", db=db, cwd=tmp_path)
    inspected = json.loads(run("inspect", "--json", db=db, cwd=tmp_path).stdout)
    [request] = inspected["requests"]
    assert request["state"] == "completed" and request["uid"] == created["metadata"]["uid"]


def test_bad_kubernetes_settings_are_refused_and_change_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run("init", db=db, cwd=tmp_path)
    bad_namespace = run("target", "set", "cluster", "--kind", "kubernetes", "--namespace",
                        "Team_A", db=db, cwd=tmp_path, expect=2)
    assert "invalid_target_config" in bad_namespace.stderr
    assert "namespace 'Team_A' is not a DNS-1123 label" in bad_namespace.stderr
    bad_stop = run("target", "set", "cluster", "--kind", "kubernetes", "--stop", "kill",
                   db=db, cwd=tmp_path, expect=2)
    assert "kill" in bad_stop.stderr
    assert json.loads(run("target", "list", "--json", db=db, cwd=tmp_path).stdout) == []
