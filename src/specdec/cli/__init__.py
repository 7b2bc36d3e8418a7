"""The `specdec` command: main.py (the parser, `generate`, dispatch to every command), args.py (the
flags the commands share: model, logprobs mode, every drafter setting), catalog.py (`specdec models`),
datastore.py (`specdec datastore`). `serve`, `bench`, `advise` and `train` keep their flags beside
their code (server/cli.py, bench/cli.py, bench/advise_cli.py, train/cli.py).

Nothing is imported here: ``server/cli.py`` imports ``cli.args``, and main.py imports the server's.
"""
