"""Video: probing sources with PyAV, building the FFmpeg HLS command, checking HLS playlists.

`hls` and `playlist` are pure; `probe` opens files. The Pipes program in
`episode_pipeline.transcode` puts them together with S3.
"""

import shutil


class FFmpegNotFound(RuntimeError):
    """Neither imageio-ffmpeg's bundled binary nor an `ffmpeg` on PATH is there."""


def ffmpeg_exe() -> str:
    """The FFmpeg binary: imageio-ffmpeg's bundled build (libx264, AV1 decoders, hls muxer; the
    image's one FFmpeg), else an `ffmpeg` on PATH (Debian's package, say). TRANSCODE_FFMPEG
    (`VideoSettings.ffmpeg`) overrides both where it is read."""
    try:
        import imageio_ffmpeg
    except ImportError:
        found = shutil.which("ffmpeg")
        if found:
            return found
        raise FFmpegNotFound(
            "no FFmpeg: install imageio-ffmpeg (a dependency of episode-pipeline) or put ffmpeg "
            "on PATH, or set TRANSCODE_FFMPEG to the binary"
        ) from None
    return imageio_ffmpeg.get_ffmpeg_exe()
