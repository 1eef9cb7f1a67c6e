"""Errors a user can fix. The CLI prints their message on one line and exits without a traceback."""


class VltoolError(Exception):
    """A runtime problem the user can fix (bad data, missing file). Exit code 1."""

    exit_code = 1


class UsageError(VltoolError):
    """A bad command line: missing input, bad option value, output exists. Exit code 2."""

    exit_code = 2


def check(problems: list[str], error: type[VltoolError] = UsageError) -> None:
    """Raise once with every problem found, as litgpt's validate_args does."""
    if problems:
        raise error("; ".join(problems))
