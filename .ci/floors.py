"""Install the lowest version of every dependency that setup.cfg declares with ``>=``.

Run with the interpreter of an environment where the project is already installed
(``tox -e floors``, ``.ci/run``): each ``name>=X`` of ``install_requires`` becomes
``pip install name==X``, so the suite that follows tests exactly the floors the package
promises. Read from setup.cfg at run time, so the floors tested cannot drift from the ones
declared. ``--print`` only prints the pins.
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path
from typing import List

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"


def floor_pins() -> List[str]:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    pins = []
    for line in config["options"]["install_requires"].splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\[\]-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", line)
        if match is None:
            sys.exit(f"floors: cannot pin {line!r}: declare a plain 'name>=version' floor")
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


def main() -> None:
    pins = floor_pins()
    print("floors:", " ".join(pins), flush=True)
    if "--print" not in sys.argv[1:]:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *pins], check=True)


if __name__ == "__main__":
    main()
