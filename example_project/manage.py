#!/usr/bin/env python
"""Django's command-line utility for the example shop.

Run it from anywhere, e.g. ``python example_project/manage.py migrate`` from the
repository root: the project folder is put on ``sys.path`` first.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
