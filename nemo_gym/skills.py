"""Compatibility: NeMo Gym's ``nemo_gym.skills``: a run's folder of agent skills (``+skills.path=...``), its
``skills_ref`` (path, content hash, each skill's header) and ``stage_skills`` for agent CLIs.
The implementation is :mod:`nemo_gym.agents.skills`; the collector uses it too.
"""

from nemo_gym.agents.skills import (
    SKILL_MD_FILENAME,
    SkillMetadata,
    SkillsConfig,
    SkillsRef,
    hash_skill_dir,
    load_skill_directory,
    parse_skill_md,
    stage_skills,
)

__all__ = [
    "SKILL_MD_FILENAME",
    "SkillMetadata",
    "SkillsConfig",
    "SkillsRef",
    "hash_skill_dir",
    "load_skill_directory",
    "parse_skill_md",
    "stage_skills",
]
