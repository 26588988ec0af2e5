"""``python -m benchmarks.evidence.run``: the evidence runner's command line (:mod:`.cli`)."""

from benchmarks.evidence.run.cli import main

if __name__ == "__main__":
    main(prog="run.py")  # the error lines' prefix of the single-file runner it was
