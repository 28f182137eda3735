"""Upload HLS segments while FFmpeg is still writing the next ones.

FFmpeg's hls muxer runs with `-hls_flags temp_file`: a segment is written as `segment_N.ts.tmp`
and renamed when complete, so a `.ts` name in a rendition's folder is a finished file. A thread
looks at the folders every `poll_seconds` and hands each new segment to an upload pool; when
FFmpeg exits, `finish()` takes the last ones and waits. Playlists are not touched here: they go
up after every segment they list is in S3.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.video.hls import SEGMENT_SUFFIX

UPLOAD_WORKERS = 4  # per camera; moto: 73 objects/s alone, 122/s with 8 threads
POLL_SECONDS = 0.5


class SegmentUploadFailed(RuntimeError):
    """A segment's upload failed; raised from its error (S3's, or the disk's)."""


class SegmentUploader:
    """Uploads each finished segment under `folders` of `root` to `prefix` + the same path."""

    def __init__(
        self,
        bucket: Bucket,
        root: Path,
        prefix: str,
        folders: list[str],
        poll_seconds: float = POLL_SECONDS,
        workers: int = UPLOAD_WORKERS,
    ) -> None:
        self._bucket = bucket
        self._root = root
        self._prefix = prefix
        self._folders = folders  # "" for the baseline, "720p/", ...
        self._poll_seconds = poll_seconds
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="segment-upload")
        self._uploads: dict[str, Future] = {}  # key → its upload
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="segment-watch", daemon=True)

    def __enter__(self) -> SegmentUploader:
        self._bucket.client  # noqa: B018 - create the shared client before the threads race for it
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop watching; on an error, drop what has not started and wait for the rest."""
        self._stop.set()
        self._watcher.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            self._sweep()

    def _sweep(self) -> None:
        for folder in self._folders:
            directory = self._root / folder
            for path in sorted(directory.glob(f"*{SEGMENT_SUFFIX}")):
                key = f"{self._prefix}{folder}{path.name}"
                if key not in self._uploads:
                    self._uploads[key] = self._pool.submit(self._bucket.upload_file, path, key)

    def finish(self) -> set[str]:
        """After FFmpeg exited: upload what is left, wait for every upload, return their keys.

        The first failed upload is raised (after the others ended), as `SegmentUploadFailed` from
        the S3 error, naming its key.
        """
        self._stop.set()
        self._watcher.join()
        self._sweep()
        for future in list(self._uploads.values()):
            future.exception()  # wait for all before raising any
        for key, future in self._uploads.items():
            error = future.exception()
            if error is not None:
                raise SegmentUploadFailed(f"upload of {self._bucket.uri(key)}: {error}") from error
        return set(self._uploads)
