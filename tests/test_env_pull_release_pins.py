"""A pulled folder runs on its release's own dependency pins, as NeMo Gym runs it: where the
release's ``Requires-Dist`` range excludes what is installed (0.4.0's ``openai<=2.7.2`` beside a
newer openai), ``gym env pull`` installs the newest version the range allows into the environment
running the pull (a layer shadowing its base), never outside this package's own range.

The end-to-end test builds a ``nemo-gym`` release wheel and three versions of a dependency here
and serves them from a package index on loopback; pip does the rest in real subprocesses."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from nemo_gym.launch.config import project_root
from nemo_gym.testing.package_index import (
    build_wheel,
    dist_info,
    layered_python,
    package_index,
    pip_env,
    site_packages_of_this_python,
)
from nemo_gym.tools.env_pull_pins import (
    own_ranges,
    parsed_requirements,
    plan_release_pins,
    release_requirements,
    satisfiable,
)

REPO = project_root()
DEP = "pins-fake-lib"
ENV_NAME = "pinned_env"
RELEASE = "9.9.7"


def test_a_release_range_is_pinned_within_ours_and_refused_outside_it() -> None:
    """0.4.0's ``openai<=2.7.2`` beside openai 3.57 becomes ``openai<=2.7.2,>=1.99.9`` (ours is
    ``>=1.99.9``); a range outside ours, or on a distribution what we run on pins exactly, is refused."""
    installed = {
        "openai": "3.57.0",
        "anthropic": "2.14.0",
        "pydantic": "2.12.0",
        "pydantic_core": "2.41.0",
        "tqdm": "4.67.0",
        "urllib3": "2.5.0",
    }
    ours = {
        "openai": SpecifierSet(">=1.99.9"),
        "anthropic": SpecifierSet(">=0.40"),
        "pydantic": SpecifierSet(">=2.6"),
        "tqdm": SpecifierSet(">=4.66"),
    }
    keep = {"openai": "3.57.0", "anthropic": "2.14.0", "pydantic": "2.12.0", "pydantic-core": "2.41.0"}
    release = [
        "openai<=2.7.2",
        "anthropic<=0.109.2",
        "pydantic<1",
        "pydantic_core==2.0.0",
        "tqdm",  # no range: nothing to pin
        "urllib3>=2.7.0",  # not ours: the release's range alone
        "not-installed-here<1",  # left to the folder's own needs
        "fastapi @ https://example.invalid/fastapi.whl",
    ]
    pins, refused = plan_release_pins(release, ours, keep, installed.get)
    assert [(p.name, p.requirement, p.installed) for p in pins] == [
        ("openai", "openai<=2.7.2,>=1.99.9", "3.57.0"),
        ("anthropic", "anthropic<=0.109.2,>=0.40", "2.14.0"),
        ("urllib3", "urllib3>=2.7.0", "2.5.0"),
    ]
    assert refused == [
        "pydantic<1 (kept pydantic 2.12.0: outside this package's own range pydantic>=2.6)",
        "pydantic_core==2.0.0 (kept pydantic-core 2.41.0: a package this one runs on pins it exactly)",
    ]
    # Without this package's metadata its ranges are unknown: nothing is pinned.
    pins, refused = plan_release_pins(["openai<=2.7.2"], None, keep, installed.get)
    assert pins == [] and "own requirements cannot be read" in refused[0]


def test_unparsable_requirement_lines_are_skipped_everywhere_they_are_read() -> None:
    lines = ["openai<=2.7.2", "-e ./local_dir", "not a requirement !!", "ray[default]>=2; python_version>'3'"]
    assert [(line, req.name) for line, req in parsed_requirements(lines)] == [
        ("openai<=2.7.2", "openai"),
        ("ray[default]>=2; python_version>'3'", "ray"),
    ]
    pins, refused = plan_release_pins(
        lines[:3], {"openai": SpecifierSet(">=1.0")}, {}, installed=lambda name: "3.0.0"
    )
    assert [p.requirement for p in pins] == ["openai<=2.7.2,>=1.0"] and refused == []


def test_satisfiable_ranges_and_our_own() -> None:
    assert satisfiable(SpecifierSet("<=2.7.2,>=1.60"))
    assert satisfiable(SpecifierSet(">1.5,<1.6"))
    assert satisfiable(SpecifierSet("==2.44.0,>=1.60"))
    assert not satisfiable(SpecifierSet("<1.0,>=1.60"))
    assert not satisfiable(SpecifierSet("==1.2,>=1.60"))
    ours = own_ranges()  # read from this checkout's pyproject.toml
    assert ours is not None and ours["pydantic"].contains("2.6") and not ours["pydantic"].contains("1.10")
    assert ours["openai"].contains(metadata.version("openai")) and not ours["openai"].contains("1.60.0")


def test_release_requirements_are_the_core_lines_whose_markers_hold(tmp_path: Path) -> None:
    info = tmp_path / "nemo_gym-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.4\nName: nemo-gym\nVersion: 1.0\n"
        "Requires-Dist: openai<=2.7.2\n"
        'Requires-Dist: ruff; extra == "dev"\n'
        'Requires-Dist: old-lib<1; python_version < "3.0"\n'
        'Requires-Dist: new-lib>=2; python_version >= "3.0"\n'
    )
    assert release_requirements(tmp_path) == ["openai<=2.7.2", "new-lib>=2"]


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 index on loopback: ``pins-fake-lib`` 1.0, 2.0 and 3.0, and a ``nemo-gym`` release
    pinning ``pins-fake-lib<=2.5`` (and ``pydantic<1``, outside this package's range)."""
    files = tmp_path_factory.mktemp("index")
    projects: dict[str, list[Path]] = {DEP: [], "nemo-gym": []}
    for version in ("1.0", "2.0", "3.0"):
        module = {"pins_fake_lib.py": f"VERSION = {version!r}\n"}
        projects[DEP].append(
            build_wheel(
                files / f"pins_fake_lib-{version}-py3-none-any.whl", {**dist_info(DEP, version), **module}
            )
        )
    folder = f"resources_servers/{ENV_NAME}"
    release = {
        **dist_info("nemo-gym", RELEASE, [f"{DEP}<=2.5", "pydantic<1", 'ruff<0.0.1; extra == "dev"']),
        "nemo_gym/__init__.py": "raise ImportError('the nemo-gym wheel was imported')\n",
        f"{folder}/__init__.py": "",
        f"{folder}/app.py": "import pins_fake_lib\n",
        f"{folder}/requirements.txt": "-e nemo-gym[dev] @ ../../\n",
    }
    projects["nemo-gym"].append(build_wheel(files / f"nemo_gym-{RELEASE}-py3-none-any.whl", release))

    with package_index(projects) as url:
        yield url


