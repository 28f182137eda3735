"""A real `dagster dev` (webserver + daemon) on the session's stack, driven as the UI drives it.

`episode-pipeline dev` starts it the same way (`local/dev.py`): the local workspace file, the
stack's environment, its own process session so SIGTERM stops it. Tests talk to it over HTTP:
the GraphQL API the UI's pages query, and (test_ui_browser.py) a real browser.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from episode_pipeline.local import aws_setup
from episode_pipeline.local.dev import dagster_command, dev_environment, stop_dagster_dev
from episode_pipeline.local.stack import StackInfo

STARTUP_SECONDS = 180  # a deadline: ~15 s on an idle 2-core machine, far more under load

REPOSITORIES_QUERY = """
query {
  repositoriesOrError {
    __typename
    ... on RepositoryConnection { nodes { name location { name } jobs { name } } }
    ... on PythonError { message }
  }
}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DagsterDev:
    """A running `dagster dev` and its GraphQL endpoint; its output goes to `log`."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            result = json.load(response)
        assert not result.get("errors"), result["errors"]
        return result["data"]

    def wait_until_up(self, timeout: float = STARTUP_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"dagster dev exited:\n{self.tail()}"
            with (
                contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as response,
            ):
                if response.status == 200:
                    return
            assert time.monotonic() < deadline, f"no {self.url}/server_info:\n{self.tail()}"
            time.sleep(0.5)

    def repository_of(self, job_name: str, timeout: float = STARTUP_SECONDS) -> dict[str, str]:
        """The UI's repositorySelector for the repository holding `job_name` (once loaded)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.graphql(REPOSITORIES_QUERY)["repositoriesOrError"]
            for repo in found.get("nodes", []):
                if any(job["name"] == job_name for job in repo["jobs"]):
                    return {
                        "repositoryName": repo["name"],
                        "repositoryLocationName": repo["location"]["name"],
                    }
            assert time.monotonic() < deadline, f"no job {job_name}: {found}\n{self.tail()}"
            time.sleep(1)


def stop(process: subprocess.Popen[bytes]) -> None:
    """As `episode-pipeline dev` stops it (`local.dev.stop_dagster_dev`)."""
    stop_dagster_dev(process)


@contextlib.contextmanager
def running_dagster_dev(stack: StackInfo, workdir: Path) -> Iterator[DagsterDev]:
    """`dagster dev` on `stack`, started in `workdir` (its log goes there), stopped at exit.

    The upload queue is purged first: earlier tests processed their uploads in-process and left
    the S3 events behind, and this daemon's sensor would run them all again (one run per org at
    a time) before the calling test's own uploads.
    """
    assert stack.s3_endpoint is not None and stack.sqs_queue_url is not None
    aws_setup.client("sqs", stack.s3_endpoint).purge_queue(QueueUrl=stack.sqs_queue_url)
    port = free_port()
    log = workdir / "dagster-dev.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            dagster_command(port),
            env=dev_environment(stack.env),
            cwd=workdir,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield DagsterDev(process, port, log)
    finally:
        stop(process)
