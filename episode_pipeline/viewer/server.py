"""The viewer's HTTP server: the page, its libraries, and episodes' outputs from S3.

Bound to 127.0.0.1 only. Outputs are read with the operator's credentials and streamed to the
page (`routes.output_key` keeps a read below an episode's `processed/` prefix), so nothing in
the bucket is made public and the page works the same against moto and AWS. One thread per
request: hls.js fetches every camera's segments at once.
"""

from __future__ import annotations

import logging
import shutil
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from episode_pipeline.storage.bucket import Bucket, content_type_for, is_not_found
from episode_pipeline.viewer.routes import LIBRARIES, NotServed, Route, route

WEB = Path(__file__).with_name("web")
CHUNK = 256 * 1024
log = logging.getLogger(__name__)


def missing_libraries(web: Path = WEB) -> list[str]:
    """The npm files the page needs that are not installed (`npm ci` in web/)."""
    return [file for file in LIBRARIES if not (web / file).is_file()]


class ViewerServer(ThreadingHTTPServer):
    daemon_threads = True  # a browser's open connection never holds the command at Ctrl-C

    def __init__(self, bucket: Bucket, port: int = 0, web: Path = WEB) -> None:
        self.bucket, self.web = bucket, web
        super().__init__(("127.0.0.1", port), ViewerHandler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests, benchmarks); `shutdown()` then `server_close()`."""
        thread = threading.Thread(target=self.serve_forever, name="viewer", daemon=True)
        thread.start()
        return thread


class ViewerHandler(BaseHTTPRequestHandler):
    server: ViewerServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        try:
            found = route(self.path)
        except NotServed as error:
            self.fail(HTTPStatus.NOT_FOUND, str(error))
            return
        if found.file is not None:
            self.send_file(found)
        else:
            assert found.key is not None
            self.send_output(found.key)

    def send_file(self, found: Route) -> None:
        assert found.file is not None and found.content_type is not None
        path = self.server.web / found.file
        if not path.is_file():
            self.fail(HTTPStatus.NOT_FOUND, f"{path}: missing (scripts/bootstrap.sh installs it)")
            return
        body = path.read_bytes()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", found.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(body)

    def send_output(self, key: str) -> None:
        bucket = self.server.bucket
        try:
            response = bucket.client.get_object(Bucket=bucket.name, Key=key)
        except ClientError as error:
            status = HTTPStatus.NOT_FOUND if is_not_found(error) else HTTPStatus.BAD_GATEWAY
            self.fail(status, f"{bucket.uri(key)}: {error}")
            return
        except BotoCoreError as error:
            self.fail(HTTPStatus.BAD_GATEWAY, f"{bucket.uri(key)}: {error}")
            return
        body = response["Body"]
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", content_type_for(key))
            self.send_header("Content-Length", str(response["ContentLength"]))
            self.end_headers()
            shutil.copyfileobj(body, self.wfile, CHUNK)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page moved on (a seek cancels hls.js's loads)
        finally:
            body.close()

    def fail(self, status: HTTPStatus, message: str) -> None:
        log.warning("viewer: %s %s: %s", int(status), self.path, message)
        body = f"{message}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("viewer: " + format, *args)
