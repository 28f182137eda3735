"""`python -m episode_pipeline.transcode`: the command of the transcode ECS task (infra/ecs.tf)."""

import sys

from episode_pipeline.transcode.program import main

if __name__ == "__main__":
    sys.exit(main())
