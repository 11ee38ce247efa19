"""A namespace of environment folders, as in NeMo Gym (where this folder has no ``__init__.py``).

The folder keeps an ``__init__.py`` so that an editable install finds it, and extends its path as
a namespace package would: a folder of the same name earlier on ``sys.path`` (a harness's staged
copy of an agent, say) supplies the modules this one lacks.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
