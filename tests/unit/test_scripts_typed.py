"""Scripts declares one typed attribute per script, so mypy checks every `scripts.<name>(...)`
call site; the attributes are set from SCRIPT_NAMES at run time, and this keeps the two equal."""

from typing import get_type_hints

from duetime.common import scripts
from duetime.common.scripts import Bound, Scripts


def test_every_script_is_a_declared_attribute_and_nothing_else():
    declared = {name for name, hint in get_type_hints(Scripts).items() if hint is Bound}
    assert declared == set(scripts.SCRIPT_NAMES)


def test_each_attribute_calls_its_own_script_on_the_client_or_the_one_given():
    calls = []

    class Client:
        def __init__(self, name):
            self.name = name

        def execute_command(self, *args):
            calls.append((self.name, args))
            return b"ok"

    s = Scripts(Client("default"))
    for name in scripts.SCRIPT_NAMES:
        bound = getattr(s, name)
        assert isinstance(bound, Bound) and bound.sha == scripts.sha(name)
    assert s.claim(["k1"], ["a"]) == b"ok"
    assert s.wait(keys=["k2"], args=[], client=Client("other")) == b"ok"
    assert calls == [("default", ("EVALSHA", scripts.sha("claim"), 1, "k1", "a")),
                     ("other", ("EVALSHA", scripts.sha("wait"), 1, "k2"))]
