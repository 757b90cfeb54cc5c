"""`.env.example` lists every variable the settings read."""

import re
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def test_every_setting_read_from_the_environment_is_in_env_example():
    read = set()
    for module in (BASE_DIR / "config" / "settings").rglob("*.py"):
        read |= set(re.findall(r'env_(?:str|int|bool|list)\("([A-Z0-9_]+)"', module.read_text()))
    listed = set(re.findall(r"^([A-Z0-9_]+)=", (BASE_DIR / ".env.example").read_text(), flags=re.MULTILINE))

    assert read - listed == set()
    assert len(read) > 20  # the scan found the settings
