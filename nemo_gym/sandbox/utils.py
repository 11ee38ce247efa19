"""Helpers for sandbox callers: CPU caps for tools that size themselves by the host, image rewrites."""

from __future__ import annotations

# Tools size their worker pools by the host's core count, not by the sandbox's CPU limit
# (multiprocessing, BLAS/OpenMP, Go, cargo, Node, pytest-xdist, ...); these variables tell each
# of them the limit. MAKEFLAGS is left out on purpose: it would turn serial make runs parallel.
CPU_CAP_ENV_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS",
    "OMP_THREAD_LIMIT",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "PYTHON_CPU_COUNT",
    "NUMBA_NUM_THREADS",
    "LOKY_MAX_CPU_COUNT",
    "POLARS_MAX_THREADS",
    "PYTEST_XDIST_AUTO_NUM_WORKERS",
    "DJANGO_TEST_PROCESSES",
    "GOMAXPROCS",
    "CARGO_BUILD_JOBS",
    "RAYON_NUM_THREADS",
    "RUST_TEST_THREADS",
    "UV_THREADPOOL_SIZE",
    "CMAKE_BUILD_PARALLEL_LEVEL",
)


def cpu_cap_env(cpu: float | int | None) -> dict[str, str]:
    """Every variable of :data:`CPU_CAP_ENV_VARS` set to the whole cores of ``cpu`` (at least 1);
    ``{}`` when no limit is set. Callers merge their own env over it."""
    if cpu is None:
        return {}
    cores = str(max(1, int(cpu)))
    return dict.fromkeys(CPU_CAP_ENV_VARS, cores)


def rewrite_image(image: str | None, rewrites: list[dict[str, str]]) -> str | None:
    """The image with the first matching ``{"from": prefix, "to": prefix}`` rewrite applied."""
    if image is None:
        return None
    for rewrite in rewrites:
        if image.startswith(rewrite["from"]):
            return rewrite["to"] + image[len(rewrite["from"]) :]
    return image