@pytest.mark.slow
def test_a_pull_installs_the_releases_pin_into_its_layer(index_url: str, tmp_path: Path) -> None:
    env = pip_env(index_url, PYTHONPATH=str(REPO), NEMO_GYM_WHEEL_CACHE=str(tmp_path / "cache"))
    ours = site_packages_of_this_python()
    # The base: this environment plus pins-fake-lib 3.0, which the release's range excludes.
    base = layered_python(tmp_path / "base", ours)
    setup = subprocess.run(
        [str(base), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{DEP}==3.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert setup.returncode == 0, setup.stderr
    base_site = str(next((tmp_path / "base" / "lib").glob("python*/site-packages")))
    layer = layered_python(tmp_path / "layer", [base_site, *ours])
    probe = "import pins_fake_lib, pydantic; print(pins_fake_lib.VERSION, pydantic.VERSION)"

    def versions(python: Path) -> list[str]:
        done = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    before = versions(layer)
    assert before[0] == "3.0"

    target = tmp_path / "project" / "resources_servers" / ENV_NAME
    pull = subprocess.run(
        [str(layer), "-c", "from nemo_gym.tools.gym_cli import main; main()", "env", "pull",
         f"{ENV_NAME}=={RELEASE}", f"+dir={target}"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert pull.returncode == 0, pull.stdout + pull.stderr
    assert f"pinned as nemo-gym {RELEASE} pins them: {DEP} 3.0 -> 2.0 ({DEP}<=2.5)" in pull.stdout
    record = json.loads((target / ".nemo_gym_source.json").read_text())
    assert record["release_pins"] == [
        {"distribution": DEP, "release": f"{DEP}<=2.5", "was": "3.0", "now": "2.0"}
    ]
    assert [r for r in record["release_pins_not_applied"] if r.startswith("pydantic<1")] == [
        f"pydantic<1 (kept pydantic {before[1]}: outside this package's own range pydantic{own_ranges()['pydantic']})"  # type: ignore[index]
    ]
    # The newest version the range allows, in the layer only; the base and pydantic are unchanged.
    assert versions(layer) == ["2.0", before[1]]
    assert versions(base)[0] == "3.0"

    # +release_pins=false leaves the base's version showing through a fresh layer.
    plain = layered_python(tmp_path / "plain", [base_site, *ours])
    again = subprocess.run(
        [str(plain), "-c", "from nemo_gym.tools.gym_cli import main; main()", "env", "pull",
         f"{ENV_NAME}=={RELEASE}", f"+dir={target}", "+force=true", "+release_pins=false"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "pinned as" not in again.stdout and versions(plain)[0] == "3.0"
