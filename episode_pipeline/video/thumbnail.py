"""A poster's thumbnail: the small JPEG the Dagster UI shows inline in the `hls_renditions`
metadata. It is stored in every materialization of every episode, so it is kept small; the
poster itself stays in S3 at its own size (at most `POSTER_MAX_WIDTH` wide)."""

from __future__ import annotations

import io

from episode_pipeline.video.hls import even_down

THUMBNAIL_WIDTH = 160
# FFmpeg's MJPEG quantiser scale, 2 (best) to 31: 5 keeps a camera's scene legible at 160 px.
THUMBNAIL_QSCALE = 5


def thumbnail_jpeg(jpeg: bytes, width: int = THUMBNAIL_WIDTH) -> bytes:
    """The JPEG scaled down to `width` (aspect kept); a narrower one, or one PyAV cannot read,
    as it is (the UI then shows the poster itself)."""
    import av  # PyAV loads FFmpeg's libraries: keep it out of module import time

    try:
        with av.open(io.BytesIO(jpeg)) as container:
            frame = next(container.decode(video=0))
    except (av.FFmpegError, StopIteration):
        return jpeg
    if frame.width <= width:
        return jpeg
    height = even_down(frame.height * width / frame.width)
    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuvj420p"
    encoder.options = {"qmin": str(THUMBNAIL_QSCALE), "qmax": str(THUMBNAIL_QSCALE)}
    small = frame.reformat(width=width, height=height, format="yuvj420p")
    return b"".join(bytes(packet) for packet in [*encoder.encode(small), *encoder.encode(None)])
