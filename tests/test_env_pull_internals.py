"""A pulled folder that builds on a bundled folder's class and uses internals ours lacks clashes.

NeMo Gym's 0.7.0 ``litellm_model`` subclasses ``openai_model``'s ``SimpleModelServer`` and reads
``self._client`` / ``self._semaphore`` (ours has the first); ``local_vllm_model_proxy`` calls ``self._post_init()`` of
``VLLMModel``; ``vllm_model_with_compaction`` reads ``VLLMModel._TOKENIZE_CHAT_FIELDS``. This
project's bundled classes of those names define the names but not those internals: the pull
says so and offers ``+replace_bundled=true`` instead of copying a folder that fails at its first
use of one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.testing import write_files
from nemo_gym.tools.env_pull_closure import clashes

LITELLM_LIKE = """
from responses_api_models.openai_model.app import SimpleModelServer, SimpleModelServerConfig

class LiteConfig(SimpleModelServerConfig):
    pass

class Lite(SimpleModelServer):
    config: LiteConfig

    def _own_helper(self):
        return 1

    async def responses(self, body):
        self._mine = self._own_helper()
        async with self._semaphore:
            return await self._client.create_response(**body, extra=self.config.extra_body, mine=self._mine)
"""

PROXY_LIKE = """
from responses_api_models.vllm_model.app import VLLMModel

class Proxy(VLLMModel):
    EXTRA = (*VLLMModel._TOKENIZE_CHAT_FIELDS, "more")

    def setup_webserver(self):
        self._post_init()
        return super().setup_webserver()
"""


def test_the_bundled_openai_and_vllm_models_clash_with_a_folder_using_nemo_gyms_internals(
    tmp_path: Path,
) -> None:
    pulled = tmp_path / "responses_api_models" / "lite"
    proxy = tmp_path / "responses_api_models" / "proxy"
    write_files({pulled / "app.py": LITELLM_LIKE, proxy / "app.py": PROXY_LIKE})
    project = project_root()
    refs = [("responses_api_models", "openai_model"), ("responses_api_models", "vllm_model")]

    found = {c.name: c for c in clashes([pulled, proxy], project, refs)}
    # Ours keeps NeMo Gym's client as ``self._client`` (what tests replace), not its ``_semaphore``.
    assert found["openai_model"].missing == {
        "responses_api_models.openai_model.app": ["SimpleModelServer._semaphore"]
    }
    assert found["vllm_model"].missing == {
        "responses_api_models.vllm_model.app": ["VLLMModel._TOKENIZE_CHAT_FIELDS", "VLLMModel._post_init"]
    }
    assert "SimpleModelServer._semaphore" in found["openai_model"].describe()


def test_internals_the_project_class_or_its_bases_define_do_not_clash(tmp_path: Path) -> None:
    wheel, project = tmp_path / "wheel", tmp_path / "project"
    write_files(
        {
            wheel / "responses_api_models/lite/app.py": LITELLM_LIKE,
            # Ours: the NeMo Gym name is an alias of a class whose base (in this package's own
            # modules resolved through the project file's import) sets the internals.
            project / "responses_api_models/openai_model/app.py": (
                "from responses_api_models.openai_model.base import Base\n"
                "class Ours(Base):\n"
                "    _semaphore = None\n"
                "SimpleModelServer = Ours\n"
                "class SimpleModelServerConfig: ...\n"
            ),
            project / "responses_api_models/openai_model/base.py": (
                "class Base:\n    def __init__(self):\n        self._client = object()\n"
            ),
        }
    )
    refs = [("responses_api_models", "openai_model")]
    assert clashes([wheel / "responses_api_models/lite"], project, refs) == []

    # Without the base's attribute, that one name is missing.
    (project / "responses_api_models/openai_model/base.py").write_text("class Base: ...\n")
    (found,) = clashes([wheel / "responses_api_models/lite"], project, refs)
    assert found.missing == {"responses_api_models.openai_model.app": ["SimpleModelServer._client"]}


def test_the_pull_refuses_then_replaces_a_bundled_folder_lacking_the_internals(tmp_path: Path) -> None:
    from nemo_gym.tools.env_pull import _plan
    from nemo_gym.tools.env_pull_wheel import PullError

    wheel, project = tmp_path / "wheel", tmp_path / "project"
    write_files(
        {
            wheel / "responses_api_models/proxy/app.py": PROXY_LIKE,
            wheel / "responses_api_models/vllm_model/app.py": (
                "class VLLMModel:\n    _TOKENIZE_CHAT_FIELDS = ()\n    def _post_init(self): ...\n"
            ),
            project
            / "responses_api_models/vllm_model/app.py": "class VLLMModel:\n    _TOKENIZE_CHAT_FIELDS = ()\n",
        }
    )
    with pytest.raises(PullError) as refused:
        _plan(wheel, "responses_api_models", "proxy", project, replace_bundled=False)
    assert "VLLMModel._post_init" in str(refused.value) and "+replace_bundled=true" in str(refused.value)
    folder = [("responses_api_models", "vllm_model")]
    assert _plan(wheel, "responses_api_models", "proxy", project, replace_bundled=True) == (
        folder,
        [],
        folder,
    )
