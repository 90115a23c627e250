"""A spark job that fails gives its request the exception that ended it, cleaned.

A ``--module`` that did not import ended the request ``failed`` with the reason ``command
exited with status 1``; the cause was only in the run's ``output.log``, which a tenant
cannot read. Now the reason — what ``show``, ``diagnose`` and the HTTP API give — ends with
the exception's last line, with the values of the variables the job was handed (and any
URL's credentials) masked. No Spark starts: each job fails while Python imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from quotagate import Quotagate
from quotagate.http import create_app
from support.cli import run
from support.http_servers import bearer, serving

EVENTS_DB = "postgresql://app:hunter2-secret@db.internal/events"
TOKEN = "tok-0123456789"
# Imported by ``python -m broken_job``: it fails with the secrets it was given in its message.
BROKEN_JOB = """import os
raise ImportError("cannot load the sink for " + os.environ["EVENTS_DB"] + " with "
                  + os.environ["JOB_TOKEN"] + "; see https://u:pw@example.org/x?key=v")
"""


def test_a_failed_spark_job_names_its_exception_in_the_reason_without_its_secrets(
    db_url: str, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "broken_job.py").write_text(BROKEN_JOB)
    (jobs / "needs_a_package.py").write_text("import qg_no_such_package_for_this_test\n")
    env = {"PYTHONPATH": str(jobs), "EVENTS_DB": EVENTS_DB, "JOB_TOKEN": TOKEN}
    db = db_url
    run("tenant", "set", "team-a", "--quota", "slots=4", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "slots=4", db=db, cwd=tmp_path)
    for name, module in (("missing", "qg_no_such_module"), ("needs", "needs_a_package"),
                         ("broken", "broken_job")):
        run("target", "set", name, "--kind", "spark", "--module", module,
            "--environment", "PYTHONPATH,EVENTS_DB,JOB_TOKEN", "--run-dir", str(tmp_path / "runs"),
            "--checkpoint-root", str(tmp_path / "checkpoints"), db=db, cwd=tmp_path)
        run("submit", "--id", f"job-{name}", "--tenant", "team-a", "--cost", "slots=1",
            "--target", name, db=db, cwd=tmp_path)
    run("worker", "--name", "w1", "--admit", "--until-idle", db=db, cwd=tmp_path, env=env)
    # Recorded ends leave the runs' .exited index, as for the process target (it only grew).
    assert list((tmp_path / "runs" / ".exited").iterdir()) == []

    def reason(request_id: str) -> str:
        shown = json.loads(run("show", request_id, "--json", db=db, cwd=tmp_path).stdout)
        assert shown["state"] == "failed", shown
        return str(shown["reason"])

    assert reason("job-missing") == "command exited with status 1: No module named qg_no_such_module"
    assert reason("job-needs") == ("command exited with status 1: ModuleNotFoundError: No module "
                                   "named 'qg_no_such_package_for_this_test'")
    broken = reason("job-broken")
    assert broken == ("command exited with status 1: ImportError: cannot load the sink for "
                      "$EVENTS_DB with $JOB_TOKEN; see https://example.org/x?key=***")
    assert "hunter2" not in broken and TOKEN not in broken

    diagnosed = run("diagnose", "job-broken", db=db, cwd=tmp_path).stdout
    assert f"accepted and admitted; now failed ({broken})" in diagnosed
    assert "hunter2" not in diagnosed and TOKEN not in diagnosed

    # The HTTP API gives the tenant the same reason, and nothing more.
    with Quotagate.connect(db) as gate:
        token = gate.create_api_token(tenant="team-a", actor="test").token
        with serving(create_app(gate)) as url, httpx.Client(base_url=url, headers=bearer(token),
                                                            timeout=30) as http:
            answer = http.get("/v1/tenants/team-a/requests/job-broken")
    assert answer.status_code == 200, answer.text
    assert answer.json()["reason"] == broken
    assert "hunter2" not in answer.text and TOKEN not in answer.text
