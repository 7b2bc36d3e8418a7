"""specdec bench (being written)."""


def add_bench_args(p) -> None:
    pass


def cmd_bench(args) -> int:
    raise NotImplementedError
