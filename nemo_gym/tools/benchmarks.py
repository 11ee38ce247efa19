"""Benchmarks: an environment plus one frozen dataset, a prompt template and a repeat count.

A benchmark is an overlay folder ``benchmarks/<name>/``:

- ``config.yaml``: ``config_paths`` naming the environment's config, then the environment's
  agent instance with one ``type: benchmark`` dataset (``jsonl_fpath``, ``num_repeats``,
  optional ``prompt_config``, ``description``);
- ``prepare.py``: writes ``data/<name>.jsonl`` (``python prepare.py [--output PATH]``);
- ``data/<name>_metrics.json``: the committed statistics of the frozen data (drift check);
- ``README.md``.

``ng_list_benchmarks`` lists them; ``ng_prepare_benchmark +benchmark=<name>`` runs ``prepare.py``,
validates the rows and compares their statistics with the committed ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import (
    ConfigError,
    load_config,
    load_yaml_file,
    project_root,
    resolve_config_path,
    server_instances,
)
from nemo_gym.tools.prepare_data import (
    AgentDataset,
    DatasetConfig,
    check_dataset,
    compare_with_committed,
    metrics_drift,
)

BENCHMARKS_FOLDER = "benchmarks"


@dataclass
class Benchmark:
    """One benchmark folder, parsed."""

    name: str
    folder: Path
    env_config_paths: list[str]
    agent: str
    dataset: DatasetConfig

    @property
    def config_path(self) -> Path:
        """The overlay ``config.yaml``."""
        return self.folder / "config.yaml"

    @property
    def environment(self) -> str:
        """The environment folder the benchmark runs in (from its config path)."""
        for path in self.env_config_paths:
            parts = Path(path).parts
            if len(parts) >= 2 and parts[0] == "resources_servers":
                return parts[1]
        return "?"

    @property
    def root(self) -> Path:
        """The project folder holding ``benchmarks/`` (paths in the config are relative to it)."""
        return self.folder.parent.parent

    @property
    def data_path(self) -> Path:
        """Where ``prepare.py`` writes the rows."""
        return self.root / self.dataset.jsonl_fpath

    @property
    def metrics_path(self) -> Path:
        """The committed statistics of the frozen rows."""
        return self.data_path.with_name(f"{self.data_path.stem}_metrics.json")

    @property
    def description(self) -> str:
        """The dataset's ``description`` field."""
        return str((self.dataset.model_extra or {}).get("description", ""))

    def environment_available(self) -> bool:
        """Whether the environment's config (and so its folder) exists."""
        try:
            for path in self.env_config_paths:
                _resolve_from(self.root, path)
        except ConfigError:
            return False
        return True

    def config_paths(self) -> list[str]:
        """The config files to pass to ``ng_run``: the environment's, then the overlay."""
        return [str(_resolve_from(self.root, p)) for p in self.env_config_paths] + [str(self.config_path)]

    def count_rows(self) -> int | None:
        """Rows in the prepared data file, or None when it has not been prepared."""
        if not self.data_path.is_file():
            return None
        with self.data_path.open("rb") as f:
            return sum(1 for line in f if line.strip())

    def frozen_rows(self) -> int | None:
        """Rows the committed statistics describe (None without a readable statistics file)."""
        try:
            examples = json.loads(self.metrics_path.read_text())["Number of examples"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return int(examples) // self.dataset.num_repeats

    def collect_command(self, output: str) -> str:
        """The ``ng_collect_rollouts`` command that runs this benchmark on a running stack."""
        args = [
            f"+agent_name={self.agent}",
            f"+input_jsonl_fpath={self.dataset.jsonl_fpath}",
            f"+output_jsonl_fpath={output}",
            f"+num_repeats={self.dataset.num_repeats}",
        ]
        if self.dataset.prompt_config:
            args.append(f"+prompt_config={self.dataset.prompt_config}")
        return "ng_collect_rollouts " + " ".join(args)


def _resolve_from(root: Path, path: str) -> Path:
    candidate = root / path
    return candidate if candidate.exists() else resolve_config_path(path)


def parse_benchmark(folder: Path) -> Benchmark:
    """Read ``<folder>/config.yaml``; errors name the file and what is missing."""
    config_file = folder / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"benchmark {folder.name!r}: {config_file} does not exist")
    overlay = load_yaml_file(config_file)
    env_paths = overlay.get("config_paths")
    if not isinstance(env_paths, list) or not env_paths or not all(isinstance(p, str) for p in env_paths):
        raise ConfigError(f"{config_file}: config_paths must list the environment's config file(s)")
    found = []
    for instance in server_instances(overlay).values():
        for entry in instance.fields.get("datasets") or []:
            if isinstance(entry, Mapping) and entry.get("type") == "benchmark":
                found.append((instance.name, entry))
    if len(found) != 1:
        raise ConfigError(
            f"{config_file}: expected exactly one dataset of type benchmark, found {len(found)}"
        )
    agent, entry = found[0]
    try:
        dataset = DatasetConfig.model_validate(entry)
    except ValueError as exc:
        raise ConfigError(f"{config_file}: {agent} benchmark dataset: {exc}") from exc
    return Benchmark(folder.name, folder, list(env_paths), agent, dataset)


def benchmark_folders(cwd: Path | None = None) -> dict[str, Path]:
    """Benchmark folders by name: the working directory's ``benchmarks/`` first, then the project's."""
    folders: dict[str, Path] = {}
    for base in ((cwd or Path.cwd()) / BENCHMARKS_FOLDER, project_root() / BENCHMARKS_FOLDER):
        if base.is_dir():
            for folder in sorted(base.iterdir()):
                if (folder / "config.yaml").is_file():
                    folders.setdefault(folder.name, folder.resolve())
    return folders


