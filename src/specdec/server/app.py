"""OpenAI-compatible server (being written)."""


def add_serve_args(p) -> None:
    pass


def cmd_serve(args) -> int:
    raise NotImplementedError
