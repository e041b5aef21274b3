"""A producer that knows a task the worker app (`basic`) does not: a rolling-deploy mismatch."""

import duetime

app = duetime.App()


@app.task(name="only.in.producer")
def only_in_producer() -> None:
    pass