def load_benchmark(name: str, cwd: Path | None = None) -> Benchmark:
    """The benchmark called ``name``; the error lists the known ones."""
    folders = benchmark_folders(cwd)
    if name not in folders:
        known = ", ".join(sorted(folders)) or "none"
        raise ConfigError(f"no benchmark named {name!r}; known benchmarks: {known}")
    return parse_benchmark(folders[name])


def list_benchmarks(cwd: Path | None = None) -> list[Benchmark]:
    """Every benchmark that parses (a broken one raises, naming its file)."""
    return [parse_benchmark(folder) for folder in benchmark_folders(cwd).values()]


def format_benchmark_table(benchmarks: list[Benchmark]) -> str:
    """NAME, ENVIRONMENT, ROWS, REPEATS, DESCRIPTION, one line per benchmark."""
    rows = [("NAME", "ENVIRONMENT", "ROWS", "REPEATS", "DESCRIPTION")]
    for b in benchmarks:
        count = b.count_rows()
        frozen = b.frozen_rows()
        shown = str(count) if count is not None else f"{frozen if frozen is not None else '?'} (not prepared)"
        environment = b.environment + ("" if b.environment_available() else " (missing)")
        rows.append(
            (
                b.name,
                environment,
                shown,
                str(b.dataset.num_repeats),
                b.description,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows
    ).rstrip()


def prepare_benchmark(benchmark: Benchmark, output: Path | None = None, out: TextIO | None = None) -> int:
    """Run the benchmark's ``prepare.py``, validate the rows, compare their statistics.

    ``output`` defaults to the dataset's ``jsonl_fpath``. The committed statistics are compared
    (drift is reported and fails); they are written when absent and the output is the
    canonical path. Returns the exit code.
    """
    out = out or sys.stdout
    script = benchmark.folder / "prepare.py"
    if not script.is_file():
        out.write(f"benchmark {benchmark.name!r}: {script} does not exist\n")
        return 1
    target = (output or benchmark.data_path).resolve()
    done = subprocess.run(
        [sys.executable, str(script), "--output", str(target)],
        cwd=benchmark.root,
        capture_output=True,
        text=True,
    )
    out.write(done.stdout)
    if done.returncode != 0:
        out.write(done.stderr)
        out.write(f"ng_prepare_benchmark: {script} failed (exit {done.returncode})\n")
        return 1
    report = check_dataset(AgentDataset(benchmark.agent, benchmark.dataset, target))
    for error in report.errors[:20]:
        out.write(f"  error: {error}\n")
    if report.errors:
        out.write(f"ng_prepare_benchmark: {len(report.errors)} bad rows in {target}\n")
        return 1
    if target == benchmark.data_path.resolve():
        compare_with_committed(report, overwrite=False)
        if report.metrics_written:
            out.write(f"wrote the statistics to {report.metrics_path}; commit it to freeze the data\n")
    elif benchmark.metrics_path.is_file():
        report.drift = metrics_drift(json.loads(benchmark.metrics_path.read_text()), report.metrics)
    if report.drift:
        out.write(f"the prepared rows differ from the frozen benchmark ({benchmark.metrics_path}):\n")
        out.writelines(f"  {line}\n" for line in report.drift)
        return 1
    rows = report.metrics["Number of examples"] // benchmark.dataset.num_repeats
    verdict = "statistics recorded" if report.metrics_written else "match the committed statistics"
    configs = [*benchmark.env_config_paths, str(benchmark.config_path.relative_to(benchmark.root))]
    out.write(
        f"benchmark {benchmark.name}: {rows} rows in {target} ({verdict})\n"
        "Run it:\n"
        f'  ng_run "+config_paths=[{",".join(configs)},<your policy model config>]"\n'
        f"  {benchmark.collect_command(f'results/{benchmark.name}.jsonl')}\n"
    )
    return 0


def _list_command(argv: list[str]) -> int:
    load_config(argv, validate_refs=False)
    benchmarks = list_benchmarks()
    if not benchmarks:
        print("no benchmarks found (looked for benchmarks/<name>/config.yaml)")
        return 1
    print(format_benchmark_table(benchmarks))
    return 0


def _prepare_command(argv: list[str]) -> int:
    config = load_config(argv, validate_refs=False)
    name = config.get("benchmark")
    if not name:
        known = ", ".join(sorted(benchmark_folders())) or "none"
        raise ConfigError(f"+benchmark=<name> is required; known benchmarks: {known}")
    output = config.get("output_jsonl_fpath")
    return prepare_benchmark(load_benchmark(str(name)), Path(str(output)) if output else None)


ng_list_benchmarks = console_command(_list_command, "ng_list_benchmarks")
ng_prepare_benchmark = console_command(_prepare_command, "ng_prepare_benchmark")


def write_prepared_rows(
    description: str,
    default_output: Path,
    build_rows: Callable[[], Sequence[Mapping[str, Any]]],
    *,
    check: Callable[[], None] | None = None,
    argv: Sequence[str] | None = None,
) -> Path:
    """The ``main`` of a benchmark's ``prepare.py``: parse ``--output PATH``, write the rows, report.

    ``description`` is the script's help text and ``default_output`` the dataset's
    ``jsonl_fpath``. ``check`` runs after the arguments are parsed and before anything is
    written (a missing optional package exits there, with its own message). Rows are written
    one JSON object a line; prints ``wrote N rows to PATH`` and returns the path.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", type=Path, default=default_output)
    output: Path = parser.parse_args(argv).output
    if check is not None:
        check()
    output.parent.mkdir(parents=True, exist_ok=True)
    rows = build_rows()
    output.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {output}")
    return output
