"""`python -m episode_pipeline.transcode`: the command of the transcode ECS task (infra/ecs.tf)."""

import sys

from episode_pipeline.runtime.fast_exit import skip_teardown

if __name__ == "__main__":
    exiting = skip_teardown()  # before the program's imports: its handler must run last
    from episode_pipeline.transcode.program import main

    sys.exit(exiting(main()))
