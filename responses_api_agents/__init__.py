"""Environment folders: NeMo Gym's namespace tree, merged with other portions as ARCHITECTURE.md says."""

import os
from pkgutil import extend_path

__path__ = [
    p for p in extend_path(__path__, __name__) if p in __path__ or not os.path.isfile(f"{p}/__init__.py")
]
