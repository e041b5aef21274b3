"""`python -m tests.apps.module_probe ARGS...` runs `duetime ARGS...` and, once the file
`$DUETIME_MODULES_OUT.go` exists (the test creates it when the process is serving), writes the
names of the duetime modules the process has loaded to `$DUETIME_MODULES_OUT`."""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
from pathlib import Path


def _dump_when_told(out: Path) -> None:
    go = Path(f"{out}.go")
    while not go.exists():
        time.sleep(0.02)
    loaded = sorted(name for name in list(sys.modules) if name.startswith("duetime"))
    tmp = Path(f"{out}.tmp")
    tmp.write_text("\n".join(loaded))
    os.replace(tmp, out)


def main() -> None:
    out = Path(os.environ["DUETIME_MODULES_OUT"])
    threading.Thread(target=_dump_when_told, args=(out,), daemon=True).start()
    sys.argv = ["duetime", *sys.argv[1:]]
    runpy.run_module("duetime", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
