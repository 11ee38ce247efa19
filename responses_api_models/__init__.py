"""A namespace of environment folders, as in NeMo Gym (where this folder has no ``__init__.py``).

The folder keeps an ``__init__.py`` so that an editable install finds it, and extends its path as
a namespace package would: a portion of the same name on ``sys.path`` (a folder without
``__init__.py``: a harness's staged copy of an agent, say) supplies the modules this one lacks.
Another tree with its own ``__init__.py`` (this repository on a project's ``PYTHONPATH``) is a
different package and is not merged, so its bundled folders never shadow the ones a project pulled.
"""

import os
from pkgutil import extend_path

__path__ = [
    p for p in extend_path(__path__, __name__) if p in __path__ or not os.path.isfile(f"{p}/__init__.py")
]
