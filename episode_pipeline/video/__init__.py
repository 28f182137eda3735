"""Video: probing sources with PyAV, building the FFmpeg HLS command, checking HLS playlists.

`hls` and `playlist` are pure; `probe` opens files. The Pipes program in
`episode_pipeline.transcode` puts them together with S3.
"""
