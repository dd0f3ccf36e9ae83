"""Install the lowest version of every dependency that setup.cfg declares with ``>=``.

Run with the interpreter of an environment where the project is already installed
(``tox -e floors``, ``.ci/run``): each ``name>=X`` of ``install_requires`` and of the
extras in ``FLOORED_EXTRAS`` becomes ``pip install name==X``, so the suite that follows
tests exactly the floors the package promises. Read from setup.cfg at run time, so the
floors tested cannot drift from the ones declared. ``--print`` only prints the pins.

The floored extras are those the package's own code imports (``top``: rich, for
``rlocks top``; ``otel``: opentelemetry-api, for ``rlocks.metrics``). The test extra
repeats their requirements so the suite can run them; a floor there that differs from the
extra's would make this run test the wrong one, so it is refused. A test requirement that
must match a floored one's version (``COMPANIONS``: the OpenTelemetry SDK requires the API
of its own release) is pinned to that floor.
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"
# Extras whose floors are installed exactly too: rlocks.top imports rich (the `top` extra).
FLOORED_EXTRAS = ("top", "otel")
# Test requirements pinned to a floored requirement's floor: name -> the one it follows.
COMPANIONS = {"opentelemetry-sdk": "opentelemetry-api"}
_FLOOR = re.compile(r"([A-Za-z0-9_.\[\]-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)")


def _lines(value: str) -> List[str]:
    lines = (line.split("#", 1)[0].strip() for line in value.splitlines())
    return [line for line in lines if line]


def _floors(value: str) -> Dict[str, str]:
    floors = {}
    for line in _lines(value):
        match = _FLOOR.fullmatch(line)
        if match is None:
            sys.exit(f"floors: cannot pin {line!r}: declare a plain 'name>=version' floor")
        floors[match.group(1).lower()] = match.group(2)
    return floors


def floor_pins() -> List[str]:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    floors = _floors(config["options"]["install_requires"])
    extras = config["options.extras_require"]
    # The test extra's requirements that a floored extra also names, by name.
    tested = {}
    for line in _lines(extras["test"]):
        match = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*$", line)
        if match:
            tested[match.group(1).lower()] = match.group(2)
    for extra in FLOORED_EXTRAS:
        for name, version in _floors(extras[extra]).items():
            if tested.get(name, version) != version:
                sys.exit(f"floors: the test extra's {name}>={tested[name]} differs from the "
                         f"{extra} extra's {name}>={version}: keep them in step")
            floors[name] = version
    for name, leader in COMPANIONS.items():
        if name in tested and leader in floors:
            if tested[name] != floors[leader]:
                sys.exit(f"floors: the test extra's {name}>={tested[name]} differs from "
                         f"{leader}>={floors[leader]}: keep them in step")
            floors[name] = floors[leader]
    return [f"{name}=={version}" for name, version in floors.items()]


def main() -> None:
    pins = floor_pins()
    print("floors:", " ".join(pins), flush=True)
    if "--print" not in sys.argv[1:]:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *pins], check=True)


if __name__ == "__main__":
    main()
