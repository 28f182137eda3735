# The two commands a newcomer needs (see README.md): `make demo` and `make test`.
.PHONY: demo demo-with-failure test test-fast lint dev bench bench-fleet image clean

# `make test` runs every test (docs/testing.md): pytest-xdist workers, one embedded stack each.
TEST_WORKERS ?= 3

demo:
	scripts/bootstrap.sh
	.venv/bin/episode-pipeline demo

# One failing upload's way to the dead-letter queue and back (docs/operations.md), ~2 min.
demo-with-failure:
	scripts/bootstrap.sh
	.venv/bin/episode-pipeline demo --with-failure

test:
	scripts/bootstrap.sh
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=30

# The inner loop: unit tests only (no server), the long ones left out.
test-fast:
	scripts/bootstrap.sh
	.venv/bin/pytest -q -p no:cacheprovider -m "unit and not slow"

lint:
	.venv/bin/ruff check --fix . && .venv/bin/ruff format .

dev:
	scripts/bootstrap.sh
	.venv/bin/episode-pipeline dev

bench:
	scripts/bootstrap.sh
	.venv/bin/python -m benchmarks.run

# The fleet's scale figures (issues 18, 33): longer than ten minutes alone, so not in `make bench`.
bench-fleet:
	scripts/bootstrap.sh
	.venv/bin/python -m benchmarks.run --stage fleet

# The Dockerfile's run and webserver targets, built with podman (docs/deploy-aws.md#the-images-here).
image:
	scripts/bootstrap.sh
	scripts/build-images.sh

clean:
	-.venv/bin/episode-pipeline stack down
	rm -rf .episode_pipeline
