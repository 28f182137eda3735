"""Video: probing sources with PyAV, building the FFmpeg HLS command, checking HLS playlists.

`hls` and `playlist` are pure; `probe` opens files. The Pipes program in
`episode_pipeline.transcode` puts them together with S3.
"""


def ffmpeg_exe() -> str:
    """The FFmpeg binary: imageio-ffmpeg's bundled build (libx264, AV1 decoders, hls muxer)."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()
